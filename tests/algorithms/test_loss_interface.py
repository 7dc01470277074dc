"""The policy losses' one interface (``LossInputs`` -> ``LossOutputs``, knobs declared with
``Hyperparameter`` at registration) and the config checks that read the declarations."""

import math

import pytest
import torch

from rlhfkit.algorithms import POLICY_LOSSES, Hyperparameter, LossInputs, LossOutputs, loss_hyperparameters
from rlhfkit.algorithms.loss_interface import in_range
from rlhfkit.algorithms.loss_registry import PolicyLossRegistry
from rlhfkit.config import RLConfig


def test_the_built_in_losses_declare_their_knobs_under_the_config_names():
    declared = {
        n: [(h.name, h.default, h.config_field) for h in POLICY_LOSSES.hyperparameters(n)] for n in POLICY_LOSSES
    }
    assert declared == {
        "ppo_clip": [("clip_low", 0.2, True), ("clip_high", 0.2, True), ("dual_clip", None, True)],
        "vanilla": [],
        "cispo": [("clip_high", 4.0, True)],
        "sapo": [("temperature_pos", 1.0, False), ("temperature_neg", 1.05, False)],
        "vespo": [("k_pos", 2.0, False), ("lambda_pos", 3.0, False), ("k_neg", 3.0, False), ("lambda_neg", 2.0, False)],
    }
    assert all(h.doc for n in POLICY_LOSSES for h in POLICY_LOSSES.hyperparameters(n))


def test_the_loop_gets_each_loss_its_own_knobs_from_the_config():
    assert loss_hyperparameters("ppo_clip", RLConfig(algorithm="dapo", dual_clip=3.0)) == {
        "clip_low": 0.2,
        "clip_high": 0.28,
        "dual_clip": 3.0,
    }
    assert loss_hyperparameters("cispo", RLConfig(algorithm="cispo")) == {"clip_high": 4.0}
    assert loss_hyperparameters("vanilla", RLConfig(algorithm="rloo")) == {}


def test_a_config_field_knob_is_checked_against_the_range_its_loss_declares():
    RLConfig(algorithm="cispo", clip_high=-0.8)  # CISPO's cap 1 + clip_high = 0.2: TRL's default
    with pytest.raises(ValueError) as err:
        RLConfig(algorithm="grpo", clip_high=-0.5)
    assert str(err.value) == (
        "RLConfig: config field 'clip_high' must be a float > 0 with the 'ppo_clip' policy loss (the ratio's ceiling "
        "1 + clip_high, TRL's epsilon_high), got -0.5; the 'cispo' policy loss takes a float > -1"
    )


@pytest.mark.parametrize(
    "changes, field, loss, readers",
    [
        (dict(algorithm="rloo", clip_low=0.1), "clip_low", "vanilla", "ppo_clip"),
        (dict(algorithm="reinforce", clip_high=0.3), "clip_high", "vanilla", "cispo, ppo_clip"),
        (dict(algorithm="cispo", dual_clip=3.0), "dual_clip", "cispo", "ppo_clip"),
        (dict(algorithm="cispo", clip_low=0.3), "clip_low", "cispo", "ppo_clip"),
    ],
)
def test_a_knob_set_for_a_loss_that_does_not_read_it_is_refused(changes, field, loss, readers):
    with pytest.raises(ValueError) as err:
        RLConfig(**changes)
    assert str(err.value) == (
        f"RLConfig: config field {field!r} is not read by the {loss!r} policy loss (only by {readers}): "
        f"leave it unset, got {changes[field]!r}"
    )


def test_a_knob_the_preset_filled_is_not_the_users_and_passes():
    assert RLConfig(algorithm="rloo").clip_low == 0.2  # filled by the preset, read by no vanilla loss
    assert RLConfig(algorithm="ppo", clip_low=0.1).replace(algorithm="grpo").clip_low == 0.1


def test_loss_options_may_not_set_a_config_field():
    with pytest.raises(
        ValueError, match=r"'loss_options' has the key 'clip_high', which is a config field of its own: "
    ):
        RLConfig(loss_options={"clip_high": 0.3})


def test_registration_checks_the_signature_against_the_declared_knobs():
    reg = PolicyLossRegistry()
    knob = Hyperparameter("tau", 1.0, "a knob")
    with pytest.raises(ValueError, match=r"must be f\(inputs, \*, tau\) .*got \(inputs, \*, beta\)"):
        reg.register("a", importance_sampling_levels=("token",), zero_at_zero_advantage=True, hyperparameters=(knob,))(
            lambda inputs, *, beta: None
        )
    with pytest.raises(ValueError, match=r"must be f\(inputs, \*, tau\) .*got \(inputs, tau\)"):
        reg.register("b", importance_sampling_levels=("token",), zero_at_zero_advantage=True, hyperparameters=(knob,))(
            lambda inputs, tau: None
        )
    with pytest.raises(ValueError, match="declares a hyperparameter twice"):
        reg.register(
            "c", importance_sampling_levels=("token",), zero_at_zero_advantage=True, hyperparameters=(knob, knob)
        )
    with pytest.raises(ValueError, match="must be Hyperparameter"):
        reg.register("d", importance_sampling_levels=("token",), zero_at_zero_advantage=True, hyperparameters=("tau",))
    with pytest.raises(ValueError, match=r"must take \(inputs\) first"):
        reg.register("e", importance_sampling_levels=("token",), zero_at_zero_advantage=True)(lambda lp: None)
    assert reg.names() == []


def test_an_entry_fills_its_declared_defaults_and_returns_one_outputs_object():
    reg = PolicyLossRegistry()

    @reg.register(
        "mine",
        importance_sampling_levels=("token",),
        zero_at_zero_advantage=True,
        hyperparameters=(Hyperparameter("tau", 2.0, "a knob", "> 0"), Hyperparameter("n", 3, "a count", "[1, 9]", int)),
    )
    def mine(inputs, *, tau, n):
        return LossOutputs(inputs.logprobs * torch.tensor([[1.0, 3.0]]) * tau * n)  # per token

    assert mine.__name__ == "mine"  # the decorator hands the function back unchanged
    inputs = LossInputs(torch.ones(1, 2), torch.ones(1, 2), torch.ones(1), torch.ones(1, 2))
    assert reg.get("mine")(inputs).loss.item() == 12.0  # the token mean of [6, 18] (token-mean when agg is None)
    assert reg.get("mine")(inputs, n=1).loss.item() == 4.0 and reg.get("mine")(inputs).metrics == {}
    reg.unregister("mine")
    assert "mine" not in reg
    with pytest.raises(ValueError, match="unknown policy loss 'mine'"):
        reg.hyperparameters("mine")


@pytest.mark.parametrize(
    "knob, good, bad, expected",
    [
        (
            Hyperparameter("a", 1.0, "", "> 0"),
            [0.5, 2, 1e9],
            [0, -1.0, math.inf, math.nan, True, "1", None],
            "a float > 0",
        ),
        (Hyperparameter("b", 3, "", "[1, 9]", int), [1, 9], [0, 10, 2.5, True], "an int in [1, 9]"),
        (Hyperparameter("c", None, "", "> 1 or None"), [None, 1.5], [1.0, "x"], "a float > 1 or None"),
        (Hyperparameter("d", False, "", type=bool), [True, False], [0, 1, None], "a bool"),
        (Hyperparameter("e", "x", "", type=str), ["y"], [1, None], "a str"),
        (Hyperparameter("f", 0.0, ""), [-1e9, 0, 3.5], [math.inf, None], "a float"),
    ],
)
def test_a_hyperparameter_accepts_its_type_and_range_only(knob, good, bad, expected):
    assert all(knob.accepts(v) for v in good), good
    assert not any(knob.accepts(v) for v in bad), [v for v in bad if knob.accepts(v)]
    assert knob.expected() == expected


def test_in_range_reads_the_config_ranges_notation():
    assert in_range(0.5, "(0, 1)") and not in_range(1.0, "(0, 1)") and in_range(1.0, "(0, 1]")
    assert in_range(0.0, ">= 0") and not in_range(0.0, "> 0") and in_range(-2.0, "< -1") and in_range(-1, "<= -1")
    assert not in_range(math.nan, "finite") and in_range(-5.0, "finite")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(range="positive"), "range 'positive' is not in config.RANGES' notation"),
        (dict(range="(0; 1)"), "range '(0; 1)' is not in config.RANGES' notation"),
        (dict(type=list), "type must be float, int, bool or str"),
    ],
)
def test_a_malformed_declaration_is_refused_where_it_is_written(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Hyperparameter("tau", 1.0, "a knob", **changes)
