"""Phase 3 of the RL loop (generate → **score** → make experience → update): the reward sources on
the completions in TRL's form, then the outcome scores shaped for the advantages."""

from __future__ import annotations

import json

import torch

from .. import distributed
from ..agents.agent import episode_lengths, reward_inputs, scored
from ..algorithms import group_normalized_sum
from ..data.encode import warn_once
from ..rewards import RewardFunctions
from ..rollout import Rollout, decode_completions
from .advantages import ScoreShaping, shape_scores


def score(
    rows: list[dict],
    rollout: Rollout,
    rewards: RewardFunctions,
    tokenizer,
    group_size: int,
    shaping: ScoreShaping,
    episodes=None,
    trainer_state=None,
):
    """Phase 3: reward functions / models on the completions, then the EOS trick, clipping and
    normalisation. Samples no function scored are masked out (``valid``).

    ``rows``: the dataset rows of the step's prompts, one per prompt (their columns other than
    ``prompt`` reach the reward functions); the rollout holds ``group_size`` completions of
    each, in order; ``shaping``: the config's score-shaping fields; ``trainer_state``: the
    ``rewards.calling.TrainingState`` the functions receive. Returns ``(scores, valid, metrics,
    completions, raw_scores, extra)``: the shaped (B,) scores, which samples were scored,
    ``reward/*`` metrics and what the functions passed to ``log_metric`` (averaged) over every
    process of the role, the completions as the functions received them, the sources' weighted
    total before shaping and the functions' ``log_extra`` columns (what ``samples.jsonl`` records).

    The functions get TRL's contract (``reward_call``): ``prompts`` as given, the completions in
    TRL's form, every column, ``completion_ids``, ``trainer_state``, ``log_metric``, ``log_extra``;
    for agent ``episodes`` (``rlhfkit.agents``, one per row of the rollout) also ``environments=``;
    an episode a tool call timed out in is unscored (``agents.agent.scored``), and the overlong
    punishment reads each episode's ``length`` (what its budget counted: tool suffixes too).

    Formulas: ``rlhfkit/algorithms/shaping.py`` (the EOS trick) and ``algorithms/advantages.py``
    (whitening), through ``rl.advantages.shape_scores``; the weighted total in
    ``rewards/functions.py``."""
    data = [row for row in rows for _ in range(group_size)]
    out, completions = reward_call(rewards, data, rollout, tokenizer, episodes, trainer_state)
    metrics: dict[str, torch.Tensor | float] = {}
    for name, v in out.per_function.items():
        metrics[f"reward/{name}_mean"], metrics[f"reward/{name}_std"] = nan_mean_std(v)
    metrics.update(logged_metrics(out.metrics))
    valid = out.valid.to(rollout.has_eos.device)
    lengths = rollout.response_mask.sum(-1)
    if episodes is not None:
        valid, lengths = valid & scored(episodes).to(valid.device), episode_lengths(episodes).to(lengths.device)
    if not bool(distributed.reduce_sum(valid.sum()) > 0):  # a run whose rewards never score trains nothing
        warn_once(
            f"no reward source scored any of the {int(distributed.reduce_sum(torch.tensor(len(valid))))} "
            "completions of this step (every reward function returned None): they train nothing"
        )
    scores, score_metrics = shape_scores(
        out.scores.to(rollout.has_eos.device),
        valid,
        rollout.has_eos,
        shaping,
        reduce=distributed.reduce_sum,
        lengths=lengths,
    )
    metrics.update(score_metrics)  # reward/mean, reward/std: of the weighted sum, whatever the aggregation
    if shaping.reward_aggregation == "normalize_then_sum":  # GDPO: each function normalised in its group first
        per_function = torch.stack([out.per_function[n] for n in rewards.names], -1).to(scores.device)
        weights = torch.tensor(rewards.weights, dtype=per_function.dtype, device=per_function.device)
        combined = group_normalized_sum(per_function, weights, group_size, shaping.advantage_epsilon)
        scores = torch.where(valid, torch.nan_to_num(combined, nan=0.0), torch.zeros_like(combined))
    return scores, valid, metrics, completions, out.scores, out.extra


def reward_call(
    rewards: RewardFunctions, data: list[dict], rollout: Rollout, tokenizer, episodes=None, trainer_state=None
):
    """``rewards`` on the rollout of ``data`` (one dataset row per rollout row), as TRL's
    ``GRPOTrainer`` calls its reward functions: ``prompts`` as the rows give them, the completions
    in TRL's form (``completions``), every other column, ``completion_ids`` (``completion_ids``)
    and ``trainer_state``; with agent ``episodes`` each completion is the episode's messages and
    ``environments=`` their environments. Returns ``(RewardOutput, completions)``."""
    prompts = [d["prompt"] for d in data]
    columns = {k: [d.get(k) for d in data] for k in data[0] if k != "prompt"}
    ids = completion_ids(rollout)
    if episodes is None:
        completions = completions_in(prompts, decode_completions(rollout, tokenizer))
    else:
        completions, columns["environments"] = reward_inputs(episodes)
        ids = [e.completion_ids for e in episodes]  # a rewritten history: the conversation as last seen
    return rewards(prompts, completions, columns, ids, trainer_state), completions


def nan_mean_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and the unbiased standard deviation of the numbers of ``x`` (NaN: unscored, left out)
    over every process of the role; NaN where nothing (the std: fewer than two) is a number."""
    ok = ~torch.isnan(x)
    xs = torch.where(ok, x, 0.0).double()
    total = distributed.reduce_sum(torch.stack([xs.sum(), ok.sum().double(), xs.square().sum()]))
    n = total[1]
    mean = total[0] / n if bool(n > 0) else torch.tensor(float("nan"), dtype=torch.float64)
    var = (total[2] - n * mean.square()) / (n - 1) if bool(n > 1) else torch.tensor(float("nan"), dtype=torch.float64)
    return mean.float(), var.clamp(min=0).sqrt().float()


def completions_in(prompts: list, texts: list[str]) -> list:
    """Decoded completions as TRL passes them: text for a text prompt; for a conversational one
    (chat messages) the one assistant message ``[{"role": "assistant", "content": text}]``."""
    return [t if isinstance(p, str) else [{"role": "assistant", "content": t}] for p, t in zip(prompts, texts)]


def completion_ids(rollout: Rollout) -> list[list[int]]:
    """Each row's sampled completion as token ids, without padding: up to and including the EOS
    (TRL's ``completion_ids``); for an agent episode its whole response region (sampled tokens and
    tool results) — ``Episode.completion_ids``, which for a history the template rewrote is the
    conversation after the prompt as the model saw it in its last turn."""
    lengths = rollout.attention_mask[:, rollout.prompt_len :].sum(-1).tolist()
    return [ids[:n] for ids, n in zip(rollout.response_ids.tolist(), lengths)]


def logged_metrics(logged: dict[str, list[float]], prefix: str = "") -> dict[str, float]:
    """What reward functions passed to ``log_metric``: each name's values averaged over the calls
    of every process of the role (TRL's average; processes that logged nothing for a name do not
    count). Every process runs this, with the names any of them logged."""
    names = sorted(logged) if distributed.role_size() == 1 else _names_everywhere(logged)
    if not names:
        return {}
    totals = distributed.sum_floats([x for n in names for x in (sum(logged.get(n, [])), len(logged.get(n, [])))])
    return {prefix + n: totals[2 * i] / totals[2 * i + 1] for i, n in enumerate(names)}


def _names_everywhere(logged: dict) -> list[str]:
    """The sorted union of the metric names of every process (each process's names as bytes in its
    row of a zero matrix, summed over the processes: an all-gather by ``reduce_sum``)."""
    mine = json.dumps(sorted(logged)).encode()
    rows = torch.zeros(distributed.role_size(), distributed.reduce_max(len(mine)), dtype=torch.float64)
    rows[distributed.role_rank(), : len(mine)] = torch.tensor(list(mine), dtype=torch.float64)
    names: set[str] = set()
    for row in distributed.reduce_sum(rows).long().tolist():
        names.update(json.loads(bytes(b for b in row if b).decode()))
    return sorted(names)
