"""Reward shaping and sample filtering: the KL penalty folded into the reward, the outcome score
placed on the last response token, the missing-EOS penalty ("EOS trick"), DAPO's pieces — the
soft overlong punishment, the dynamic-sampling group filter, truncated completions out of the loss —
and the token filters of the policy loss: the high-entropy tokens (Wang et al. 2025) and the
off-policy sequence mask (DeepSeek-V3.2); and a teacher's per-token advantage (on-policy distillation)."""

from __future__ import annotations

import numbers

import torch

from ._checks import check_groups, check_mask, check_nonempty_rows, check_tensor


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of the last unmasked position of each row (rows must be non-empty)."""
    mask = check_mask(response_mask, response_mask.shape)
    check_nonempty_rows(mask)
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    return (mask * positions).argmax(dim=-1)


def token_level_rewards(
    scores: torch.Tensor,
    kl: torch.Tensor | None,
    response_mask: torch.Tensor,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards of RLHF with the KL penalty in the reward (Ziegler et al. 2019,
    arXiv:1909.08593; Ouyang et al. 2022, eq. 2): ``r_t = -kl_coef · kl_t`` on every response
    token, plus the outcome ``score`` on the last real token (EOS, or the last one if truncated).

    Args: ``scores`` (B,), ``kl`` (B, T) or None (no KL in the reward), ``response_mask`` (B, T)
    with no empty row. Returns: (B, T), 0 on masked positions.
    """
    check_tensor("scores", scores, ndim=1)
    check_tensor("response_mask", response_mask, ndim=2)
    if response_mask.shape[0] != scores.shape[0]:
        raise ValueError(f"scores has {scores.shape[0]} rows but response_mask has shape {tuple(response_mask.shape)}")
    mask = check_mask(response_mask, response_mask.shape)
    last = last_token_index(mask)
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    if kl is None:
        rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    else:
        check_tensor("kl", kl)
        if tuple(kl.shape) != tuple(mask.shape):
            raise ValueError(f"kl must have shape {tuple(mask.shape)}, got {tuple(kl.shape)}")
        rewards = torch.where(mask, -kl_coef * kl.to(scores.dtype), zero)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] += scores
    return rewards


def teacher_token_advantages(
    logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, response_mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """On-policy distillation's per-token advantage, the sampled-token reverse KL to a teacher:
    ``A_t = -coef · (log π(y_t) - log π_T(y_t))`` on every response token, 0 elsewhere — the k1 estimate of
    KL(π‖π_T) at the token the policy sampled, negated, with no discount (Agarwal et al. 2024,
    arXiv:2306.13649, on-policy reverse KL; Lu and Thinking Machines 2025, "On-Policy Distillation": the
    per-token advantage of the policy-gradient loss). Its expectation over the policy's samples is the
    reverse KL's gradient direction; a token the teacher finds likelier than the policy does gets a positive
    advantage.

    Args: ``logprobs`` (B, T) the policy's log-probs of the sampled tokens before the update (detached),
    ``teacher_logprobs`` (B, T) the teacher's, ``response_mask`` (B, T). Returns (B, T)."""
    check_tensor("logprobs", logprobs, ndim=2)
    check_tensor("teacher_logprobs", teacher_logprobs, ndim=2)
    if logprobs.shape != teacher_logprobs.shape:
        raise ValueError(
            f"teacher_logprobs must have shape {tuple(logprobs.shape)}, got {tuple(teacher_logprobs.shape)}"
        )
    mask = check_mask(response_mask, logprobs.shape)
    advantages = -coef * (logprobs.detach() - teacher_logprobs.to(logprobs.dtype))
    return torch.where(mask, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device))


def apply_missing_eos_penalty(
    scores: torch.Tensor, has_eos: torch.Tensor, penalty: float, mode: str = "replace"
) -> torch.Tensor:
    """The EOS trick ("The N Implementation Details of RLHF with PPO", detail 23): a completion
    that never emitted EOS was cut at the length limit, so its score is not trusted.

    ``mode="replace"`` sets its score to ``penalty`` (e.g. -1); ``mode="subtract"`` subtracts
    ``penalty`` from it (TRL's ``missing_eos_penalty``). Args: ``scores`` (B,), ``has_eos`` (B,)
    bool. Returns: (B,).
    """
    check_tensor("scores", scores, ndim=1)
    has_eos = check_mask(has_eos, scores.shape, "has_eos")
    if mode == "replace":
        return torch.where(has_eos, scores, torch.full_like(scores, penalty))
    if mode == "subtract":
        return torch.where(has_eos, scores, scores - penalty)
    raise ValueError(f"mode must be 'replace' or 'subtract', got {mode!r}")


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, §3.4, eq. 13), scaled by
    ``penalty_factor`` as verl's ``overlong_buffer.penalty_factor``; with ``L_max = max_len``,
    ``L_cache = buffer_len`` and a completion of ``L`` tokens:

    - ``0`` if ``L <= L_max - L_cache``;
    - ``((L_max - L_cache) - L) / L_cache · penalty_factor`` if ``L_max - L_cache < L <= L_max``
      (from 0 down to ``-penalty_factor`` across the buffer);
    - ``-penalty_factor`` if ``L > L_max``.

    The result is added to the completion's score. Args: ``lengths`` (B,) response lengths in
    tokens (EOS included, as the response mask counts them; verl counts the same way), ``max_len``
    (the generation limit), ``buffer_len`` in ``[1, max_len]``, ``penalty_factor >= 0``. Returns
    (B,) in the lengths' floating dtype (the default dtype for integer lengths).
    """
    check_tensor("lengths", lengths, ndim=1)
    for name, value, low in (("max_len", max_len, 1), ("buffer_len", buffer_len, 1)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if buffer_len > max_len:
        raise ValueError(f"buffer_len must be at most max_len ({max_len}), got {buffer_len}")
    if not penalty_factor >= 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    length = lengths.to(lengths.dtype if lengths.dtype.is_floating_point else torch.get_default_dtype())
    expected = max_len - buffer_len
    in_buffer = (expected - length) / buffer_len
    shaped = torch.where(
        length <= expected,
        torch.zeros_like(length),
        torch.where(length <= max_len, in_buffer, torch.full_like(length, -1.0)),
    )
    return shaped * penalty_factor


def group_has_variance(scores: torch.Tensor, valid: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic-sampling filter (arXiv:2503.14476, §3.2: the constraint
    ``0 < |{o_i : is_equivalent(a, o_i)}| < G`` of the DAPO objective, generalised to any reward
    as verl's ``algorithm.filter_groups``):
    whether each group of ``group_size`` rows (rows ``g*G .. g*G+G-1`` share prompt ``g``) keeps a
    learning signal. A group whose valid scores are all equal — or that has fewer than two valid
    samples — gets advantage 0 from every group baseline and is dropped.

    Args: ``scores`` (B,), ``valid`` (B,) bool (samples a reward function scored; the others'
    scores are ignored, NaN included), ``group_size`` >= 2 dividing B. Returns (B/G,) bool: True
    for a group to keep (``.repeat_interleave(group_size)`` gives the rows).
    """
    check_tensor("scores", scores, ndim=1)
    n_groups = check_groups(scores.shape[0], group_size)
    valid = check_mask(valid, scores.shape, "valid").view(n_groups, group_size)
    grouped = scores.view(n_groups, group_size)
    inf = torch.full((), float("inf"), dtype=scores.dtype, device=scores.device)
    high = torch.where(valid, grouped, -inf).amax(dim=1)
    low = torch.where(valid, grouped, inf).amin(dim=1)
    return (valid.sum(dim=1) >= 2) & (high > low)


def mask_truncated(response_mask: torch.Tensor, has_eos: torch.Tensor) -> torch.Tensor:
    """The loss mask without the completions that never emitted EOS (cut at the length limit):
    DAPO's overlong filtering (arXiv:2503.14476, §3.4), TRL's ``mask_truncated_completions``.
    Args: ``response_mask`` (B, T), ``has_eos`` (B,) bool. Returns (B, T) bool, rows of truncated
    completions all False."""
    check_tensor("response_mask", response_mask, ndim=2)
    mask = check_mask(response_mask, response_mask.shape)
    return mask & check_mask(has_eos, mask.shape[:1], "has_eos")[:, None]


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """(B, T) bool: the tokens of ``mask`` whose entropy is at least the ``quantile`` of the entropies
    under ``mask`` (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
    Effective RL for LLM Reasoning", arXiv:2506.01939: the policy gradient on the top 20% of tokens
    by entropy, ``quantile=0.8``; TRL's ``top_entropy_quantile`` ρ is ``1 - quantile``). The quantile
    interpolates linearly (``torch.quantile``); ``quantile=0`` keeps every token, an empty mask none.
    ``entropy`` (B, T), detached by the caller when it only selects."""
    m = check_mask(mask, entropy.shape)
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    exact = entropy.to(torch.promote_types(entropy.dtype, torch.float32))  # quantile needs float32 or float64
    values = exact[m]
    if values.numel() == 0:
        return torch.zeros_like(m)
    return (exact >= torch.quantile(values, quantile)) & m


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """(B, 1) float, 0 for the sequences the loss drops: a negative advantage and a mean per-token KL
    estimate ``mean_t (log π_behaviour - log π)`` above ``threshold`` (the Off-Policy Sequence Masking
    of DeepSeek-V3.2, arXiv:2512.02556, eq. 9, its δ; TRL's ``off_policy_mask_threshold``): a sample that the
    current policy has drifted far from is learnt from only when it was good. ``advantages`` (B,) or
    (B, T) (a row's first token decides); ``behaviour_logprobs`` the sampler's (NaN counts 0)."""
    m = check_mask(mask, logprobs.shape)
    adv = advantages if advantages.dim() == 1 else advantages[:, 0]
    diff = torch.nan_to_num(behaviour_logprobs - logprobs.detach(), nan=0.0)
    kl = torch.where(m, diff, torch.zeros((), dtype=diff.dtype, device=diff.device)).sum(-1) / m.sum(-1).clamp(min=1)
    return ((adv >= 0) | (kl <= threshold)).to(logprobs.dtype)[:, None]
