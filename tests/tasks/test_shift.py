"""The quickstart's shift task: its oracle scores a chat-format row as it scores the same text."""

from rlhfkit.rewards.functions import get_reward_function
from rlhfkit.tasks.shift import oracle_reward, oracle_score


def test_the_oracle_scores_chat_rows_as_their_text():
    prompts, completions = ["abc=", "hh="], ["bcd", "ix"]
    chat_prompts = [[{"role": "system", "content": "shift"}, {"role": "user", "content": p}] for p in prompts]
    chat_completions = [[{"role": "assistant", "content": c}] for c in completions]
    expected = [oracle_score(p, c) for p, c in zip(prompts, completions)]
    assert expected[0] == 1.0 and expected[1] < 1.0
    assert oracle_reward(chat_prompts, chat_completions) == oracle_reward(prompts, completions) == expected
    assert get_reward_function("shift_oracle")(prompts=chat_prompts, completions=chat_completions) == expected
