"""Phases 1–3 of the RL loop as one batch (sample prompts → generate → score), in several rounds
under DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, §3.2; verl's
``algorithm.filter_groups``): a group whose scores are all equal has advantage 0 under every group
baseline, so it is dropped, and more prompts are drawn until the step holds ``prompts_per_step``
groups that carry a learning signal.

What is filtered, and where the statistics come from: a group is kept when its *per-sample* scores
differ (``group_has_variance``) — the sources' total after the per-sample shaping of
``rl.advantages.shape_scores`` (the EOS trick, the overlong punishment, ``reward_clip``), before any
batch statistic. Those are the scores the advantages see, so a kept group never has zero
advantages because of its scores (a group whose raw rewards differ but that the EOS trick makes
equal is dropped; one whose raw rewards tie but whose lengths the overlong punishment tells apart is
kept). The batch-level step — ``normalize_rewards`` — is then taken over the kept batch alone
(``rl.advantages.normalize_scores``), as verl computes advantages over the kept batch. The
``reward/*`` metrics are the first round's: the policy's reward on one fresh step of prompts, as
without dynamic sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import distributed
from ..algorithms import group_has_variance
from ..data.encode import warn_once
from ..rollout import concat_rollouts
from .advantages import ScoreShaping, normalize_scores


def sample_batch(sample_round: Callable[[int], tuple], config, shaping: ScoreShaping, pad_id: int = 0) -> tuple:
    """Phases 1–3 of one step: ``sample_round(r)`` once without ``config.dynamic_sampling``; with it,
    rounds ``r = 0, 1, …`` until every process of the role holds its share (``prompts_per_step /
    role_size``) of groups with reward variance, or ``config.max_sampling_rounds`` rounds are spent.
    ``config``: ``rl.sampler.SamplerConfig`` (``group_size``, ``prompts_per_step``,
    ``dynamic_sampling``, ``max_sampling_rounds``); ``shaping``: the kept batch's ``normalize_rewards``.

    ``sample_round(r)``: the next ``prompts_per_step`` prompts (this process's share of their row
    indices), their ``group_size`` completions each and their scores — ``(rows, rollout, scores,
    valid, metrics)`` — on every process alike (it runs collectives). Every process runs the same
    number of rounds: the stopping test is on counts summed over the processes.

    Returns the same tuple for the step: the kept groups of this process in the order they were
    drawn, the first ``share`` of them; scores normalised over the kept batch of every process
    (``normalize_rewards``). Processes must train equally many rows (the update draws its
    minibatches from the global batch), so when the rounds run out a process that kept fewer groups
    than another fills up with groups it dropped, marked invalid (no statistic, no gradient); when
    no process kept any, the step is one invalid group per process (the trainer skips its update).
    ``metrics``: the first round's, plus ``rollout/sampling_rounds`` and ``rollout/kept_groups_frac``
    (groups with variance among those generated, every process, every round)."""
    if not config.dynamic_sampling:
        return sample_round(0)
    G, share = config.group_size, config.prompts_per_step // distributed.role_size()
    rounds, first = [], None
    kept = generated = 0
    for r in range(config.max_sampling_rounds):
        rows, rollout, scores, valid, metrics = sample_round(r)
        first = metrics if first is None else first
        keep = group_has_variance(scores, valid, G).cpu()
        rounds.append((rows, rollout, scores, valid, keep))
        kept, generated = kept + int(keep.sum()), generated + len(keep)
        totals = distributed.reduce_sum(torch.tensor([min(kept, share), kept, generated], dtype=torch.float64))
        if int(totals[0]) >= config.prompts_per_step:
            break
    assert first is not None  # max_sampling_rounds >= 1: a round ran
    n_kept = min(kept, share)
    width = max(distributed.reduce_max(n_kept), 1)  # groups per process: equal on every process
    if int(totals[0]) < config.prompts_per_step:
        warn_once(
            f"dynamic sampling: {int(totals[0])} of prompts_per_step={config.prompts_per_step} groups with "
            f"reward variance after max_sampling_rounds={config.max_sampling_rounds} rounds; the step trains on those"
        )
    picks = _pick(rounds, n_kept, width - n_kept)
    rows = [rounds[i][0][g] for i, g, _ in picks]
    rollout = concat_rollouts([rounds[i][1].select(torch.arange(g * G, (g + 1) * G)) for i, g, _ in picks], pad_id)
    scores = torch.cat([rounds[i][2][g * G : (g + 1) * G] for i, g, _ in picks])
    valid = torch.cat([rounds[i][3][g * G : (g + 1) * G] & ok for i, g, ok in picks])
    scores = normalize_scores(
        torch.where(valid, scores, torch.zeros_like(scores)), valid, shaping, reduce=distributed.reduce_sum
    )
    first.update(
        {
            "rollout/sampling_rounds": float(len(rounds)),
            "rollout/kept_groups_frac": float(totals[1] / totals[2].clamp(min=1)),
        }
    )
    return rows, rollout, scores, valid, first


def _pick(rounds: list, n_kept: int, n_fill: int) -> list[tuple[int, int, bool]]:
    """``(round, group, kept)`` of the first ``n_kept`` kept groups, then of the first ``n_fill``
    dropped ones (filler, kept False)."""
    kept = [(i, g, True) for i, rnd in enumerate(rounds) for g in torch.nonzero(rnd[4]).flatten().tolist()]
    dropped = [(i, g, False) for i, rnd in enumerate(rounds) for g in torch.nonzero(~rnd[4]).flatten().tolist()]
    return kept[:n_kept] + dropped[:n_fill]
