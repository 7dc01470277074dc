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
        return LossOutputs(loss_mat, metrics)  # the per-token loss, (B, T)

trained with ``RLConfig(policy_loss="mine", loss_options={"tau": 0.5})``.

The rollout correction is the registry's, not the loss's: a loss returns its per-token loss and the
entry multiplies it by the correction's weights and aggregates it (``losses.corrected_loss``, with
``inputs.agg``, or the loss's declared ``aggregation`` when that is None), so no loss can drop the
weights — the loss never sees them. A loss that must apply them itself (VESPO folds them into its
sequence ratio) registers with ``applies_correction=True``: it gets ``inputs.weights`` and returns the
aggregated scalar.

A loss in the user's own module is named by its path, ``policy_loss="my_pkg.losses:my_loss"`` (in
YAML and on the command line alike, as prime-rl names them): ``get``, ``traits`` and
``hyperparameters`` (so ``check_loss_options`` and the loop) import the module, which may register
the function under any name (``@POLICY_LOSSES.register(...)``); a function it did not register is
registered under its path with the safe traits (token level, ``zero_at_zero_advantage=False``, no knobs).

Traits: ``importance_sampling_levels`` (the levels of ``importance_sampling_level`` the loss takes:
a loss without an importance ratio takes "token" only), ``zero_at_zero_advantage`` (True: a row
whose advantage is 0 on every token has no gradient, as when the per-token loss is a multiple of
the advantage; the update may then leave such rows out, ``skip_zero_gradient_rows``) and
``applies_correction`` (``register``'s keyword, False by default: the loss weighs its tokens by the
rollout correction itself, so the config refuses token filters with it).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable

import torch

from .loss_interface import Hyperparameter, LossInputs, LossOutputs, resolve_hyperparameters
from .losses import AGGREGATIONS, corrected_loss
from .policy_losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    cispo_token_loss,
    pg_token_loss,
    ppo_token_loss,
    sapo_token_loss,
    vespo_policy_loss,
)
from .registry import Registry


class PolicyLossRegistry(Registry):
    """The policy losses: ``f(inputs: LossInputs, *, <its knobs>) -> LossOutputs``. Besides its
    traits, an entry declares its knobs, ``hyperparameters=(Hyperparameter(...), ...)``: exactly its
    keyword-only arguments (their defaults are the declarations'). ``get`` returns the entry with
    the declared defaults filled in, so ``POLICY_LOSSES.get(name)(inputs)`` runs any loss alone."""

    def __init__(self):
        super().__init__(
            "policy loss",
            ("inputs",),
            traits=("importance_sampling_levels", "zero_at_zero_advantage", "applies_correction"),
        )
        self._hyperparameters: dict[str, tuple[Hyperparameter, ...]] = {}
        self._paths: dict[str, str] = {}  # "module:function" -> the name its function is registered under

    def register(
        self,
        name: str,
        *,
        hyperparameters=(),
        applies_correction: bool = False,
        aggregation: str = "token-mean",
        **traits,
    ) -> Callable[[Callable], Callable]:
        """Decorator adding the loss ``fn`` under ``name`` with its ``traits`` and ``hyperparameters``.
        ``fn`` returns its per-token loss, which the entry weighs by the rollout correction and
        aggregates (``aggregation``: the mode when ``inputs.agg`` is None); ``applies_correction``:
        ``fn`` gets ``inputs.weights`` and returns the aggregated scalar itself."""
        add = super().register(name, applies_correction=applies_correction, **traits)
        declared = tuple(hyperparameters)
        if not all(isinstance(h, Hyperparameter) for h in declared):
            raise ValueError(f"policy loss {name!r}: hyperparameters must be Hyperparameter(...) declarations")
        names = [h.name for h in declared]
        if len(set(names)) != len(names):
            raise ValueError(f"policy loss {name!r} declares a hyperparameter twice: {names}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"policy loss {name!r}: aggregation must be one of {', '.join(AGGREGATIONS)}")

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
                if applies_correction:
                    return fn(inputs, **{**defaults, **knobs})
                out = fn(dataclasses.replace(inputs, weights=None), **{**defaults, **knobs})
                return LossOutputs(_corrected(name, out.loss, inputs, aggregation), out.metrics)

            functools.update_wrapper(entry, fn)
            add(entry)
            self._hyperparameters[name] = declared
            return fn

        return decorator

    def _check_signature(self, name: str, fn: Callable) -> None:
        super()._check_signature(name, getattr(fn, "__wrapped__", fn))

    def resolve(self, name: str) -> str:
        """The registered name ``name`` stands for: itself, or for a ``"module:function"`` path the
        name its function is registered under, the module imported first (it may register it) and the
        function registered under the path when it did not. One ``ValueError`` line naming
        ``policy_loss`` when the module cannot be imported or has no such function."""
        if not isinstance(name, str) or name in self._entries or ":" not in name:
            return name
        if name not in self._paths:
            self._paths[name] = self._load(name)
        return self._paths[name]

    def _load(self, path: str) -> str:
        module_name, _, fn_name = path.partition(":")
        if not module_name or not fn_name.isidentifier():
            raise ValueError(f"policy_loss {path!r}: a loss named by path is 'module:function' (my_pkg.losses:my_loss)")
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # the user's module: whatever its import raises is told in one line
            why = (str(err).splitlines() or [""])[0]
            raise ValueError(
                f"policy_loss {path!r}: cannot import the module {module_name!r} ({type(err).__name__}: {why})"
            ) from None
        if path in self._entries:  # the module registered the loss under its path
            return path
        fn = getattr(module, fn_name, None)
        if not callable(fn):
            raise ValueError(f"policy_loss {path!r}: the module {module_name!r} has no function {fn_name!r}")
        for registered, entry in self._entries.items():
            if getattr(entry, "__wrapped__", entry) is fn:
                return registered
        self.register(path, importance_sampling_levels=("token",), zero_at_zero_advantage=False)(fn)
        return path

    def get(self, name: str) -> Callable:
        """The entry of ``name`` (a registered name, or a ``"module:function"`` path: ``resolve``)."""
        return super().get(self.resolve(name))

    def traits(self, name: str) -> dict:
        return super().traits(self.resolve(name))

    def unregister(self, name: str) -> None:
        """Remove the loss ``name`` and its declared knobs (one a test or a plugin registered), and the
        paths that named it; a path naming a loss registered under another name forgets the path alone."""
        if self._paths.get(name, name) != name:
            del self._paths[name]
            return
        super().unregister(name)
        del self._hyperparameters[name]
        self._paths = {path: target for path, target in self._paths.items() if target != name}

    def hyperparameters(self, name: str) -> tuple[Hyperparameter, ...]:
        """The knobs the loss ``name`` declared at registration; unknown names as in ``get``."""
        name = self.resolve(name)
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
    values = _resolve(policy_loss, config, _elsewhere(POLICY_LOSSES.resolve(policy_loss)))
    filled: frozenset[str] = getattr(config, "preset_filled", frozenset())
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


def _corrected(name: str, loss: torch.Tensor, inputs: LossInputs, aggregation: str) -> torch.Tensor:
    """The per-token ``loss`` of the policy loss ``name`` weighed by the rollout correction and aggregated
    (``corrected_loss``); a loss of another shape is refused in one line."""
    if tuple(loss.shape) != tuple(inputs.logprobs.shape):
        raise ValueError(
            f"policy loss {name!r} returned a loss of shape {tuple(loss.shape)}: a loss returns its per-token loss, "
            f"shape {tuple(inputs.logprobs.shape)} (the rollout correction and the aggregation are applied around "
            "it), or is registered with applies_correction=True and weighs it by inputs.weights itself"
        )
    return corrected_loss(loss, inputs.response_mask, inputs.weights, inputs.agg or aggregation, inputs.horizon)


def _tensors(inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.response_mask


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
    """PPO's clipped surrogate per token; ``importance_sampling_level="sequence"`` is GSPO (``ppo_policy_loss``)."""
    loss_mat, metrics = ppo_token_loss(
        *_tensors(inputs),
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        importance_sampling_level=inputs.importance_sampling_level,
    )
    return LossOutputs(loss_mat, metrics)


@POLICY_LOSSES.register(
    "vanilla", importance_sampling_levels=("token",), zero_at_zero_advantage=True, aggregation="seq-mean-token-sum"
)
def _vanilla(inputs: LossInputs) -> LossOutputs:
    """Plain policy gradient per token (``pg_loss``), by default ``agg="seq-mean-token-sum"``. It has no
    importance ratio, so ``importance_sampling_level`` can only be "token"."""
    if inputs.importance_sampling_level != "token":
        raise ValueError(
            f"policy loss 'vanilla' has no importance ratio: importance_sampling_level must be "
            f"'token', got {inputs.importance_sampling_level!r}"
        )
    return LossOutputs(*pg_token_loss(*_tensors(inputs)))


@POLICY_LOSSES.register(
    "cispo",
    importance_sampling_levels=IMPORTANCE_SAMPLING_LEVELS,
    zero_at_zero_advantage=True,
    hyperparameters=(_CISPO_CAP,),
)
def _cispo(inputs: LossInputs, *, clip_high) -> LossOutputs:
    """CISPO per token (``cispo_policy_loss``): the ratio capped at ``1 + clip_high``. It reads no ``clip_low``
    (the paper sets no lower bound on the weight) and no ``dual_clip`` (a capped weight needs none)."""
    loss_mat, metrics = cispo_token_loss(
        *_tensors(inputs), clip_high=clip_high, importance_sampling_level=inputs.importance_sampling_level
    )
    return LossOutputs(loss_mat, metrics)


@POLICY_LOSSES.register(
    "sapo",
    importance_sampling_levels=IMPORTANCE_SAMPLING_LEVELS,
    zero_at_zero_advantage=True,
    aggregation="seq-mean-token-mean",
    hyperparameters=(
        Hyperparameter("temperature_pos", 1.0, "the gate's temperature where the advantage is > 0", "> 0"),
        Hyperparameter("temperature_neg", 1.05, "the gate's temperature where the advantage is <= 0", "> 0"),
    ),
)
def _sapo(inputs: LossInputs, *, temperature_pos, temperature_neg) -> LossOutputs:
    """SAPO's soft gate per token (``sapo_policy_loss``), by default per sequence (``seq-mean-token-mean``);
    TRL's ``sapo_temperature_pos`` / ``sapo_temperature_neg``."""
    loss_mat, metrics = sapo_token_loss(
        *_tensors(inputs),
        temperature_pos=temperature_pos,
        temperature_neg=temperature_neg,
        importance_sampling_level=inputs.importance_sampling_level,
    )
    return LossOutputs(loss_mat, metrics)


@POLICY_LOSSES.register(
    "vespo",
    importance_sampling_levels=("token",),
    zero_at_zero_advantage=True,
    applies_correction=True,  # the weights fold into the sequence ratio, not multiply the loss
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
    ``importance_sampling_level`` can only be "token", and folds the rollout correction's weights into
    that ratio (``applies_correction``); TRL's ``vespo_k_pos`` ... ``vespo_lambda_neg``."""
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
        agg=inputs.agg or "token-mean",  # None: the formula's own default
        horizon=inputs.horizon,
        weights=inputs.weights,
    )
    return LossOutputs(loss, metrics)
