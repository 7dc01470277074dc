"""The HF engine's own decode loop (``HFEngine(decode="loop")``): the same model calls
``generate`` makes, without its per-step machinery, and with finished rows dropped.

``generate`` (transformers 5.x) runs every row until the last one ends, grows its key/value cache
by ``torch.cat`` each step (a copy of the whole cache per layer and token: quadratic in the
length), runs the logits-processor list and the stopping criteria, and turns the sampler's choice
into a (rows, vocabulary) score tensor it takes the argmax of. This loop calls the model with the
inputs ``generate`` builds (the positions that skip left padding, the 2D mask — None when the
prompts have no padding, as ``generate`` drops an all-ones mask —, ``logits_to_keep=1``), draws
with the engine's ``TokenSampler``, and:

- keeps the key/value cache in buffers allocated once for the whole call (``rollout.cache``): a
  step writes its one column in place and attends over a view of the filled columns, the same
  keys ``generate`` attends over;
- drops a row from the batch (its tokens, mask, position and cache rows) the step it draws an
  EOS, so later steps compute only the rows still running; ``generate`` feeds a finished row pad
  tokens to the end. Dropping rows changes what a step's matrix products see only in how many
  rows they hold: a row's tokens are those of ``generate`` up to float rounding of a different
  batch size (the same exactness a seeded prompt already has alone or beside others).
  Rows are dropped only when the sampler draws each row from its own stream (per-row seeds) or
  greedily: unseeded sampling draws one ``torch.multinomial`` over the batch from torch's global
  stream, so there every row runs to the end, as in ``generate``, and draws what it draws.

Layers that are not plain full-attention layers (sliding windows, linear attention) keep the cache
layer transformers builds for them; rows are then dropped only if every layer can drop them.

On a CPU, a model computing in bfloat16 or float16 (``rollout_precision: bfloat16``, ``autocast``)
attends in its decode steps by two matrix products and a float32 softmax (``decode_attention``)
instead of PyTorch's CPU flash-attention kernel, which is slow for one query in these dtypes
(measured 5 ms against 0.13 ms for 16 rows over 50 keys, a third of a bfloat16 decode step;
float32 is as fast either way and keeps ``sdpa``, so float32 streams stay ``generate``'s). For the
loop's call only, transformers' ``sdpa`` function is rebound to it (``fast_decode_attention``): no
config changes, and architectures that call PyTorch's kernel themselves (Falcon) are untouched.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..models.policy import output_cache, position_ids_from_mask, with_cache

DECODE_ATTENTION_DTYPES = (torch.bfloat16, torch.float16)  # where decode_attention computes by matmuls


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' ``sdpa`` attention, except for one query per row on a CPU in a 16-bit dtype:
    there ``softmax(q k^T * scaling + mask) v`` by matrix products in float32 (each query head
    over its key/value head: grouped-query attention without repeating the cache), returned in the
    query's dtype. Same signature and output layout (rows, queries, heads, dim) as ``sdpa``'s."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, h, q_len, d = query.shape
    plain = kwargs.get("softcap") is None and kwargs.get("position_bias") is None and dropout == 0.0
    plain = plain and (attention_mask is None or attention_mask.shape[1] == 1)  # one mask for every head
    if q_len != 1 or query.device.type != "cpu" or query.dtype not in DECODE_ATTENTION_DTYPES or not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    kv = key.shape[1]
    with torch.autocast("cpu", enabled=False):
        q = query.reshape(b, kv, h // kv, d).float()  # head i attends over key/value head i // (h // kv)
        scores = torch.matmul(q, key.float().transpose(-1, -2)) * (d**-0.5 if scaling is None else scaling)
        if attention_mask is not None:  # (b, 1, 1, keys): bool (True: attend) or additive
            mask = attention_mask[..., : key.shape[-2]]
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        out = torch.matmul(scores.softmax(-1), value.float())
    return out.to(query.dtype).reshape(b, h, 1, d).transpose(1, 2).contiguous(), None


class _Binding:
    """The rebinding of ``sdpa`` (``fast_decode_attention``): how many blocks hold it, and the
    function it replaced, under ``lock``."""

    lock = threading.Lock()
    holders = 0
    replaced: Callable | None = None


@contextlib.contextmanager
def fast_decode_attention(model):
    """Within the block, transformers' ``sdpa`` attention function is ``decode_attention``, when
    ``model`` is on a CPU and attends by ``sdpa`` (a config among its modules names it); restored
    after, on every exit.

    What is rebound is the function behind the name (``ALL_ATTENTION_FUNCTIONS["sdpa"]``, the
    mapping's own per-instance override, deleted again at the end), not the name a model's config
    holds: every config keeps ``"sdpa"``, its masks are built for ``sdpa``, and a model that tests
    the name itself and calls PyTorch's kernel directly (Falcon) is untouched and attends as in
    ``generate``; only the attention layers that look the function up through transformers'
    interface (Llama, Qwen, GPT-2 and the rest) reach ``decode_attention``. The rebinding is
    process-wide while it lasts (nested and concurrent blocks share it, counted under a lock):
    another model attending by ``sdpa`` meanwhile gets ``decode_attention`` too, which computes
    the same attention (``sdpa`` itself but for one 16-bit query on a CPU). If something other than
    transformers' own ``sdpa`` function is bound to the name, it is left alone."""
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}.values()
    uses_sdpa = any(getattr(c, "_attn_implementation", None) == "sdpa" for c in configs)
    if not uses_sdpa or next(model.parameters()).device.type != "cpu":
        yield
        return
    _rebind_sdpa()
    try:
        yield
    finally:
        _restore_sdpa()


def _rebind_sdpa() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    with _Binding.lock:
        if _Binding.holders == 0:
            _Binding.replaced = ALL_ATTENTION_FUNCTIONS["sdpa"]
            if _Binding.replaced is sdpa_attention_forward:
                ALL_ATTENTION_FUNCTIONS["sdpa"] = decode_attention
        _Binding.holders += 1


def _restore_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    with _Binding.lock:
        _Binding.holders -= 1
        if _Binding.holders == 0:
            replaced, _Binding.replaced = _Binding.replaced, None
            if ALL_ATTENTION_FUNCTIONS["sdpa"] is decode_attention:
                if replaced is AttentionInterface()["sdpa"]:  # the class-wide function: drop the override
                    del ALL_ATTENTION_FUNCTIONS["sdpa"]
                else:
                    ALL_ATTENTION_FUNCTIONS["sdpa"] = replaced


def _can_drop_rows(cache) -> bool:
    return all(callable(getattr(lay, "batch_select_indices", None)) for lay in cache.layers)


@dataclass
class Decoded:
    """``responses`` (B, W): each row's tokens, ``pad_id`` after its EOS, W the steps run (until
    every row ended or the limit, as ``generate``); ``logprobs`` (B, W) of the drawn tokens (0 after
    a row's EOS), or None; ``computed``: token positions the model ran (``models.efficiency``)."""

    responses: torch.Tensor
    logprobs: torch.Tensor | None
    computed: int


def _attending_fast(fn):
    """``fn(model, ...)`` run with ``fast_decode_attention(model)`` on."""

    @functools.wraps(fn)
    def run(model, *args, **kwargs):
        with fast_decode_attention(model):
            return fn(model, *args, **kwargs)

    return run


@torch.no_grad()
@_attending_fast
def decode(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    n: int,
    sampler,
    max_new_tokens: int,
    eos_ids,
    pad_id: int,
    share_prompt: bool,
    logprobs: bool,
    drop_rows: bool = True,
) -> Decoded:
    """``n`` completions of each left-padded prompt (``prompt_ids``/``prompt_mask``: one row per
    prompt), rows ``g*n .. g*n+n-1`` continuing prompt ``g``, drawn by ``sampler.draw`` (a
    ``rollout.token_sampler.TokenSampler``). ``share_prompt``: every prompt column but the last is encoded
    once per prompt and its cache repeated for the ``n`` rows, as ``HFEngine._prompt_cache``.
    ``drop_rows``: drop finished rows (only honoured when ``sampler.row_independent``).
    On a CPU the model attends by ``decode_attention`` meanwhile (``fast_decode_attention``)."""
    from .cache import decode_cache

    (G, P), device = prompt_ids.shape, prompt_ids.device
    B = G * n
    ids, mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
    cache = decode_cache(model, P + max_new_tokens)
    shared = share_prompt and n > 1 and P > 1 and int(prompt_mask[:, :-1].sum(-1).min()) >= 1
    if shared:  # the prefix once per prompt, with the mask passed as HFEngine._prompt_cache passes it
        out = model(
            input_ids=prompt_ids[:, :-1],
            attention_mask=prompt_mask[:, :-1],
            position_ids=position_ids_from_mask(prompt_mask[:, :-1]),
            use_cache=True,
            logits_to_keep=1,
            **with_cache(cache),
        )
        cache = output_cache(out)
        cache.batch_repeat_interleave(n)
        computed, fed = G * (P - 1) + B, slice(P - 1, P)
    else:
        computed, fed = B * P, slice(0, P)
    # the mask of every column the call will have (None without padding: generate drops an all-ones mask)
    full_mask = None if bool((mask == 1).all()) else torch.cat([mask, mask.new_ones((B, max_new_tokens))], 1)
    positions = position_ids_from_mask(mask)
    out = model(
        input_ids=ids[:, fed],
        attention_mask=None if full_mask is None else full_mask[:, :P],
        position_ids=positions[:, fed],
        use_cache=True,
        logits_to_keep=1,
        **with_cache(cache),
    )
    cache = output_cache(out)
    logits = out.logits[:, -1].float()
    del out
    position = positions[:, -1]

    responses = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    drawn = torch.zeros((B, max_new_tokens), device=device) if logprobs else None
    ends = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
    rows = torch.arange(B, device=device)  # the original row of each row still in the batch
    drop = drop_rows and sampler.row_independent and _can_drop_rows(cache)
    finished = torch.zeros(B, dtype=torch.bool, device=device)  # without dropping: rows fed pad, as generate
    width = 0
    for step in range(max_new_tokens):
        history = torch.cat([ids[rows], responses[rows, :step]], 1) if sampler.needs_history else None
        tokens, token_logprobs = sampler.draw(logits, rows if drop else None, logprobs, history)
        tokens = tokens[:, 0]
        if not drop:
            tokens = torch.where(finished, pad_id, tokens)
        responses[rows, step] = tokens
        if drawn is not None:  # the engine masks them past each row's EOS
            drawn[rows, step] = token_logprobs[:, 0]
        width = step + 1
        done = torch.isin(tokens, ends) if drop else torch.isin(tokens, ends) | finished
        if step + 1 == max_new_tokens or bool(done.all()):
            break
        if drop and bool(done.any()):
            keep = (~done).nonzero()[:, 0]
            rows, tokens, position = rows[keep], tokens[keep], position[keep]
            cache.batch_select_indices(keep)
            full_mask = None if full_mask is None else full_mask[keep]
        elif not drop:
            finished = done
        position = position + 1
        out = model(
            input_ids=tokens[:, None],
            attention_mask=None if full_mask is None else full_mask[:, : P + step + 1],
            position_ids=position[:, None],
            use_cache=True,
            logits_to_keep=1,
            **with_cache(cache),
        )
        cache = output_cache(out)
        logits = out.logits[:, -1].float()
        del out
        computed += len(rows)
    return Decoded(responses[:, :width], None if drawn is None else drawn[:, :width], computed)
