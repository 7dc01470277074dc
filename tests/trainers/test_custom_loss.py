"""A new policy loss with a knob of its own is this file alone: the loss, its registration declaring
the knob, and a run of the RL loop with ``policy_loss=<it>`` and ``loss_options={knob: value}``
(issue 45: one loss interface, ``LossInputs`` -> ``LossOutputs``)."""

import pytest
import torch

from rlhfkit.algorithms import POLICY_LOSSES, Hyperparameter, LossInputs, LossOutputs
from rlhfkit.config import RLConfig
from rlhfkit.config.io import load_config
from rlhfkit.config.jobs import RLJob
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers import RLTrainer

SEEN = []  # the knob values the loss was called with


def scaled_pg(inputs: LossInputs, *, scale: float) -> LossOutputs:
    """``scale`` x the plain policy gradient ``-A_t log π(y_t)``, per token (the registry applies the rollout
    correction and aggregates it); reports ``scale`` as a metric."""
    SEEN.append(scale)
    advantages = inputs.advantages if inputs.advantages.dim() == 2 else inputs.advantages[:, None]
    return LossOutputs(-scale * advantages.detach() * inputs.logprobs, {"policy/scale": torch.tensor(float(scale))})


@pytest.fixture(autouse=True)
def registered():
    POLICY_LOSSES.register(
        "scaled_pg",
        importance_sampling_levels=("token",),
        zero_at_zero_advantage=True,
        hyperparameters=(Hyperparameter("scale", 1.0, "the factor of the policy gradient", "> 0"),),
    )(scaled_pg)
    SEEN.clear()
    yield
    POLICY_LOSSES.unregister("scaled_pg")


def config(**changes):
    args = dict(
        algorithm="grpo",
        policy_loss="scaled_pg",
        learning_rate=3e-3,
        max_new_tokens=8,
        max_steps=1,
        log_every=0,
        seed=0,
        prompts_per_step=4,
        kl_coef=0.0,
    )
    return RLConfig(**{**args, **changes})


def test_the_new_loss_trains_one_step_with_its_knob_from_loss_options():
    tok = char_tokenizer()
    trainer = RLTrainer(
        tiny_causal_lm(tok, seed=0),
        [fraction_of_a],
        config(loss_options={"scale": 0.25}),
        train_dataset=PROMPTS,
        processing_class=tok,
    )
    before = [p.detach().clone() for p in trainer.models.policy.parameters()]
    history = trainer.train()
    assert SEEN and set(SEEN) == {0.25}  # the knob reached the loss on every micro-batch
    assert history[0]["policy/scale"] == pytest.approx(0.25)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.models.policy.parameters()))


def test_a_knob_left_out_takes_its_declared_default():
    assert config().loss_options == {}
    out = POLICY_LOSSES.get("scaled_pg")(
        LossInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2))
    )
    assert SEEN == [1.0] and out.metrics["policy/scale"].item() == 1.0


def test_the_knob_comes_from_yaml_and_from_json_on_the_command_line(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("policy_loss: scaled_pg\nloss_options:\n  scale: 0.5\n")
    assert load_config(RLJob, recipe).loss_options == {"scale": 0.5}
    cli = load_config(RLJob, None, ["policy_loss=scaled_pg", 'loss_options={"scale": 2}'])
    assert cli.policy_loss == "scaled_pg" and cli.loss_options == {"scale": 2}


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"scal": 0.5},
            "RLConfig: config field 'loss_options' has the key 'scal', which the 'scaled_pg' policy loss does not "
            "take; its knobs: scale (loss_options)",
        ),
        (
            {"scale": -1.0},
            "RLConfig: config field 'loss_options' key 'scale' must be a float > 0 with the 'scaled_pg' policy loss "
            "(the factor of the policy gradient), got -1.0",
        ),
        ({"scale": "big"}, "config field 'loss_options' key 'scale' must be a float > 0"),
        ({"scale": True}, "config field 'loss_options' key 'scale' must be a float > 0"),
        ({"scale": float("nan")}, "config field 'loss_options' key 'scale' must be a float > 0"),
        ("scale=0.5", "config field 'loss_options' must be a mapping of knob names to values, got 'scale=0.5'"),
    ],
)
def test_bad_loss_options_are_refused_in_one_line_naming_the_field_and_the_loss(options, message):
    with pytest.raises(ValueError) as err:
        config(loss_options=options)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_another_losss_knob_is_refused_for_a_loss_that_does_not_declare_it():
    with pytest.raises(ValueError, match=r"the key 'scale', which the 'ppo_clip' policy loss does not take; its "):
        RLConfig(algorithm="grpo", loss_options={"scale": 0.5})
    with pytest.raises(ValueError, match=r"config field 'dual_clip' is not read by the 'scaled_pg' policy loss"):
        config(dual_clip=3.0)
