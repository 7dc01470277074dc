"""Phase 3 of the RL loop (generate → **score** → make experience → update): the reward sources on
the decoded completions, then the outcome scores shaped for the advantages."""

from __future__ import annotations

from .. import distributed
from ..agents.agent import reward_inputs
from ..rewards import RewardFunctions
from ..rollout import Rollout, decode_completions
from .advantages import ScoreShaping, shape_scores


def score(rows: list[dict], rollout: Rollout, rewards: RewardFunctions, tokenizer, group_size: int,
          shaping: ScoreShaping, episodes=None):
    """Phase 3: reward functions / models on the decoded completions, then the EOS trick,
    clipping and normalisation. Samples no function scored are masked out (``valid``).

    ``rows``: the dataset rows of the step's prompts, one per prompt (their columns other than
    ``prompt`` reach the reward functions); the rollout holds ``group_size`` completions of
    each, in order; ``shaping``: the config's score-shaping fields. Returns ``(scores, valid,
    metrics, completions, raw_scores)``: the shaped (B,) scores, which samples were scored,
    ``reward/*`` metrics over every process of the role, the decoded
    completions and the sources' weighted total before shaping (what ``samples.jsonl`` records).

    Agent ``episodes`` (``rlhfkit.agents``, one per row of the rollout): each completion is the
    episode's conversation — its assistant and tool messages, as TRL passes conversational
    completions — and the reward functions also receive ``environments=`` (None without an
    environment factory).

    Formulas: ``rlhfkit/algorithms/shaping.py`` (the EOS trick) and ``algorithms/advantages.py``
    (whitening), through ``rl.advantages.shape_scores``; the weighted total in
    ``rewards/functions.py``."""
    G = group_size
    data = [row for row in rows for _ in range(G)]
    columns = {k: [d.get(k) for d in data] for k in data[0] if k != "prompt"}
    if episodes is None:
        completions = decode_completions(rollout, tokenizer)
    else:
        completions, columns["environments"] = reward_inputs(episodes)
    out = rewards([d["prompt"] for d in data], completions, columns)
    metrics = {f"reward/{name}_mean": distributed.global_nanmean(v) for name, v in out.per_function.items()}
    valid = out.valid.to(rollout.has_eos.device)
    scores, score_metrics = shape_scores(out.scores.to(rollout.has_eos.device), valid, rollout.has_eos, shaping,
                                         reduce=distributed.reduce_sum, lengths=rollout.response_mask.sum(-1))
    metrics.update(score_metrics)
    return scores, valid, metrics, completions, out.scores

