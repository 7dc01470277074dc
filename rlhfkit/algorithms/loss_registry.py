"""The policy-loss registry, ``POLICY_LOSSES``, and its built-in entries: one interface
(``loss_interface.py``), ``f(inputs: LossInputs, *, <its knobs>) -> LossOutputs``, each entry
declaring its traits and its knobs (``Hyperparameter``) where it is registered. The config check
reads the declarations (``check_loss_options``), the loop passes the knobs (``loss_hyperparameters``),
so a new loss with a knob of its own is one function and its registration, in any file::

    @POLICY_LOSSES.register(
        "mine", importance_sampling_levels=("token",), zero_at_zero_advantage=True,
        hyperparameters=(Hyperparameter("tau", 1.0, "temperature of the weight", "> 0"),),
    )
    def mine(inputs, *, tau):
        ...
        return LossOutputs(loss, metrics)

trained with ``RLConfig(policy_loss="mine", loss_options={"tau": 0.5})``.

Traits: ``importance_sampling_levels`` (the levels of ``importance_sampling_level`` the loss takes:
a loss without an importance ratio takes "token" only) and ``zero_at_zero_advantage`` (True: a row
whose advantage is 0 on every token has no gradient, as when the per-token loss is a multiple of
the advantage; the update may then leave such rows out, ``skip_zero_gradient_rows``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from .loss_interface import Hyperparameter, LossInputs, LossOutputs, resolve_hyperparameters
from .policy_losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    cispo_policy_loss,
    pg_loss,
    ppo_policy_loss,
    sapo_policy_loss,
    vespo_policy_loss,
)
from .registry import Registry


class PolicyLossRegistry(Registry):
    """The policy losses: ``f(inputs: LossInputs, *, <its knobs>) -> LossOutputs``. Besides its
    traits, an entry declares its knobs, ``hyperparameters=(Hyperparameter(...), ...)``: exactly its
    keyword-only arguments (their defaults are the declarations'). ``get`` returns the entry with
    the declared defaults filled in, so ``POLICY_LOSSES.get(name)(inputs)`` runs any loss alone."""

    def __init__(self):
        super().__init__("policy loss", ("inputs",), traits=("importance_sampling_levels", "zero_at_zero_advantage"))
        self._hyperparameters: dict[str, tuple[Hyperparameter, ...]] = {}

    def register(self, name: str, *, hyperparameters=(), **traits) -> Callable[[Callable], Callable]:
        """Decorator adding the loss ``fn`` under ``name`` with its ``traits`` and ``hyperparameters``."""
        add = super().register(name, **traits)
        declared = tuple(hyperparameters)
        if not all(isinstance(h, Hyperparameter) for h in declared):
            raise ValueError(f"policy loss {name!r}: hyperparameters must be Hyperparameter(...) declarations")
        names = [h.name for h in declared]
        if len(set(names)) != len(names):
            raise ValueError(f"policy loss {name!r} declares a hyperparameter twice: {names}")

        def decorator(fn: Callable) -> Callable:
            code = getattr(fn, "__code__", None)
            if code is not None:
                keywords = list(code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount])
                if code.co_argcount != 1 or sorted(keywords) != sorted(names):
                    raise ValueError(
                        f"policy loss {name!r} must be f(inputs, *, {', '.join(names)}) (its declared "
                        f"hyperparameters, keyword-only), got ({', '.join(code.co_varnames[: code.co_argcount])}"
                        f"{', *, ' + ', '.join(keywords) if keywords else ''})"
                    )
            defaults = {h.name: h.default for h in declared}

            def entry(inputs: LossInputs, **knobs) -> LossOutputs:
                return fn(inputs, **{**defaults, **knobs})

            functools.update_wrapper(entry, fn)
            add(entry)
            self._hyperparameters[name] = declared
            return fn

        return decorator

    def _check_signature(self, name: str, fn: Callable) -> None:
        super()._check_signature(name, getattr(fn, "__wrapped__", fn))

    def unregister(self, name: str) -> None:
        """Remove the loss ``name`` and its declared knobs (one a test or a plugin registered)."""
        super().unregister(name)
        del self._hyperparameters[name]

    def hyperparameters(self, name: str) -> tuple[Hyperparameter, ...]:
        """The knobs the loss ``name`` declared at registration; unknown names as in ``get``."""
        self.get(name)
        return self._hyperparameters[name]


POLICY_LOSSES = PolicyLossRegistry()


def loss_hyperparameters(policy_loss: str, config) -> dict:
    """The keyword arguments ``config`` gives the policy loss ``policy_loss``: each declared knob
    from the config field of its name (``config_field``) or from ``config.loss_options``, its
    default where absent; checked against the declarations (``resolve_hyperparameters``: a
    one-line error naming the field, the key and the loss). ``config``: an ``RLConfig`` or a part
    of it holding those fields (``rl/update.py:UpdateLoss``)."""
    return _resolve(policy_loss, config, None)


def check_loss_options(policy_loss: str, config) -> dict:
    """The config check of the policy loss's knobs (``config/rl.py`` calls it): those of
    ``loss_hyperparameters`` (a field's error also says what the other losses reading it accept),
    and a config field that another registered loss reads as a knob is refused when the user set it
    (not filled by the preset, not its default) and ``policy_loss`` does not read it: it would be
    ignored. Returns ``loss_hyperparameters``'s values."""
    values = _resolve(policy_loss, config, _elsewhere(policy_loss))
    filled = getattr(config, "preset_filled", frozenset())
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for field_name, readers in _config_field_readers().items():
        value = getattr(config, field_name, None)
        if field_name in values or field_name in filled or value == defaults.get(field_name):
            continue
        raise ValueError(
            f"{type(config).__name__}: config field {field_name!r} is not read by the {policy_loss!r} policy loss "
            f"(only by {', '.join(sorted(readers))}): leave it unset, got {value!r}"
        )
    return values


def _resolve(policy_loss: str, config, elsewhere: dict[str, str] | None) -> dict:
    owner = type(config).__name__

    def field_value(name: str):
        if not hasattr(config, name):
            raise ValueError(f"policy loss {policy_loss!r} reads the config field {name!r}, which {owner} has not")
        return getattr(config, name)

    declared = POLICY_LOSSES.hyperparameters(policy_loss)
    options = getattr(config, "loss_options", None)
    return resolve_hyperparameters(
        policy_loss, declared, field_value, {} if options is None else options, owner, elsewhere
    )


def _config_field_readers() -> dict[str, set[str]]:
    """config field -> the registered policy losses that read it as a knob."""
    readers: dict[str, set[str]] = {}
    for name in POLICY_LOSSES:
        for h in POLICY_LOSSES.hyperparameters(name):
            if h.config_field:
                readers.setdefault(h.name, set()).add(name)
    return readers


def _elsewhere(policy_loss: str) -> dict[str, str]:
    """config field -> what the other losses reading it accept ("the 'cispo' policy loss takes a float > -1")."""
    out: dict[str, list[str]] = {}
    for name in POLICY_LOSSES:
        for h in POLICY_LOSSES.hyperparameters(name):
            if name != policy_loss and h.config_field:
                out.setdefault(h.name, []).append(f"the {name!r} policy loss takes {h.expected()}")
    return {k: "; ".join(v) for k, v in out.items()}


def _tensors(inputs: LossInputs) -> tuple:
    return inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.response_mask


def _aggregation(inputs: LossInputs) -> dict:
    """``agg`` (left out when None: the formula's own default), ``horizon`` and ``weights``."""
    agg = {} if inputs.agg is None else {"agg": inputs.agg}
    return {**agg, "horizon": inputs.horizon, "weights": inputs.weights}


# The built-in losses' knobs are RLConfig fields under their user-facing names (TRL's epsilon and
# epsilon_high are clip_low and clip_high; verl's clip_ratio_c is dual_clip).
_CLIP_LOW = Hyperparameter(
    "clip_low", 0.2, "the ratio's floor 1 - clip_low, TRL's epsilon", "(0, 1)", config_field=True
)
_CLIP_HIGH = Hyperparameter(
    "clip_high", 0.2, "the ratio's ceiling 1 + clip_high, TRL's epsilon_high", "> 0", config_field=True
)
_DUAL_CLIP = Hyperparameter(
    "dual_clip",
    None,
    "a negative advantage's loss is at most dual_clip x |A|, None: off",
    "> 1 or None",
    config_field=True,
)
# CISPO's cap: default 4 (a cap of 5, the cispo preset's, ScaleRL's ε_max, arXiv:2510.13786).
_CISPO_CAP = Hyperparameter("clip_high", 4.0, "the detached ratio's cap 1 + clip_high", "> -1", config_field=True)


@POLICY_LOSSES.register(
    "ppo_clip",
    importance_sampling_levels=IMPORTANCE_SAMPLING_LEVELS,
    zero_at_zero_advantage=True,
    hyperparameters=(_CLIP_LOW, _CLIP_HIGH, _DUAL_CLIP),
)
def _ppo_clip(inputs: LossInputs, *, clip_low, clip_high, dual_clip) -> LossOutputs:
    """PPO's clipped surrogate; ``importance_sampling_level="sequence"`` is GSPO (``ppo_policy_loss``)."""
    loss, metrics = ppo_policy_loss(
        *_tensors(inputs),
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        importance_sampling_level=inputs.importance_sampling_level,
        **_aggregation(inputs),
    )
    return LossOutputs(loss, metrics)


@POLICY_LOSSES.register("vanilla", importance_sampling_levels=("token",), zero_at_zero_advantage=True)
def _vanilla(inputs: LossInputs) -> LossOutputs:
    """Plain policy gradient (``pg_loss``), by default ``agg="seq-mean-token-sum"``. It has no
    importance ratio, so ``importance_sampling_level`` can only be "token"."""
    if inputs.importance_sampling_level != "token":
        raise ValueError(
            f"policy loss 'vanilla' has no importance ratio: importance_sampling_level must be "
            f"'token', got {inputs.importance_sampling_level!r}"
        )
    return LossOutputs(*pg_loss(*_tensors(inputs), **_aggregation(inputs)))


@POLICY_LOSSES.register(
    "cispo",
    importance_sampling_levels=IMPORTANCE_SAMPLING_LEVELS,
    zero_at_zero_advantage=True,
    hyperparameters=(_CISPO_CAP,),
)
def _cispo(inputs: LossInputs, *, clip_high) -> LossOutputs:
    """CISPO (``cispo_policy_loss``): the ratio capped at ``1 + clip_high``. It reads no ``clip_low``
    (the paper sets no lower bound on the weight) and no ``dual_clip`` (a capped weight needs none)."""
    loss, metrics = cispo_policy_loss(
        *_tensors(inputs),
        clip_high=clip_high,
        importance_sampling_level=inputs.importance_sampling_level,
        **_aggregation(inputs),
    )
    return LossOutputs(loss, metrics)


@POLICY_LOSSES.register(
    "sapo",
    importance_sampling_levels=IMPORTANCE_SAMPLING_LEVELS,
    zero_at_zero_advantage=True,
    hyperparameters=(
        Hyperparameter("temperature_pos", 1.0, "the gate's temperature where the advantage is > 0", "> 0"),
        Hyperparameter("temperature_neg", 1.05, "the gate's temperature where the advantage is <= 0", "> 0"),
    ),
)
def _sapo(inputs: LossInputs, *, temperature_pos, temperature_neg) -> LossOutputs:
    """SAPO's soft gate (``sapo_policy_loss``), by default per sequence (``seq-mean-token-mean``);
    TRL's ``sapo_temperature_pos`` / ``sapo_temperature_neg``."""
    loss, metrics = sapo_policy_loss(
        *_tensors(inputs),
        temperature_pos=temperature_pos,
        temperature_neg=temperature_neg,
        importance_sampling_level=inputs.importance_sampling_level,
        **_aggregation(inputs),
    )
    return LossOutputs(loss, metrics)


@POLICY_LOSSES.register(
    "vespo",
    importance_sampling_levels=("token",),
    zero_at_zero_advantage=True,
    hyperparameters=(
        Hyperparameter("k_pos", 2.0, "the weight's power where the advantage is >= 0", ">= 0"),
        Hyperparameter("lambda_pos", 3.0, "the weight's decay where the advantage is >= 0", "> 0"),
        Hyperparameter("k_neg", 3.0, "the weight's power where the advantage is < 0", ">= 0"),
        Hyperparameter("lambda_neg", 2.0, "the weight's decay where the advantage is < 0", "> 0"),
    ),
)
def _vespo(inputs: LossInputs, *, k_pos, lambda_pos, k_neg, lambda_neg) -> LossOutputs:
    """VESPO's Gamma-weighted sequence ratio (``vespo_policy_loss``), by default over every token of
    the batch (``token-mean``). It builds its own sequence ratio (a product over the row), so
    ``importance_sampling_level`` can only be "token"; TRL's ``vespo_k_pos`` ... ``vespo_lambda_neg``."""
    if inputs.importance_sampling_level != "token":
        raise ValueError(
            "policy loss 'vespo' weighs each row by its own sequence ratio: importance_sampling_level must be "
            f"'token', got {inputs.importance_sampling_level!r}"
        )
    loss, metrics = vespo_policy_loss(
        *_tensors(inputs),
        k_pos=k_pos,
        lambda_pos=lambda_pos,
        k_neg=k_neg,
        lambda_neg=lambda_neg,
        **_aggregation(inputs),
    )
    return LossOutputs(loss, metrics)
