"""KL estimators between the policy and the reference, KL coefficient controllers and the adaptive
entropy coefficient.

Estimators follow J. Schulman, "Approximating KL divergence" (2020, joschu.net/blog/kl-approx):
with samples ``x ~ p`` (the policy) and ``log r = log q(x) - log p(x)`` (q the reference),
k1 = ``-log r`` (unbiased, high variance, can be negative), k2 = ``0.5 (log r)^2`` (biased, low
variance), k3 = ``(r - 1) - log r`` (unbiased, always ≥ 0; GRPO's choice).
"""

from __future__ import annotations

import math

import torch

from ._checks import check_same_shape

# The bound every log-ratio is clamped to before exp() (k3 here; the importance ratios of
# policy_losses.py and rollout_is.py): beyond it exp() overflows float16/bfloat16 ranges quickly.
MAX_LOG_RATIO = 20.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate of ``KL(π || π_ref)`` at the sampled tokens.

    - ``k1``: ``log p - log q``
    - ``k2``: ``0.5 (log p - log q)^2``
    - ``k3``: ``exp(log q - log p) - (log q - log p) - 1`` (computed with expm1; log-ratio clamped to ±20)
    - ``abs``: ``|log p - log q|``

    Args: ``logprobs``, ``ref_logprobs`` of equal shape, usually (B, T). Returns: same shape.
    Masking is the caller's job (aggregate with the response mask).
    """
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    diff = logprobs - ref_logprobs
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        log_r = (-diff).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        # expm1: exp(x) - 1 - x in float32 rounds below 0 for tiny x; k3 must stay >= 0.
        return torch.expm1(log_r) - log_r
    if estimator == "abs":
        return diff.abs()
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: 'k1', 'k2', 'k3', 'abs'")


class FixedKLController:
    """A constant KL coefficient β. ``update`` is a no-op, so the loop treats both kinds alike."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """Adaptive β of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences",
    arXiv:1909.08593, §2.2): ``e = clip(KL / target - 1, -0.2, 0.2)`` and
    ``β ← β (1 + e · n_steps / horizon)``, so KL is steered towards ``target``.

    ``n_steps`` is the number of samples (or steps) since the last update; ``horizon`` sets how
    fast β moves (10,000 in the paper).
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        super().__init__(init_kl_coef)
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be > 0, got target={target}, horizon={horizon}")
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value


class AdaptiveEntropyController:
    """The adaptive entropy coefficient of Skywork-OR1 (He et al. 2025, arXiv:2505.22312, §3.2.5;
    TRL's ``use_adaptive_entropy``): after each optimizer step, with ``H`` the step's entropy (token
    mean over its micro-batches), ``coef ← min(coef + delta, max)`` when ``H <= target``, else
    ``max(coef - delta, min)``; the bonus a step applies is ``coef`` when the previous step's ``H`` was
    at most ``target``, else 0 (``applied``) — none before the first measurement."""

    def __init__(self, coef: float, target: float, delta: float, low: float = 0.0, high: float = 1.0):
        if not low <= high:
            raise ValueError(f"the entropy coefficient's bounds must satisfy min <= max, got {low} > {high}")
        self.coef, self.target, self.delta, self.low, self.high = float(coef), target, delta, low, high
        self.last_entropy = math.inf

    @property
    def applied(self) -> float:
        """The coefficient of this step's entropy bonus (gated on the last measured entropy)."""
        return self.coef if self.last_entropy <= self.target else 0.0

    def update(self, entropy: float) -> float:
        """After an optimizer step whose entropy was ``entropy``: the new coefficient."""
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last_entropy = float(entropy)
        return self.coef

    def state_dict(self) -> dict:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
