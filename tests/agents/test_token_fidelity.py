"""Token in, token out with a real engine: over multi-turn episodes with tool calls, the ids the
trainer trains on are the ids HF ``generate`` sampled, byte for byte, and the trainer's log-prob
of every sampled token equals the sampler's to 1e-4 (float32), with tool output masked."""

import pytest
import torch

import rlhfkit.agents.episode as episode_module
from rlhfkit.agents import AgentOptions, make_tools, run_episodes, start_episode
from rlhfkit.models import forward_response
from rlhfkit.rollout import HFEngine
from rlhfkit.rollout.base import SamplingParams

from .conftest import add

pytestmark = pytest.mark.usefixtures("one_thread")


class Recording(HFEngine):
    def generate(self, prompts, n, sampling, seed=None):
        out = super().generate(prompts, n, sampling, seed)
        self.returned = getattr(self, "returned", []) + [
            out.response_ids[i, : int(out.response_mask[i].sum())].tolist() for i in range(len(prompts))
        ]
        return out


def _turn_ending_model(chatml):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(chatml),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        pad_token_id=chatml.pad_token_id,
        eos_token_id=chatml.eos_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():  # a random model that ends its turns often, so episodes have several turns
        model.lm_head.weight[chatml.eos_token_id] *= 0
        model.lm_head.weight[chatml.eos_token_id] += model.lm_head.weight.mean(0) + 0.02
    return model


def _always_call_the_tool(monkeypatch):
    # Whatever a turn says, it calls the tool: the turns are sampled, the calls are forced.
    monkeypatch.setattr(
        episode_module,
        "parse_tool_calls",
        lambda text, tok, tools: (
            text,
            [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": len(text)}}}],
        ),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trainer_logprobs_and_ids_match_the_sampler_over_tool_turns(chatml, monkeypatch, temperature):
    model = _turn_ending_model(chatml)
    _always_call_the_tool(monkeypatch)
    engine = Recording(model, chatml.pad_token_id, chatml.eos_token_id, logprobs=True)
    tools = make_tools([add])
    episodes = [start_episode(chatml, [{"role": "user", "content": f"{i}+1?"}], tools) for i in range(6)]
    sampling = SamplingParams(max_new_tokens=200, temperature=temperature)
    rollout = run_episodes(engine, chatml, episodes, sampling, AgentOptions(max_tool_calling_iterations=2))
    assert max(e.turns for e in episodes) >= 2 and sum(e.tool_calls for e in episodes) >= 2  # tool turns happened
    mask = rollout.response_mask.bool()
    # the ids: each row's sampled positions hold exactly what generate returned for it, turn by turn
    turns = iter(engine.returned)
    per_episode = [[] for _ in episodes]
    for turn in range(3):
        for i in [i for i, e in enumerate(episodes) if e.turns > turn]:
            per_episode[i] += next(turns)
    for i in range(len(episodes)):
        assert rollout.response_ids[i][mask[i]].tolist() == per_episode[i][: int(mask[i].sum())]
    # tool suffixes are in the sequence (attended) but masked out of training
    gaps = rollout.attention_mask[:, rollout.prompt_len :].bool() & ~mask
    assert gaps.sum() > 0
    trainer = forward_response(model, rollout.input_ids, rollout.attention_mask, mask.shape[1], temperature).logprobs
    assert (trainer - rollout.logprobs)[mask].abs().max() < 1e-4


def test_a_seeded_episode_samples_the_same_whatever_episodes_run_beside_it(chatml, monkeypatch):
    """Per-episode seeds: an episode's turns are the same tokens when it runs among six episodes
    (which end at other turns, so each turn's batch holds other rows) and when it runs alone."""
    model = _turn_ending_model(chatml)
    _always_call_the_tool(monkeypatch)
    engine = HFEngine(model, chatml.pad_token_id, chatml.eos_token_id)
    tools = make_tools([add])
    sampling, options = SamplingParams(max_new_tokens=200), AgentOptions(max_tool_calling_iterations=2)

    def episodes(indices):
        return [start_episode(chatml, [{"role": "user", "content": f"{i}+1?"}], tools) for i in indices]

    together = episodes(range(6))
    run_episodes(engine, chatml, together, sampling, options, seed=[7 * i for i in range(6)])
    assert len({e.turns for e in together}) > 1  # some episodes ended before others
    for i in (2, 5):
        alone = episodes([i])
        run_episodes(engine, chatml, alone, sampling, options, seed=[7 * i])
        assert alone[0].ids == together[i].ids and alone[0].turns == together[i].turns
