"""Token in, token out on vLLM (CPU build): over multi-turn episodes with tool calls, the ids the
trainer trains on are the ids the engine sampled, turn by turn, and the trainer's log-prob of
every sampled token equals the engine's, with the tool suffixes attended and masked.

Run by ``make test-vllm`` (its own environment, .venv-vllm); deselected from ``make test``."""

import pytest
import torch

import rlhfkit.agents.episode as episode_module
from rlhfkit.agents import AgentOptions, make_tools, run_episodes, start_episode
from rlhfkit.models import forward_response
from rlhfkit.rollout import SamplingParams
from rlhfkit.tasks.tiny import chatml_tokenizer

from .conftest import add

pytestmark = pytest.mark.vllm

LOGPROB_TOL = 1e-4


def test_vllm_episodes_train_on_the_sampled_ids_with_the_engines_logprobs(monkeypatch, engine_threads):
    """Six episodes of a random model made to end its turns often, every turn answered by a tool
    call: the ids the trainer trains on are the ids the engine returned, turn by turn, byte for
    byte; the tool suffixes are attended but masked; the trainer's log-probs of the sampled tokens
    are the engine's. 120 new tokens per episode (was 200: the decode steps were this test's cost)
    still give multi-turn episodes and several tool calls (both asserted)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.rollout.vllm import VLLMEngine, hf_weights

    torch.manual_seed(0)
    tok = chatml_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    policy = LlamaForCausalLM(config).float().eval()  # head size 32: vLLM's CPU attention needs >= 32
    with torch.no_grad():  # a random model that ends its turns often, so episodes have several turns
        policy.lm_head.weight[tok.eos_token_id] = policy.lm_head.weight.mean(0) + 0.02
    monkeypatch.setattr(
        episode_module,
        "parse_tool_calls",
        lambda text, t, tools: (
            text,
            [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": len(text)}}}],
        ),
    )
    engine = VLLMEngine(policy, tok, max_model_len=1536, seed=0, kv_cache_gb=0.25)
    engine.sync_weights(hf_weights(policy), version=0)
    returned, generate = [], engine.generate

    def recording(prompts, n, sampling, seed=None):  # what the engine itself returned, per context
        out = generate(prompts, n, sampling, seed)
        returned.append([out.response_ids[i, : int(out.response_mask[i].sum())].tolist() for i in range(len(prompts))])
        return out

    engine.generate = recording
    tools = make_tools([add])
    episodes = [start_episode(tok, [{"role": "user", "content": f"{i}+1?"}], tools) for i in range(6)]
    rollout = run_episodes(
        engine, tok, episodes, SamplingParams(max_new_tokens=120), AgentOptions(max_tool_calling_iterations=2), seed=5
    )
    assert max(e.turns for e in episodes) >= 2 and sum(e.tool_calls for e in episodes) >= 2
    mask = rollout.response_mask.bool()
    turns = iter(returned)
    sampled = [[] for _ in episodes]
    for turn in range(3):  # turn by turn, the episodes still running took the engine's next outputs
        out = iter(next(turns, []))
        for i in [i for i, e in enumerate(episodes) if e.turns > turn]:
            sampled[i] += next(out)
    for i in range(len(episodes)):  # byte for byte (the last turn may be cut at the budget)
        assert rollout.response_ids[i][mask[i]].tolist() == sampled[i][: int(mask[i].sum())]
    assert (rollout.attention_mask[:, rollout.prompt_len :].bool() & ~mask).sum() > 0  # tool suffixes attended
    trainer = forward_response(policy, rollout.input_ids, rollout.attention_mask, mask.shape[1], 1.0).logprobs
    assert (trainer - rollout.logprobs)[mask].abs().max() < LOGPROB_TOL
    assert rollout.logprobs[~mask].abs().sum() == 0


def test_rl_steps_with_an_environment_on_the_vllm_engine(tmp_path):
    """The loop on vLLM with environment_factory=: the engine receives the weights after each
    update, runs the episodes and reports its log-probs; the IS correction sees only sampled tokens.
    Two steps (the second generates after a sync), 48 new tokens (was 120: a random model's episodes,
    their length only costs decode steps)."""
    from rlhfkit import RLConfig, RLTrainer
    from rlhfkit.tasks.calculator import Calculator
    from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
    from rlhfkit.tasks.tiny import tiny_causal_lm

    tok = chatml_tokenizer()
    rows = [{"prompt": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in [(12, 3), (4, 25), (7, 8), (9, 9)]]
    args = RLConfig(
        algorithm="grpo",
        rollout_engine="vllm",
        vllm_kv_cache_gb=0.25,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=48,
        max_steps=2,
        chat_template=TINY_TOOLS_TEMPLATE,
        log_every=0,
        output_dir=str(tmp_path / "run"),
        rollout_is="token_truncate",
        learning_rate=1e-3,
    )
    history = RLTrainer(
        tiny_causal_lm(tok, heads=2),
        ["strict_math_answer"],
        args,
        rows,
        processing_class=tok,
        environment_factory=Calculator,
    ).train()
    assert len(history) == 2 and all("agent/turns_mean" in r for r in history)
    assert history[-1]["rollout/logprob_diff_max"] < 1e-3  # the engine's log-probs are the trainer's


def test_vllm_episodes_whose_history_is_rewritten_train_in_each_turns_context(monkeypatch, engine_threads):
    """A thinking template that drops every earlier turn's reasoning (the turn's text, made the
    reasoning of a forced tool call): each turn is prompted with the template's rendering, so the
    episodes are several segments; the trainer's log-prob of every sampled token, computed in the
    context it was sampled in (models.segments), is the engine's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.models.segments import forward_rollout
    from rlhfkit.rollout.vllm import VLLMEngine, hf_weights
    from rlhfkit.tasks.tiny import thinking_template

    torch.manual_seed(0)
    tok = chatml_tokenizer()
    tok.chat_template = thinking_template(False)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    policy = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        policy.lm_head.weight[tok.eos_token_id] = policy.lm_head.weight.mean(0) + 0.02
    monkeypatch.setattr(
        episode_module,
        "parse_tool_calls",
        lambda text, t, tools: (
            f"<think>{text}</think>",
            [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        ),
    )
    engine = VLLMEngine(policy, tok, max_model_len=1536, seed=0, kv_cache_gb=0.25)
    engine.sync_weights(hf_weights(policy), version=0)
    episodes = [start_episode(tok, [{"role": "user", "content": f"{i}+1?"}], make_tools([add])) for i in range(6)]
    rollout = run_episodes(
        engine, tok, episodes, SamplingParams(max_new_tokens=240), AgentOptions(max_tool_calling_iterations=2), seed=5
    )
    assert rollout.segments is not None and max(e.segment[-1] for e in episodes) >= 1
    mask = rollout.response_mask.bool()
    for i, e in enumerate(episodes):
        assert rollout.response_ids[i][mask[i]].tolist() == [t for t, s in zip(e.ids, e.sampled) if s]
    trainer = forward_rollout(policy, rollout, 1.0).logprobs
    assert (trainer - rollout.logprobs)[mask].abs().max() < LOGPROB_TOL
