"""The rollout interface: prompts in (token ids), ``n`` completions each out, as one padded batch.

An engine only has to return the response token ids per completion; ``build_rollout`` turns them
into the batch layout every other part uses, so a vLLM engine plugs in unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..config import check_ranges
from ..config.parts import ConfigFields, takes
from ..data.padding import pad
from ..models.loading import eos_token_ids


@takes("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")
class SamplingParams(ConfigFields):
    """What an engine needs to sample: ``RolloutConfig``'s sampling fields (their types, defaults, ranges
    and docs are RolloutConfig's; ``from_config`` copies them) plus ``greedy`` decoding."""

    greedy: bool = False
    """Greedy decoding (the most likely token at each step) instead of sampling."""

    def __post_init__(self):
        check_ranges(self)

    @classmethod
    def from_config(cls, config, **changes) -> SamplingParams:
        """The sampling fields of an ``RLConfig`` (or any ``RolloutConfig``), with ``changes``."""
        names = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        return cls(**{**{n: getattr(config, n) for n in names}, **changes})


@dataclass
class Rollout:
    """``B = len(prompts) * n`` rows; rows ``g*n .. g*n+n-1`` come from prompt ``g``.

    ``input_ids`` (B, P+T) = left-padded prompt (P columns) + response (T columns, right-padded);
    ``attention_mask`` (B, P+T) covers prompt tokens and response tokens up to the first EOS;
    ``response_mask`` (B, T): 1 on response tokens up to and including the first EOS;
    ``has_eos`` (B,): whether the completion emitted EOS (False = truncated at the length limit).
    "EOS" is any of the model's end ids (``models.loading.eos_token_ids``: the tokenizer's EOS and
    the model's own, e.g. Gemma 2's ``<end_of_turn>``): the engine stops at them, so the mask, the
    missing-EOS penalty and ``mask_truncated_completions`` (which read ``has_eos``) end there too;
    ``prompt_index`` (B,): which prompt each row continues (``g`` for rows ``g*n .. g*n+n-1``), so
    the forward passes can run each prompt once for its group (``forward_response``);
    ``logprobs`` (B, T): the engine's own log-probability of each sampled token, when the engine is
    not the trained model itself (vLLM), for the importance-sampling correction; None for HF;
    ``segments`` (B, P+T): for agent episodes whose chat template rewrote their history
    (``agents.rows``), the segment of each column — each segment is its own sequence in the
    forward passes (``models.segments``); None: every row is one sequence.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    has_eos: torch.Tensor
    prompt_len: int
    prompt_index: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    segments: torch.Tensor | None = None

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len :]

    def select(self, rows: torch.Tensor) -> Rollout:
        pick = lambda t: None if t is None else t[rows.to(t.device)]  # noqa: E731
        return Rollout(
            self.input_ids[rows],
            self.attention_mask[rows],
            self.response_mask[rows],
            self.has_eos[rows],
            self.prompt_len,
            pick(self.prompt_index),
            pick(self.logprobs),
            pick(self.segments),
        )

    def to(self, device) -> Rollout:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Rollout(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.has_eos.to(device),
            self.prompt_len,
            move(self.prompt_index),
            move(self.logprobs),
            move(self.segments),
        )


def concat_rollouts(rollouts: Sequence[Rollout], pad_id: int = 0) -> Rollout:
    """The rows of ``rollouts`` one after another, as one ``Rollout``: the prompt regions
    left-padded and the response regions right-padded to the widest (``pad_id`` in ``input_ids``,
    0 in the masks and log-probs of the padding), so each row keeps its tokens, masks and
    positions. ``prompt_index`` stays per prompt — each rollout's is offset past the previous
    ones' — and is None when any rollout has none (agent episodes); ``segments`` is kept (zeros, one
    segment, for the rows of a part without them). ``logprobs`` must be all there
    or all None: parts of which only some carry the engine's log-probs are refused (dropping them
    would silently turn the rollout correction off)."""
    if not rollouts:
        raise ValueError("concat_rollouts needs at least one rollout")
    with_logprobs = [r.logprobs is not None for r in rollouts]
    if any(with_logprobs) and not all(with_logprobs):
        raise ValueError(
            f"concat_rollouts: parts {[i for i, w in enumerate(with_logprobs) if not w]} (0-based) of "
            f"{len(rollouts)} have no engine log-probs and the others have; mixed parts would lose the "
            "rollout correction — generate every part with the same engine"
        )
    P = max(r.prompt_len for r in rollouts)
    T = max(r.response_mask.shape[1] for r in rollouts)
    F = torch.nn.functional

    def widen(t: torch.Tensor, r: Rollout, value: int) -> torch.Tensor:  # (B, P'+T') -> (B, P+T)
        prompt, response = t[:, : r.prompt_len], t[:, r.prompt_len :]
        return torch.cat(
            [
                F.pad(prompt, (P - r.prompt_len, 0), value=value),
                F.pad(response, (0, T - response.shape[1]), value=value),
            ],
            1,
        )

    def right(t: torch.Tensor) -> torch.Tensor:  # (B, T') -> (B, T)
        return F.pad(t, (0, T - t.shape[1]), value=0)

    index = None
    parts = [r.prompt_index for r in rollouts if r.prompt_index is not None]
    if len(parts) == len(rollouts):
        shifted, offset = [], 0
        for part in parts:
            shifted.append(part + offset)
            offset += int(part.max()) + 1 if len(part) else 0
        index = torch.cat(shifted)
    drawn = [r.logprobs for r in rollouts if r.logprobs is not None]
    logprobs = torch.cat([right(t) for t in drawn]) if all(with_logprobs) else None
    segments = None  # a part without segments is one segment per row: zeros
    if any(r.segments is not None for r in rollouts):
        segments = torch.cat(
            [widen(r.segments if r.segments is not None else torch.zeros_like(r.input_ids), r, 0) for r in rollouts]
        )
    return Rollout(
        torch.cat([widen(r.input_ids, r, pad_id) for r in rollouts]),
        torch.cat([widen(r.attention_mask, r, 0) for r in rollouts]),
        torch.cat([right(r.response_mask) for r in rollouts]),
        torch.cat([r.has_eos for r in rollouts]),
        P,
        index,
        logprobs,
        segments,
    )


def group_index(n_prompts: int, n: int, device=None) -> torch.Tensor:
    """``prompt_index`` of the layout where rows ``g*n .. g*n+n-1`` continue prompt ``g``."""
    return torch.arange(n_prompts, device=device).repeat_interleave(n)


Seed = int | Sequence[int] | None


def sampling_seed(*key: int) -> int:
    """A seed in [0, 2**62) fixed by ``key`` (e.g. the run's seed, the step, the sampling round and
    the prompt's place in the step): a hash, so neighbouring keys give unrelated seeds and each
    prompt's ``s .. s + n - 1`` row seeds (``row_seeds``) never meet another prompt's."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def prompt_seeds(seed: Seed, n_prompts: int, n: int) -> list[int] | None:
    """One seed per prompt from ``seed`` as ``generate`` takes it: None (the engine's own random
    stream), a sequence of one seed per prompt, or one int ``s`` (prompt ``g`` then draws with
    ``s + g·n``)."""
    if seed is None:
        return None
    if isinstance(seed, int):
        return [seed + g * n for g in range(n_prompts)]
    seeds = [int(s) for s in seed]
    if len(seeds) != n_prompts:
        raise ValueError(f"generate: {len(seeds)} seeds for {n_prompts} prompts (one per prompt)")
    return seeds


def row_seeds(seed: Seed, n_prompts: int, n: int) -> list[int] | None:
    """The seed of each row: completion ``j`` of prompt ``g`` (row ``g·n + j``) draws with prompt
    ``g``'s seed + ``j`` — vLLM's own rule for the ``n`` completions of a seeded request."""
    seeds = prompt_seeds(seed, n_prompts, n)
    return None if seeds is None else [s + j for s in seeds for j in range(n)]


class RolloutEngine(Protocol):
    """``eos_ids``: every id the engine stops at (``models.loading.eos_token_ids``); a completion
    ends at the first of them. ``needs_sync``: the engine holds its own copy of the weights
    (``sync_weights(weights, version)`` and ``synced_version``, as ``VLLMEngine``); ``sleep()``
    releases what it can during the update (a no-op for most engines).

    ``seed`` fixes the sampling per prompt (``prompt_seeds``): each row draws from a stream of its
    own (``row_seeds``), so a row's tokens depend on its prompt, the weights and its seed, never on
    which other prompts share the call — the same prompts split over N processes, or generator
    ranks, sample what one process samples."""

    needs_sync: bool
    eos_ids: tuple[int, ...]

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams, seed: Seed = None
    ) -> Rollout: ...

    def sleep(self) -> None: ...


def response_mask_from_ids(
    responses: torch.Tensor, eos_id: int | Collection[int], lengths: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask by the *position* of the first EOS (never by token value: pad may equal EOS). ``eos_id``:
    the EOS id, or every id that ends a completion (``models.loading.eos_token_ids``: the first of
    any of them ends it, kept in the mask).

    ``lengths`` (B,), when given, is the number of real tokens per row (the rest is filler that
    must never count, even when it holds the EOS id). Returns ``(response_mask (B, T) long,
    has_eos (B,) bool)``.
    """
    T = responses.shape[1]
    positions = torch.arange(T, device=responses.device)
    real = torch.ones_like(responses, dtype=torch.bool) if lengths is None else positions[None, :] < lengths[:, None]
    ends = torch.tensor(eos_token_ids(eos_id), dtype=responses.dtype, device=responses.device)
    is_eos = torch.isin(responses, ends) & real
    has_eos = is_eos.any(-1)
    end = is_eos.long().argmax(-1) if lengths is None else torch.minimum(is_eos.long().argmax(-1), lengths - 1)
    end = torch.where(has_eos, end, torch.full_like(end, T - 1) if lengths is None else lengths - 1)
    return (positions[None, :] <= end[:, None]).long(), has_eos


def build_rollout(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    n: int,
    pad_id: int,
    eos_id: int | Collection[int],
) -> Rollout:
    """Assemble a ``Rollout`` from prompt ids and per-completion response ids (len(prompts)*n);
    each response ends at its first id of ``eos_id`` (one id, or the engine's ``eos_ids``)."""
    if len(responses) != len(prompts) * n:
        raise ValueError(f"engine returned {len(responses)} completions for {len(prompts)} prompts x n={n}")
    prompt_ids, prompt_mask = pad(prompts, pad_id, "left")
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
    resp = pad(responses, pad_id, min_width=1)[0]
    lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)
    response_mask, has_eos = response_mask_from_ids(resp, eos_id, lengths)
    return Rollout(
        torch.cat([prompt_ids, resp], 1),
        torch.cat([prompt_mask, response_mask], 1),
        response_mask,
        has_eos,
        prompt_ids.shape[1],
        group_index(len(prompts), n),
    )


def decode_completions(rollout: Rollout, tokenizer) -> list[str]:
    """The text of each completion, without its EOS and anything after it."""
    lengths = (rollout.response_mask.sum(-1) - rollout.has_eos.long()).tolist()
    ids = rollout.response_ids.tolist()
    return tokenizer.batch_decode([r[:n] for r, n in zip(ids, lengths)], skip_special_tokens=True)
