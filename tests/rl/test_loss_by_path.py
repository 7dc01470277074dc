"""A policy loss in the user's own module, named by its path (``policy_loss: my_pkg.losses:my_loss``) in
YAML, on the command line and in ``RLConfig``: the registry imports the module (``loss_registry.py``),
which registers the loss under a name of its own or leaves the function to be registered under its
path. Such a loss need not know the rollout correction: the update applies it around the loss."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from rlhfkit.algorithms import POLICY_LOSSES, aggregate
from rlhfkit.config import RLConfig, part
from rlhfkit.config.io import load_config
from rlhfkit.config.jobs import RLJob
from rlhfkit.rl.update import UpdateLoss, loss
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MODULE = '''
from rlhfkit.algorithms import POLICY_LOSSES, LossOutputs

CALLS = []  # the weights each call saw


def plain_pg(inputs):
    """-A log π per token; it never reads inputs.weights."""
    CALLS.append(inputs.weights)
    advantages = inputs.advantages if inputs.advantages.dim() == 2 else inputs.advantages[:, None]
    return LossOutputs(-advantages.detach() * inputs.logprobs)


@POLICY_LOSSES.register("{name}_registered", importance_sampling_levels=("token",), zero_at_zero_advantage=True)
def registered(inputs):
    return plain_pg(inputs)
'''


@pytest.fixture()
def user_losses(tmp_path, monkeypatch, request):
    """A package of the user's on sys.path, ``<name>.losses`` holding ``plain_pg`` (registered by nobody) and
    ``registered`` (registered by the module as ``<name>_registered``); every loss it brought is unregistered
    afterwards. Returns the package's name."""
    name = f"user_losses_{request.node.name.split('[')[0][-20:]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "losses.py").write_text(textwrap.dedent(MODULE.format(name=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for registered in [n for n in POLICY_LOSSES if n.startswith(name)]:
        POLICY_LOSSES.unregister(registered)
    for module in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[module]


def config(**changes) -> RLConfig:
    args = dict(algorithm="grpo", kl_coef=0.0, learning_rate=3e-3, max_new_tokens=6, max_steps=1, log_every=0)
    return RLConfig(**{**args, "seed": 0, "prompts_per_step": 2, **changes})


def varied(prompts, completions, **kwargs):
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def trainer(args: RLConfig) -> RLTrainer:
    tok = char_tokenizer()
    return RLTrainer(tiny_causal_lm(tok, seed=0), [varied], args, train_dataset=PROMPTS, processing_class=tok)


def test_a_loss_named_by_path_in_yaml_and_on_the_command_line_trains(tmp_path, user_losses):
    path = f"{user_losses}.losses:plain_pg"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"algorithm: grpo\npolicy_loss: {path}\n")
    assert load_config(RLJob, recipe).policy_loss == path
    assert load_config(RLJob, None, [f"policy_loss={path}"]).policy_loss == path
    # a function its module did not register: registered under its path, with the safe traits
    assert POLICY_LOSSES.traits(path) == {
        "importance_sampling_levels": ("token",),
        "zero_at_zero_advantage": False,
        "applies_correction": False,
    }
    t = trainer(config(policy_loss=path))
    before = [p.detach().clone() for p in t.models.policy.parameters()]
    t.train()
    assert sys.modules[f"{user_losses}.losses"].CALLS  # the loss ran
    assert any(not torch.equal(a, b) for a, b in zip(before, t.models.policy.parameters()))


def test_a_module_that_registers_its_loss_is_named_by_the_functions_path(user_losses):
    path = f"{user_losses}.losses:registered"
    assert POLICY_LOSSES.resolve(path) == f"{user_losses}_registered"
    assert POLICY_LOSSES.traits(path)["zero_at_zero_advantage"] is True  # the module's declaration
    assert config(policy_loss=path).policy_loss == path


@pytest.mark.parametrize(
    "policy_loss, message",
    [
        (
            "no_such_package_53.losses:mine",
            "policy_loss 'no_such_package_53.losses:mine': cannot import the module 'no_such_package_53.losses' "
            "(ModuleNotFoundError: No module named 'no_such_package_53')",
        ),
        (
            "{pkg}.losses:nothing",
            "policy_loss '{pkg}.losses:nothing': the module '{pkg}.losses' has no function 'nothing'",
        ),
        ("{pkg}.losses:", "policy_loss '{pkg}.losses:': a loss named by path is 'module:function'"),
    ],
)
def test_a_path_that_names_nothing_is_one_line_naming_the_field(user_losses, policy_loss, message):
    with pytest.raises(ValueError) as err:
        config(policy_loss=policy_loss.format(pkg=user_losses))
    assert message.format(pkg=user_losses) in str(err.value) and "\n" not in str(err.value)


def test_a_loss_that_ignores_the_weights_gets_the_rollout_correction_in_the_update(user_losses):
    """Two passes (the correction made before the update, ``Experience.is_weights``) with an engine whose
    log-probs are not the policy's: the micro-batch loss of the path-named loss is the by-hand
    ``aggregate(-A log π x w)`` with the correction's weights, though the loss never saw them."""
    t = trainer(config(policy_loss=f"{user_losses}.losses:plain_pg", num_iterations=2))
    rows = t.sampler.sample_prompts()
    rollout = t.sampler.engine.generate([t.sampler.prompt_ids[i] for i in rows], t.args.group_size, t.sampler.sampling)
    with torch.no_grad():
        own = t.models.policy_outputs(rollout, with_values=False)[0]
    rollout.logprobs = own + 0.3 * torch.randn(own.shape, generator=torch.Generator().manual_seed(2))
    exp = t.make_experience(rollout, *t.sampler.score(rows, rollout))
    assert exp.is_weights is not None and bool((exp.is_weights[exp.mask] != 1).any())
    everything = torch.arange(exp.mask.shape[0])
    value, _ = loss(t.models, part(UpdateLoss, t.args), exp, everything, 0.0)
    with torch.no_grad():
        logprobs = t.models.train_outputs(exp.rollout, with_values=False, entropy_grad=False)[0]
    adv = exp.advantages if exp.advantages.dim() == 2 else exp.advantages[:, None]
    by_hand = aggregate(-adv * logprobs * exp.is_weights, exp.mask, t.args.loss_agg)
    torch.testing.assert_close(value.detach(), by_hand, rtol=1e-6, atol=1e-7)
    assert not torch.isclose(value.detach(), aggregate(-adv * logprobs, exp.mask, t.args.loss_agg))
    assert sys.modules[f"{user_losses}.losses"].CALLS[-1] is None  # the loss itself never saw them
