"""Name → function registries, one calling signature per registry, so the RL loop picks an
algorithm's parts by name from the config and never branches on the algorithm.

- ``ADVANTAGE_ESTIMATORS``: ``f(token_rewards, response_mask, *, values, group_size, gamma, lam)
  -> (advantages (B, T), returns (B, T) or None)``. Sequence-level estimators read a sequence's
  reward as the masked sum of its token rewards (the score, plus the KL penalty when the KL is in
  the reward — the bandit formulation of the reference) and broadcast the result over its tokens.
- ``POLICY_LOSSES``: ``f(logprobs, old_logprobs, advantages, response_mask, *, agg, horizon,
  clip_low, clip_high, dual_clip) -> (loss, metrics)``.
- ``KL_ESTIMATORS``: ``f(logprobs, ref_logprobs) -> (B, T)``.

A new algorithm is a preset plus, at most, one new entry here.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import advantages as adv
from ._checks import check_mask, masked_sum
from .kl import kl_penalty
from .losses import pg_loss, ppo_policy_loss


class Registry:
    """A dict of named functions that all share one signature.

    ``register`` refuses a name used twice and a function whose signature does not fit;
    ``get`` on a missing name raises a ``KeyError``-free ``ValueError`` listing the valid names.
    """

    def __init__(self, kind: str, positional: tuple[str, ...], keywords: tuple[str, ...] = ()):
        self.kind, self.positional, self.keywords = kind, positional, keywords
        self._entries: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def decorator(fn: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._check_signature(name, fn)
            self._entries[name] = fn
            return fn

        return decorator

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
            close = sorted((d, n) for n in self._entries if (d := _edit_distance(str(name), n)) <= max(2, len(n) // 3))
            hint = f" Did you mean {', '.join(repr(n) for _, n in close[:3])}?" if close else ""
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._entries))}.{hint}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions), for "did you mean" hints."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


ADVANTAGE_ESTIMATORS = Registry(
    "advantage estimator", ("token_rewards", "response_mask"), ("values", "group_size", "gamma", "lam")
)
POLICY_LOSSES = Registry(
    "policy loss",
    ("logprobs", "old_logprobs", "advantages", "response_mask"),
    ("agg", "horizon", "clip_low", "clip_high", "dual_clip"),
)
KL_ESTIMATORS = Registry("KL estimator", ("logprobs", "ref_logprobs"))


def sequence_rewards(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) total reward of each sequence: the masked sum of its token rewards."""
    return masked_sum(token_rewards, check_mask(response_mask, token_rewards.shape), dim=-1)


def _bandit(estimate: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable:
    """Wrap a (B,) → (B,) estimator into the token-level registry signature."""

    def estimator(token_rewards, response_mask, *, values=None, group_size=1, gamma=1.0, lam=1.0):
        seq = estimate(sequence_rewards(token_rewards, response_mask), group_size)
        return adv.broadcast_sequence_advantages(seq, response_mask), None

    return estimator


@ADVANTAGE_ESTIMATORS.register("gae")
def _gae(token_rewards, response_mask, *, values=None, group_size=1, gamma=1.0, lam=0.95):
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values from a critic (values=None was given)")
    return adv.gae(token_rewards, values, response_mask, gamma, lam)


ADVANTAGE_ESTIMATORS.register("group")(_bandit(lambda r, g: adv.group_advantages(r, g, scale="std")))
ADVANTAGE_ESTIMATORS.register("group_no_std")(_bandit(lambda r, g: adv.group_advantages(r, g, scale="none")))
ADVANTAGE_ESTIMATORS.register("rloo")(_bandit(adv.rloo_advantages))
ADVANTAGE_ESTIMATORS.register("reinforce")(_bandit(lambda r, g: adv.reinforce_advantages(r, "batch_mean")))


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
def _reinforce_pp(token_rewards, response_mask, *, values=None, group_size=1, gamma=1.0, lam=1.0):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): token-level discounted returns of the shaped
    rewards, whitened over the whole batch (a global baseline, no critic, no groups)."""
    zeros = torch.zeros_like(token_rewards)
    _, returns = adv.gae(token_rewards, zeros, response_mask, gamma, 1.0)
    return adv.whiten(returns, response_mask), returns


@POLICY_LOSSES.register("ppo_clip")
def _ppo_clip(logprobs, old_logprobs, advantages, response_mask, *, agg="token-mean", horizon=None,
              clip_low=0.2, clip_high=0.2, dual_clip=None):
    return ppo_policy_loss(logprobs, old_logprobs, advantages, response_mask,
                           clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, agg=agg, horizon=horizon)


@POLICY_LOSSES.register("vanilla")
def _vanilla(logprobs, old_logprobs, advantages, response_mask, *, agg="seq-mean-token-sum", horizon=None,
             clip_low=None, clip_high=None, dual_clip=None):
    """Plain policy gradient; the clip arguments are accepted for the shared signature and unused."""
    return pg_loss(logprobs, old_logprobs, advantages, response_mask, agg=agg, horizon=horizon)


def _kl_entry(name: str) -> Callable:
    def estimator(logprobs, ref_logprobs):
        return kl_penalty(logprobs, ref_logprobs, name)

    estimator.__doc__ = f"KL estimator {name} (see ``kl_penalty``)."
    return estimator


for _name in ("k1", "k2", "k3", "abs"):
    KL_ESTIMATORS.register(_name)(_kl_entry(_name))
