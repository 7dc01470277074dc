"""A teacher in multi-turn episodes (issue 52): the teacher judges only the tokens the policy sampled. On scripted
tool episodes (a call, the tool's turn, an answer) the teacher's token term is nonzero exactly on the sampled
tokens, zero on the tool's suffix, and there equals -λ (log π_old - log π_teacher)."""

import pytest
import torch

from rlhfkit import RLConfig, RLTrainer
from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm

from .conftest import ScriptedEngine

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = [{"prompt": [{"role": "user", "content": f"{a}+{b}?"}]} for a, b in [(1, 2), (3, 4)]]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def test_the_teacher_scores_only_the_sampled_tokens_of_a_tool_episode():
    tok = chatml_tokenizer()
    args = RLConfig(
        algorithm="distill",
        prompts_per_step=2,
        max_new_tokens=120,
        max_steps=1,
        chat_template=TINY_TOOLS_TEMPLATE,
        save_steps=0,
        log_every=0,
        distillation_coef=0.5,
    )
    t = RLTrainer(
        tiny_causal_lm(tok),
        None,
        args,
        ROWS,
        processing_class=tok,
        tools=[add],
        teacher_model=tiny_causal_lm(tok, seed=3),
    )
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>'
    t.sampler.engine = ScriptedEngine(t.tokenizer, [[call] * 2, ["3<|im_end|>"] * 2])
    rows = t.sampler.sample_prompts()
    rollout, episodes = t.sampler.generate(rows)
    exp = t.make_experience(rollout, *t.sampler.score(rows, rollout, episodes))
    sampled = rollout.response_mask.bool()
    region = rollout.attention_mask[:, -sampled.shape[1] :].bool()
    assert (region & ~sampled).any()  # the tool's suffix lies between the two turns
    assert (exp.advantages[~sampled] == 0).all()
    assert (exp.advantages[sampled] != 0).float().mean() > 0.9
    with torch.no_grad():
        old, _, _ = t.models.policy_outputs(rollout, with_values=False)
        teacher = t.models.teacher_logprobs(rollout)
    torch.testing.assert_close(exp.advantages[sampled], (-0.5 * (old - teacher))[sampled])
