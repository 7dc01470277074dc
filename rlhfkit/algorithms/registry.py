"""Name → function registries, one calling signature per registry, so the RL loop picks an
algorithm's parts by name from the config and never branches on the algorithm.

- ``ADVANTAGE_ESTIMATORS``: ``f(token_rewards, response_mask, *, values, group_size, gamma, lam)
  -> (advantages (B, T), returns (B, T) or None)``. Sequence-level estimators read a sequence's
  reward as the masked sum of its token rewards (the score, plus the KL penalty when the KL is in
  the reward — the bandit formulation of the reference) and broadcast the result over its tokens.
- ``POLICY_LOSSES`` (in ``loss_registry.py``): ``f(inputs: LossInputs, *, <its knobs>) ->
  LossOutputs`` (``loss_interface.py``); each entry declares its knobs (``Hyperparameter``) beside
  its traits.
- ``KL_ESTIMATORS``: ``f(logprobs, ref_logprobs) -> (B, T)``.
- ``ROLLOUT_IS_MODES`` (in ``rollout_is.py``) and ``DPO_LOSS_TYPES`` (in ``dpo.py``): the rollout
  importance-sampling modes and the DPO-family losses, registered beside their formulas.

Each entry declares what it needs as *traits* at registration (``register(name, **traits)``, read
with ``traits(name)``); the config checks read them, so a new estimator is one entry here and
nothing else names it. Every entry of a registry declares the same trait keys:

- advantage estimators: ``needs_groups`` (a baseline from the other G-1 samples of its prompt:
  group_size >= 2), ``needs_values`` (values from a critic), ``gives_returns`` (returns a critic
  can learn from), ``sequence_level`` (one reward per sequence, the bandit formulation);
- policy losses: ``importance_sampling_levels`` and ``zero_at_zero_advantage`` (``loss_registry.py``);
- KL estimators: ``loss_gradient`` — the divergence whose gradient the estimator's gradient
  follows when it is put in the loss (None: it cannot go in the loss), and ``why_not_in_loss``;
- rollout IS modes: ``level`` ("token" or "sequence": whose ratio weighs a token) and ``masks``
  (rejected tokens leave the mask, so the kept tokens must be known before the update);
- DPO losses: ``reference`` (needs the reference log-probs), ``length_normalised`` (log-probs per
  token: needs the completion lengths) and ``smoothing`` (takes ``label_smoothing``).

Rows whose response mask is empty are absent: an estimator leaves them out of every statistic
(group mean and std, batch mean, whitening) and gives them advantage 0. The trainer masks out the
samples no reward function scored this way.

A new algorithm is a preset plus, at most, one new entry here.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import torch

from . import advantages as adv
from ._checks import check_mask, masked_sum
from .kl import kl_penalty


class Registry:
    """A dict of named functions that all share one signature.

    ``register`` refuses a name used twice and a function whose signature does not fit;
    ``get`` on a missing name raises a ``KeyError``-free ``ValueError`` listing the valid names.
    """

    def __init__(
        self, kind: str, positional: tuple[str, ...], keywords: tuple[str, ...] = (), traits: tuple[str, ...] = ()
    ):
        self.kind, self.positional, self.keywords, self.trait_names = kind, positional, keywords, traits
        self._entries: dict[str, Callable] = {}
        self._traits: dict[str, dict] = {}

    def register(self, name: str, **traits) -> Callable[[Callable], Callable]:
        """Decorator adding ``fn`` under ``name`` with its ``traits`` (exactly the registry's trait keys)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if set(traits) != set(self.trait_names):
            missing, extra = sorted(set(self.trait_names) - set(traits)), sorted(set(traits) - set(self.trait_names))
            raise ValueError(
                f"{self.kind} {name!r} must declare the traits {list(self.trait_names)} "
                f"(missing {missing}, unknown {extra})"
            )

        def decorator(fn: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._check_signature(name, fn)
            self._entries[name] = fn
            self._traits[name] = dict(traits)
            return fn

        return decorator

    def traits(self, name: str) -> dict:
        """What the entry ``name`` declared at registration (a copy); unknown names as in ``get``."""
        self.get(name)
        return dict(self._traits[name])

    def _check_signature(self, name: str, fn: Callable) -> None:
        code = getattr(fn, "__code__", None)
        if code is None:
            raise ValueError(f"{self.kind} {name!r} must be a plain function, got {type(fn).__name__}")
        names = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
        if names[: len(self.positional)] != list(self.positional):
            raise ValueError(
                f"{self.kind} {name!r} must take ({', '.join(self.positional)}) first, got ({', '.join(names)})"
            )
        takes_any = bool(code.co_flags & 0x08)  # CO_VARKEYWORDS: the function has **kwargs
        missing = [k for k in self.keywords if k not in names and not takes_any]
        if missing:
            raise ValueError(f"{self.kind} {name!r} must accept keyword(s) {missing}")

    def get(self, name: str) -> Callable:
        if name not in self._entries:
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._entries))}."
                f"{did_you_mean(name, self._entries)}"
            )
        return self._entries[name]

    def unregister(self, name: str) -> None:
        """Remove the entry ``name`` (one a test or a plugin registered); unknown names as in ``get``."""
        self.get(name)
        del self._entries[name], self._traits[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self):
        """The names in registration order (the order the docs list them in), so a registry reads
        like the tuple of its names: ``', '.join(REGISTRY)``, ``set(REGISTRY)``."""
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


def did_you_mean(name, choices) -> str:
    """The hint every unknown-name error of rlhfkit ends with: ``" Did you mean 'a', 'b'?"`` for
    up to three of ``choices`` close to ``name`` (``difflib``), or ``""`` when none is."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=3)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


ADVANTAGE_ESTIMATORS = Registry(
    "advantage estimator",
    ("token_rewards", "response_mask"),
    ("values", "group_size", "gamma", "lam", "reduce"),
    traits=("needs_groups", "needs_values", "gives_returns", "sequence_level"),
)
KL_ESTIMATORS = Registry("KL estimator", ("logprobs", "ref_logprobs"), traits=("loss_gradient", "why_not_in_loss"))


def sequence_rewards(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) total reward of each sequence: the masked sum of its token rewards."""
    return masked_sum(token_rewards, check_mask(response_mask, token_rewards.shape), dim=-1)


def _bandit(estimate: Callable[..., torch.Tensor]) -> Callable:
    """Wrap a (B,) → (B,) estimator ``estimate(rewards, group_size, valid, reduce, eps)`` into the
    token-level registry signature; ``valid`` marks the rows with a response (an empty row is
    absent)."""

    def estimator(
        token_rewards, response_mask, *, values=None, group_size=1, gamma=1.0, lam=1.0, reduce=None, eps=1e-6
    ):
        mask = check_mask(response_mask, token_rewards.shape)
        seq = estimate(sequence_rewards(token_rewards, mask), group_size, mask.any(dim=-1), reduce, eps)
        return adv.broadcast_sequence_advantages(seq, mask), None

    return estimator


_SEQUENCE = dict(needs_values=False, gives_returns=False, sequence_level=True)


@ADVANTAGE_ESTIMATORS.register("gae", needs_groups=False, needs_values=True, gives_returns=True, sequence_level=False)
def _gae(token_rewards, response_mask, *, values=None, group_size=1, gamma=1.0, lam=0.95, reduce=None, eps=1e-6):
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values from a critic (values=None was given)")
    return adv.gae(token_rewards, values, response_mask, gamma, lam)


# Groups never span processes, so the group estimators need no reduce; the batch mean and std do.
ADVANTAGE_ESTIMATORS.register("group", needs_groups=True, **_SEQUENCE)(
    _bandit(lambda r, g, valid, reduce, eps: adv.group_advantages(r, g, scale="std", eps=eps, valid=valid))
)
ADVANTAGE_ESTIMATORS.register("group_no_std", needs_groups=True, **_SEQUENCE)(
    _bandit(lambda r, g, valid, reduce, eps: adv.group_advantages(r, g, scale="none", valid=valid))
)
ADVANTAGE_ESTIMATORS.register("group_batch_std", needs_groups=True, **_SEQUENCE)(
    _bandit(lambda r, g, valid, reduce, eps: adv.group_batch_std_advantages(r, g, eps=eps, valid=valid, reduce=reduce))
)
ADVANTAGE_ESTIMATORS.register("rloo", needs_groups=True, **_SEQUENCE)(
    _bandit(lambda r, g, valid, reduce, eps: adv.rloo_advantages(r, g, valid=valid))
)
ADVANTAGE_ESTIMATORS.register("rloo_standardized", needs_groups=True, **_SEQUENCE)(
    _bandit(
        lambda r, g, valid, reduce, eps: adv.standardize(
            adv.rloo_advantages(r, g, valid=valid), valid, eps=eps, reduce=reduce
        )
    )
)
ADVANTAGE_ESTIMATORS.register("batch_standardized", needs_groups=False, **_SEQUENCE)(
    _bandit(lambda r, g, valid, reduce, eps: adv.standardize(r, valid, eps=eps, reduce=reduce))
)
ADVANTAGE_ESTIMATORS.register("reinforce", needs_groups=False, **_SEQUENCE)(
    _bandit(lambda r, g, valid, reduce, eps: adv.reinforce_advantages(r, "batch_mean", valid=valid, reduce=reduce))
)


@ADVANTAGE_ESTIMATORS.register(
    "reinforce_plus_plus", needs_groups=False, needs_values=False, gives_returns=True, sequence_level=False
)
def _reinforce_pp(
    token_rewards, response_mask, *, values=None, group_size=1, gamma=1.0, lam=1.0, reduce=None, eps=1e-6
):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): token-level discounted returns of the shaped
    rewards, whitened over the whole batch (a global baseline, no critic, no groups)."""
    zeros = torch.zeros_like(token_rewards)
    _, returns = adv.gae(token_rewards, zeros, response_mask, gamma, 1.0)
    tokens = check_mask(response_mask, token_rewards.shape).sum()
    if int(tokens if reduce is None else reduce(tokens)) < 2:  # no batch to whiten over: no signal
        return zeros, returns
    return adv.whiten(returns, response_mask, reduce=reduce), returns


def _kl_entry(name: str) -> Callable:
    def estimator(logprobs, ref_logprobs):
        return kl_penalty(logprobs, ref_logprobs, name)

    estimator.__doc__ = f"KL estimator {name} (see ``kl_penalty``)."
    return estimator


# In the loss, the gradient of E_π[k(x)] is taken through the sampled log-probs only (the samples
# are fixed). With log r = log ref - log π: k1's gradient E_π[∇log π] = 0 (the penalty does
# nothing); k2's E_π[(log π - log ref) ∇log π] = ∇KL(π‖ref) exactly; k3's
# E_π[(1 - ref/π) ∇log π] = -Σ ref ∇log π = ∇KL(ref‖π); abs's E_π[sign(log π - log ref) ∇log π]
# is the gradient of no divergence.
_KL_TRAITS: dict[str, dict[str, str | None]] = {
    "k1": dict(loss_gradient=None, why_not_in_loss="is zero in expectation, so the penalty would do nothing"),
    "k2": dict(loss_gradient="KL(π‖ref)", why_not_in_loss=""),
    "k3": dict(loss_gradient="KL(ref‖π)", why_not_in_loss=""),
    "abs": dict(loss_gradient=None, why_not_in_loss="follows no divergence"),
}
for _name, _traits in _KL_TRAITS.items():
    KL_ESTIMATORS.register(_name, **_traits)(_kl_entry(_name))
