"""Chat templates that rewrite history (Qwen3-style: earlier turns' <think> dropped or normalised):
each turn's prompt is the template's own rendering of the conversation so far; every sampled token
is trained exactly once, with its sampled log-prob, in the context it was sampled in (an episode
whose history was rewritten is one row of several segments); the trainer's log-probs equal the
engine's; a prefix-preserving template gives the rows it always gave."""

import pytest
import torch

import rlhfkit.agents.episode as episode_module
from rlhfkit.agents import AgentOptions, make_tools, run_episodes, start_episode
from rlhfkit.data.chat_templates import render
from rlhfkit.models.segments import forward_rollout, segment_view
from rlhfkit.rollout.base import Rollout, SamplingParams
from rlhfkit.tasks.tiny import thinking_template

from .conftest import ScriptedEngine, add
from .test_token_fidelity import Recording, _turn_ending_model

pytestmark = pytest.mark.usefixtures("one_thread")

USER = [{"role": "user", "content": "12+7?"}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 7}}</tool_call><|im_end|>'


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def run(tok, turns, max_new_tokens=400):
    tools = make_tools([add])
    episode = start_episode(tok, USER, tools)
    engine = ScriptedEngine(tok, turns)
    rollout = run_episodes(engine, tok, [episode], SamplingParams(max_new_tokens=max_new_tokens), AgentOptions())
    return rollout, episode, engine, [t.schema for t in tools.values()]


@pytest.mark.parametrize(
    "keep,first,segments",
    [
        (False, "<think>\nplan\n</think>\n\n" + CALL, 2),  # every earlier <think> dropped: rewritten
        (True, "<think>plan</think>" + CALL, 2),  # Qwen3: kept but normalised to <think>\n…\n</think>\n\n
        (True, "<think>\nplan\n</think>\n\n" + CALL, 1),  # Qwen3, written as it renders it: no rewrite
    ],
)
def test_each_turn_is_prompted_with_the_templates_rendering_and_trained_once_in_its_context(
    chatml, keep, first, segments
):
    chatml.chat_template = thinking_template(keep)
    rollout, e, engine, schemas = run(chatml, [[first], ["<think>\nsum\n</think>\n\n19<|im_end|>"]])
    assert e.rewrites and e.turns == 2 and e.has_eos
    sampled = [ids[0] for ids in engine.returned]
    # each turn's prompt is the template's own rendering of the conversation so far
    assert engine.contexts[0][0] == encode(chatml, render(chatml, USER, schemas, True))
    assert engine.contexts[1][0] == encode(chatml, render(chatml, USER + e.messages[:2], schemas, True))
    # trained ids = sampled ids, each once, in order; the engine's context precedes each turn in its segment
    mask = rollout.response_mask[0].bool()
    assert rollout.response_ids[0][mask].tolist() == sampled[0] + sampled[1]
    view = segment_view(
        rollout.input_ids,
        rollout.attention_mask,
        rollout.segments if rollout.segments is not None else torch.zeros_like(rollout.input_ids),
        mask.shape[0],
    )
    rows = [r[m.bool()].tolist() for r, m in zip(view.input_ids, view.attention_mask)]
    if segments == 2:
        assert rows == [engine.contexts[0][0] + sampled[0], engine.contexts[1][0] + sampled[1]]
    else:
        assert rollout.segments is None and rows == [engine.contexts[1][0] + sampled[1]]
    # the budget counts the conversation as the model sees it; so does completion_ids
    assert e.length == len(engine.contexts[1][0]) - len(e.prompt_ids) + len(sampled[1])
    assert e.prompt_ids + e.completion_ids == engine.contexts[1][0] + sampled[1]


def test_a_rendering_that_would_overflow_the_budget_ends_the_episode_unanswered(chatml):
    chatml.chat_template = thinking_template(False)
    first = "<think>\nplan\n</think>\n\n" + CALL
    prompt = len(encode(chatml, render(chatml, USER, [make_tools([add])["add"].schema], True)))
    budget = len(encode(chatml, first)) + 2  # the call fits; the rendering with the tool's answer does not
    rollout, e, engine, _ = run(chatml, [[first]], max_new_tokens=budget)
    assert [m["role"] for m in e.messages] == ["assistant"] and e.truncated and not rollout.has_eos[0]
    assert len(engine.contexts) == 1 and e.length == budget and len(e.prompt_ids) == prompt


def test_templates_that_rewrite_history_are_told_from_those_that_do_not(chatml):
    from rlhfkit.agents import rewrites_history
    from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE

    found = {}
    for name, template in [
        ("chatml_tools", chatml.chat_template),
        ("tiny_tools", TINY_TOOLS_TEMPLATE),
        ("qwen3", thinking_template(True)),
        ("strip_all", thinking_template(False)),
        ("r1", R1_STYLE),
    ]:
        chatml.chat_template = template
        found[name] = rewrites_history(chatml, None)
    assert found == {"chatml_tools": False, "tiny_tools": False, "qwen3": True, "strip_all": True, "r1": True}


# DeepSeek-R1's rule: every assistant message's reasoning is dropped, the last one's too — so the
# renderings are prefix-preserving, but never hold the <think> the model sampled.
R1_STYLE = (
    "{% for m in messages %}{% set c = m['content'] or '' %}{% if '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}<|im_start|>{{ m['role'] }}\n{{ c }}"
    "{% for t in (m['tool_calls'] or []) %}<tool_call>{{ t['function']['name'] }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_prefix_preserving_template_gives_the_rows_it_always_gave(chatml):
    rollout, e, engine, _ = run(chatml, [[CALL], ["19<|im_end|>"]])
    assert not e.rewrites and rollout.segments is None and set(e.segment) == {0}
    assert engine.contexts[1][0] == e.prompt_ids + engine.returned[0][0] + e.ids[len(engine.returned[0][0]) : -3]


@pytest.mark.parametrize("keep", [False, True])
def test_trainer_logprobs_match_the_engines_over_rewritten_histories(chatml, monkeypatch, keep):
    """A random model's turns, each made a tool call whose reasoning is the turn's text: the
    template rewrites every turn, so each episode is several segments. The trainer's log-prob of
    every sampled token (one forward pass over the packed rows) equals HF generate's."""
    chatml.chat_template = thinking_template(keep)
    model = _turn_ending_model(chatml)
    monkeypatch.setattr(
        episode_module,
        "parse_tool_calls",
        lambda text, tok, tools: (
            f"<think>{text}</think>",
            [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        ),
    )
    engine = Recording(model, chatml.pad_token_id, chatml.eos_token_id, logprobs=True)
    episodes = [start_episode(chatml, [{"role": "user", "content": f"{i}+1?"}], make_tools([add])) for i in range(4)]
    rollout = run_episodes(
        engine,
        chatml,
        episodes,
        SamplingParams(max_new_tokens=220, temperature=0.8),
        AgentOptions(max_tool_calling_iterations=2),
        seed=3,
    )
    assert rollout.segments is not None and max(e.segment[-1] for e in episodes) >= 1  # histories were rewritten
    mask = rollout.response_mask.bool()
    for i, e in enumerate(episodes):
        assert rollout.response_ids[i][mask[i]].tolist() == [t for t, s in zip(e.ids, e.sampled) if s]
    trainer = forward_rollout(model, rollout, 0.8).logprobs
    assert (trainer - rollout.logprobs)[mask].abs().max() < 1e-4
    one_sequence = Rollout(
        rollout.input_ids, rollout.attention_mask, rollout.response_mask, rollout.has_eos, rollout.prompt_len
    )
    wrong = forward_rollout(model, one_sequence, 0.8).logprobs  # each row as one sequence: later turns out of context
    assert (wrong - rollout.logprobs)[mask].abs().max() > 1e-3


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_an_rl_step_trains_each_sampled_token_in_the_context_it_was_sampled_in(algorithm):
    """Through RLTrainer: the old log-probs (and PPO's values) of an episode whose history was
    rewritten are those of each turn after its own context, computed alone; GAE runs over the
    episode's sampled tokens across segments; the update trains the policy."""
    from rlhfkit import RLConfig, RLTrainer
    from rlhfkit.algorithms import gae
    from rlhfkit.models import forward_response
    from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm

    tok = chatml_tokenizer()
    rows = [{"prompt": USER}, {"prompt": [{"role": "user", "content": "3+4?"}]}]
    args = RLConfig(
        algorithm=algorithm,
        prompts_per_step=2,
        group_size=2 if algorithm == "grpo" else 1,
        max_new_tokens=200,
        max_steps=1,
        chat_template=thinking_template(False),
        save_steps=0,
        log_every=0,
        learning_rate=1e-2,
        kl_coef=0.0,
        num_iterations=2,
        whiten_advantages=False,
    )
    seen = {}

    def alternating(prompts, completions, completion_ids, **columns):
        seen["ids"] = completion_ids
        return [float(i % 2) for i in range(len(prompts))]

    t = RLTrainer(tiny_causal_lm(tok), [alternating], args, rows, processing_class=tok, tools=[add])
    n = args.prompts_per_step * args.group_size
    t.sampler.engine = engine = ScriptedEngine(
        tok,
        [["<think>\nplan\n</think>\n\n" + CALL] * n, [f"<think>\nsum {i}\n</think>\n\n19<|im_end|>" for i in range(n)]],
    )
    picked = t.sampler.sample_prompts()
    rollout, episodes = t.sampler.generate(picked)
    scores, valid, metrics = t.sampler.score(picked, rollout, episodes)
    exp = t.make_experience(rollout, scores, valid, metrics)
    assert rollout.segments is not None and exp.mask.long().equal(rollout.response_mask.long())
    assert seen["ids"] == [e.completion_ids for e in episodes]  # the conversation as last seen, not the packed row
    model = t.models.policy
    for i in range(n):  # each turn's log-probs after its own context, one sequence per turn
        contexts = [torch.tensor([engine.contexts[k][i] + engine.returned[k][i]]) for k in range(2)]
        alone = torch.cat(
            [
                forward_response(model, c, torch.ones_like(c), len(engine.returned[k][i])).logprobs[0]
                for k, c in enumerate(contexts)
            ]
        )
        torch.testing.assert_close(exp.old_logprobs[i][exp.mask[i]], alone, atol=1e-5, rtol=0)
        if algorithm == "ppo":  # GAE over the episode's sampled tokens, across the segments
            sampled = exp.mask[i].nonzero().flatten()
            rewards = torch.zeros(1, len(sampled))
            rewards[0, -1] = scores[i]
            adv, _ = gae(rewards, exp.old_values[i, sampled][None], torch.ones(1, len(sampled)), args.gamma, args.lam)
            torch.testing.assert_close(exp.advantages[i, sampled], adv[0])
    before = [p.detach().clone() for p in model.parameters()]
    t.update(exp)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
