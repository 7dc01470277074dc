"""The rollout engines' registry (``config.engines``): an engine registered by a test runs a
training run as ``rollout_engine="fake"`` — nothing in ``trainers/`` or the config names it — and
its install check refuses in one line before any model loads."""

import pytest

from rlhfkit.config import RLConfig
from rlhfkit.config.engines import EngineEntry, engine_entry, engine_names, register_engine, unregister_engine
from rlhfkit.rollout import HFEngine
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a, toy_trainer
from rlhfkit.trainers import RLTrainer

BUILT = []


class FakeEngine(HFEngine):
    """HF generate on the policy, counting its calls."""

    calls = 0

    def generate(self, *args, **kwargs):
        FakeEngine.calls += 1
        return super().generate(*args, **kwargs)


def build_fake(args, models, longest_prompt, options):
    BUILT.append((args.rollout_engine, longest_prompt, options))
    tok = models.tokenizer
    return FakeEngine(models.policy, tok.pad_token_id, tok.eos_token_id, args.share_prompt)


def not_installed():
    raise ValueError("rollout_engine='fake' needs fake-engine: pip install fake-engine")


@pytest.fixture()
def fake():
    register_engine(EngineEntry("fake", build_fake, options=("vllm_sleep", "max_prompt_length")))
    BUILT.clear()
    yield
    unregister_engine("fake")


def test_a_registered_engine_is_a_rollout_engine_the_config_accepts(fake):
    assert "fake" in engine_names() and RLConfig(rollout_engine="fake").rollout_engine == "fake"
    unregister_engine("fake")
    with pytest.raises(ValueError, match="rollout_engine.*one of hf, vllm"):
        RLConfig(rollout_engine="fake")


def test_an_engine_s_own_rules_run_with_the_config_s_checks_when_it_is_chosen():
    def rules(config):
        return [(config.max_new_tokens <= 8, "max_new_tokens", "at most 8 with rollout_engine='small'")]

    register_engine(EngineEntry("small", build_fake, check=rules))
    try:
        assert RLConfig(rollout_engine="small", max_new_tokens=8).max_new_tokens == 8
        with pytest.raises(ValueError, match=r"'max_new_tokens' must be at most 8 with rollout_engine='small', got 9"):
            RLConfig(rollout_engine="small", max_new_tokens=9)
        assert RLConfig(max_new_tokens=9).max_new_tokens == 9  # another engine chosen: the rule is not its
    finally:
        unregister_engine("small")


def test_a_registered_engine_runs_the_loop(fake):
    FakeEngine.calls = 0
    trainer = toy_trainer("grpo", rollout_engine="fake", max_steps=2)
    history = trainer.train()
    assert len(history) == 2 and FakeEngine.calls == 2  # one generate per step, by the fake engine
    ((name, longest, options),) = BUILT
    assert name == "fake" and longest == max(len(p) for p in trainer.sampler.prompt_ids)
    assert options == {"vllm_sleep": False, "max_prompt_length": None}  # the fields its entry names


def test_an_install_check_refuses_before_any_model_loads():
    register_engine(EngineEntry("fake", build_fake, install_check=not_installed))
    try:
        with pytest.raises(ValueError, match="pip install fake-engine"):
            RLTrainer("/nonexistent/model", [fraction_of_a], RLConfig(rollout_engine="fake"), train_dataset=PROMPTS)
    finally:
        unregister_engine("fake")


def test_registering_is_refused_twice_and_unknown_names_in_one_line():
    with pytest.raises(ValueError, match="already registered"):
        register_engine(EngineEntry("hf", build_fake))
    with pytest.raises(ValueError, match="'sglang' is not a rollout engine; one of hf, vllm"):
        engine_entry("sglang")
    with pytest.raises(TypeError, match="EngineEntry"):
        register_engine({"name": "fake"})


@pytest.fixture()
def fake_with_knobs():
    register_engine(EngineEntry("fake", build_fake, options=("vllm_sleep",), knobs={"mem_fraction": 0.5, "tag": "x"}))
    BUILT.clear()
    yield
    unregister_engine("fake")


def test_an_engines_own_options_reach_its_builder_through_engine_options(fake_with_knobs):
    """An option that is no RLConfig field: declared by the entry, set in engine_options (the config
    not touched), its default where not set."""
    toy_trainer("grpo", rollout_engine="fake", engine_options={"mem_fraction": 0.25}, max_steps=1).train()
    assert BUILT[-1][2] == {"vllm_sleep": False, "mem_fraction": 0.25, "tag": "x"}
    toy_trainer("grpo", rollout_engine="fake", max_steps=1).train()
    assert BUILT[-1][2] == {"vllm_sleep": False, "mem_fraction": 0.5, "tag": "x"}


def test_engine_options_are_checked_against_the_entrys_knobs(fake_with_knobs):
    with pytest.raises(
        ValueError, match=r"'mem_frac' is no option of rollout_engine='fake' \(its options: mem_fraction, tag\)"
    ):
        RLConfig(rollout_engine="fake", engine_options={"mem_frac": 0.3})
    with pytest.raises(ValueError, match=r"'mem_fraction' of rollout_engine='fake' takes a float"):
        RLConfig(rollout_engine="fake", engine_options={"mem_fraction": "half"})
    assert RLConfig(rollout_engine="fake", engine_options={"mem_fraction": 1}).engine_options == {"mem_fraction": 1}
    with pytest.raises(ValueError, match="no option of rollout_engine='hf'"):
        RLConfig(engine_options={"mem_fraction": 0.3})  # the built-in HF engine has none
