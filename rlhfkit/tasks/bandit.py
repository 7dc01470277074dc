"""A sequence bandit with a known optimum, trained through the same advantage estimators and
policy losses as the RL loop — the smallest proof that the algorithm core learns.

The "language model" is a table of logits, one row per position: ``T`` independent choices among
``V`` tokens. The reward is the fraction of positions that match a hidden target sequence, so the
optimal policy puts all its mass on the target and the best mean reward is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    LossInputs,
    selective_logprobs,
    token_level_rewards,
    value_loss,
    whiten,
)
from ..config import PRESETS

# Four algorithms of docs/architecture.md ("Presets"), trained with their RL-loop presets (config.PRESETS).
BANDIT_PRESETS = ("ppo", "grpo", "reinforce", "rloo")


@dataclass(frozen=True)
class BanditResult:
    algorithm: str
    reward_start: float
    reward_end: float
    optimal: bool


def train_bandit(
    algorithm: str,
    steps: int = 60,
    positions: int = 4,
    vocab: int = 6,
    prompts: int = 4,
    group_size: int = 4,
    lr: float = 0.5,
    kl_coef: float = 0.01,
    seed: int = 0,
) -> BanditResult:
    """Train a tabular softmax policy with ``algorithm``'s estimator and loss; report the mean
    reward of the first and last steps and whether the greedy policy is the optimum."""
    if algorithm not in BANDIT_PRESETS:
        raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(BANDIT_PRESETS)}")
    preset = PRESETS[algorithm]
    estimator, loss_name, agg = preset["advantage_estimator"], preset["policy_loss"], preset["loss_agg"]
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(vocab, (positions,), generator=gen)
    logits = torch.zeros(positions, vocab, requires_grad=True)
    ref_logits = torch.zeros(positions, vocab)
    critic = torch.zeros(positions, requires_grad=True)
    opt = torch.optim.Adam([logits, critic], lr=lr)
    batch = prompts * group_size
    mask = torch.ones(batch, positions, dtype=torch.bool)
    rewards_seen = []
    for _ in range(steps):
        with torch.no_grad():
            probs = torch.softmax(logits, -1).expand(batch, -1, -1)
            tokens = torch.multinomial(probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, positions)
            scores = (tokens == target).float().mean(-1)
            old = selective_logprobs(logits.expand(batch, -1, -1), tokens)
            ref = selective_logprobs(ref_logits.expand(batch, -1, -1), tokens)
            kl = KL_ESTIMATORS.get("k1")(old, ref) if preset["kl_in_reward"] else None
            rewards = token_level_rewards(scores, kl, mask, kl_coef)
            values = critic.detach().expand(batch, -1)
            adv, returns = ADVANTAGE_ESTIMATORS.get(estimator)(
                rewards, mask, values=values, group_size=group_size, gamma=1.0, lam=0.95
            )
            if preset["whiten_advantages"]:
                adv = whiten(adv, mask)
        rewards_seen.append(float(scores.mean()))
        new = selective_logprobs(logits.expand(batch, -1, -1), tokens)
        loss = POLICY_LOSSES.get(loss_name)(LossInputs(new, old, adv, mask, agg)).loss  # its knobs' defaults
        if returns is not None:
            v_loss, _ = value_loss(critic.expand(batch, -1), values, returns, mask)
            loss = loss + 0.5 * v_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    optimal = bool((logits.argmax(-1) == target).all())
    start, end = sum(rewards_seen[:5]) / 5, sum(rewards_seen[-5:]) / 5
    return BanditResult(algorithm, start, end, optimal)
