"""Agent episodes as the rows the trainer trains on: one ``Rollout`` row per episode.

The row is ``[left padding | prompt | response region | right padding]``, the response region
being the episode's ``ids``: ``response_mask`` is 1 on the sampled tokens and 0 on everything else
(tool output, template glue, a re-rendered context), ``attention_mask`` covers every real token,
the engine's log-probs (vLLM) sit at the sampled positions.

An episode whose chat template rewrote its history (``agents.episode``) holds several *segments*:
the prompt and what followed it, then each re-rendering of the conversation and what followed it.
Its row is the segments one after another, and ``Rollout.segments`` (B, P+T) numbers each column's
segment: the trainer's forward passes run every segment as a sequence of its own
(``models.segments``: its own positions from 0, attending only to its own tokens), so every sampled
token gets its log-prob — and, for PPO, its value — in exactly the context it was sampled in, and
lies in exactly one row. Why one row per episode rather than one per segment: everything that
counts samples stays exact — group baselines (rows ``g*G .. g*G+G-1``), a sequence's mean or sum
in the loss aggregations and GSPO's sequence ratio (over all its sampled tokens), GAE across the
whole episode, dynamic sampling's groups, equal rows on every process, one ``samples.jsonl`` line —
with one score and one advantage per episode, as for any completion. ``segments`` is None when no
episode of the batch has more than one (every prefix-preserving template): the rows are then
exactly those of before segments existed.
"""

from __future__ import annotations

import torch

from ..data.padding import pad
from ..rollout.base import Rollout


def episodes_rollout(episodes: list, pad_id: int, with_logprobs: bool = True) -> Rollout:
    """The episodes (``agents.episode.Episode``) as one batch: prompts left-padded, response
    regions right-padded; ``response_mask`` on the sampled tokens, ``attention_mask`` on every real
    token, ``has_eos`` from the last turn (False for an episode the budget ended), ``logprobs``
    the engine's (None when it reports none: the HF engine), ``segments`` when an episode has more
    than one."""
    prompts, prompt_mask = pad([e.prompt_ids for e in episodes], pad_id, "left")
    ids, real = pad([e.ids for e in episodes], pad_id, min_width=1)
    sampled = pad([[int(s) for s in e.sampled] for e in episodes], 0, min_width=1)[0]
    logprobs = torch.zeros(sampled.shape, dtype=torch.float32)
    for i, e in enumerate(episodes):
        logprobs[i, : len(e.logprobs)] = torch.tensor(e.logprobs, dtype=torch.float32)
    has_eos = torch.tensor([e.has_eos and not e.truncated for e in episodes], dtype=torch.bool)
    segments = None
    if any(e.segment and e.segment[-1] > 0 for e in episodes):
        segments = torch.cat([torch.zeros_like(prompts), pad([e.segment for e in episodes], 0, min_width=1)[0]], 1)
    return Rollout(
        torch.cat([prompts, ids], 1),
        torch.cat([prompt_mask, real], 1),
        sampled.long(),
        has_eos,
        prompts.shape[1],
        None,
        logprobs if with_logprobs else None,
        segments,
    )
