"""The sampling side's seams: any ``agents.source.EpisodeSource`` is accepted by the Sampler's
builder (``rl.build.build_sampler``), runs with the engine, sampling and weights version it is
given, and brings its own reward sources."""

import pytest

from rlhfkit.agents.episode import Episode
from rlhfkit.agents.rows import episodes_rollout
from rlhfkit.agents.source import EpisodeSource
from rlhfkit.config import RLConfig, part
from rlhfkit.models.rl_build import ModelLoading, build_models
from rlhfkit.rl.build import build_sampler
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a


class CountingSource(EpisodeSource):
    """Every episode answers ``a`` times its place in the group, then EOS; its environment is its
    place, which its own reward source reads back as the reward."""

    def __init__(self, tokenizer):
        self.tokenizer, self.runs = tokenizer, []

    def start(self, rows, indices, group_size, name="train_dataset"):
        ids = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        return [Episode(ids(rows[i]["prompt"]), {}, row=rows[i]) for i in indices for _ in range(group_size)]

    def run(self, engine, episodes, sampling, seed=None, version=0):
        self.runs.append((engine, sampling, version))
        a, eos = self.tokenizer.convert_tokens_to_ids("a"), self.tokenizer.eos_token_id
        for k, e in enumerate(episodes):
            place = k % 2
            e.extend([a] * (place + 1) + [eos], [0.0] * (place + 2))
            e.messages, e.environment, e.has_eos, e.turns = [{"role": "assistant", "content": "a"}], place, True, 1
        return episodes_rollout(episodes, self.tokenizer.pad_token_id, with_logprobs=False), episodes

    def reward_sources(self):
        return [place_reward]


def place_reward(prompts, completions, environments=None, **columns):
    return [float(env) for env in environments]


@pytest.fixture(scope="module")
def models():
    tok = char_tokenizer()
    config = RLConfig(algorithm="grpo", group_size=2, prompts_per_step=2, max_new_tokens=8, seed=0)
    return config, build_models(tiny_causal_lm(tok, seed=0), tok, part(ModelLoading, config), None, None)


def test_a_fake_episode_source_is_accepted_by_the_builder(models):
    config, built = models
    source = CountingSource(built.tokenizer)
    sampler, evals = build_sampler(config, built, list(PROMPTS), [fraction_of_a], [0.0], source)
    assert evals is None and sampler.agent is source
    assert sampler.rewards.names[-1] == "place_reward"  # its own source, after the run's

    batch = sampler.batch(0, version=7)

    ((engine, sampling, version),) = source.runs
    assert engine is sampler.engine and sampling == sampler.sampling and version == 7  # passed in, not probed
    assert batch.rollout.response_ids.shape[0] == 4
    assert batch.metrics["reward/place_reward_mean"] == 0.5  # places 0, 1, 0, 1: read through environments=
    assert batch.metrics["agent/turns_mean"] == 1.0


def test_the_builder_refuses_what_is_not_an_episode_source(models):
    config, built = models

    class LooksLikeOne:  # start / run by name only: not accepted by impersonation
        def start(self, *a, **k): ...

        def run(self, *a, **k): ...

    with pytest.raises(TypeError, match="EpisodeSource, got LooksLikeOne"):
        build_sampler(config, built, list(PROMPTS), [fraction_of_a], None, LooksLikeOne())
