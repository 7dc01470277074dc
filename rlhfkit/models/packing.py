"""Group packing: the rows that continue one prompt run as one packed sequence, the prompt once and
the completions side by side after it, each completion attending to the prompt and to itself only.

A group of ``G`` completions of a prompt of ``p`` tokens laid out as ``G`` padded rows costs
``G·(P + T)`` positions per forward pass; packed, it costs ``p + Σ (L_i - 1)``: the prompt once,
each completion's tokens without its last one (whose logits predict nothing the loss reads), and no
padding inside the group. The attention mask of a packed row is a tree (the prompt is the trunk,
each completion a branch)::

    columns   [ left pad | prompt | c1 t0 .. | c2 t0 .. | ... | right pad ]
    positions   0 ..       0..p-1   p ..       p ..

Completion ``j``'s tokens take the positions they have in their own row (``p, p+1, ...``), so rotary
or learned position embeddings see what they saw in the unpacked row; their keys are the prompt's
and their own earlier ones. The logits of the prompt's last column predict every completion's first
token; completion token ``t >= 1`` is predicted by the packed column of token ``t - 1``.

It is a layout, not an approximation: the log-probs, entropies, hidden states and gradients are the
padded rows' (up to float summation order; ``tests/models/test_models.py`` checks them against the
plain pass) — for models whose tokens meet only through full causal attention, with positions from
``position_ids``. So it applies to the architectures of ``PACKABLE_MODELS`` (no ALiBi, whose biases
come from a 2-D mask; no recurrent, convolution or linear-attention layers, which would run across
the packed completions) with an attention that takes an explicit 4-D mask (Hugging Face's ``sdpa``
and ``eager``), where a model has sliding-window layers only when no unpacked row is longer than
the window (a 4-D mask replaces the window), and where its rotary frequencies depend on the length
of the pass (``dynamic``, ``longrope``) only when every row is short enough for them to be the
fixed ones (``rope_length_limit``). It also applies only where it computes less:
the packed attention is dense over a longer row (``N² `` pairs per group), which loses to the padded
rows for long completions. ``pack_groups`` returns None otherwise and the caller runs the rows as
they are. One forward pass per micro-batch, as without packing: it holds under activation
checkpointing, DDP and FSDP2 (where every process must run the same passes), unlike a cached
prompt pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PACKABLE_ATTENTION = ("sdpa", "eager")
# Decoder-only model types whose layers are full causal attention (a sliding window aside) with
# rotary or learned positions read from ``position_ids``, and position-wise MLPs (MoE included).
PACKABLE_MODELS = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gpt2",
        "gpt_neox",
        "olmo",
        "olmo2",
        "granite",
        "phi",
        "phi3",
        "stablelm",
        "smollm3",
    }
)


@dataclass
class PackedGroups:
    """The packed rows of a batch and where each needed output lies in them."""

    input_ids: torch.Tensor  # (n, N): one packed row per distinct prompt
    position_ids: torch.Tensor  # (n, N)
    allowed: torch.Tensor  # (n, 1, N, N) bool: query column i may attend key column k
    first_kept: int  # P - 1: logits are kept from this column on (``logits_to_keep = N - first_kept``)
    group: torch.Tensor  # (M,) the packed row of each needed output (a real response token of some row)
    column: torch.Tensor  # (M,) its predicting column, counted from ``first_kept``
    row: torch.Tensor  # (M,) the batch row it belongs to
    step: torch.Tensor  # (M,) its response column

    @property
    def computed(self) -> int:
        """Token positions one forward pass over the packed rows runs."""
        return self.input_ids.numel()

    def model_inputs(self, model) -> dict:
        """The packed pass's keyword arguments but the ones of its outputs: ``input_ids``, the 4-D
        ``attention_mask``, ``position_ids``, and ``output_router_logits=False`` where the model's config
        turns the router logits on. An MoE model's load-balancing loss (``aux_loss``, computed in its
        forward whenever the router logits are output) reads the attention mask as (batch, seq) and
        fails on a 4-D one; rlhfkit never reads that loss (its losses are those of ``algorithms``, its
        TRL configs refuse ``router_aux_loss_coef``), and turning it off changes no logit, so packing
        stays exact and skips that loss's work."""
        inputs: dict[str, torch.Tensor | bool] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask(model),
            "position_ids": self.position_ids,
        }
        if getattr(model_config(model), "output_router_logits", False):
            inputs["output_router_logits"] = False
        return inputs

    def attention_mask(self, model) -> torch.Tensor:
        """The 4-D mask in the form the model's attention takes: boolean for ``sdpa``, additive
        (0 where allowed, the dtype's lowest value elsewhere) for ``eager``."""
        if attention_implementation(model) == "sdpa":
            return self.allowed
        dtype = next(model.parameters()).dtype
        return torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device).masked_fill_(
            ~self.allowed, torch.finfo(dtype).min
        )

    def scatter(self, values: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        """(M, ...) outputs in packed order -> (rows, width, ...) in the batch's layout, zeros at the
        columns no real response token occupies. Differentiable."""
        out = values.new_zeros((rows, width, *values.shape[1:]))
        return out.index_put((self.row, self.step), values)


def model_config(model):
    """The Hugging Face config of ``model`` (through a DDP wrapper), or None."""
    return getattr(getattr(model, "module", model), "config", None)


def attention_implementation(model) -> str | None:
    return getattr(model_config(model), "_attn_implementation", None)


def rope_length_limit(config) -> int | None:
    """The longest row, in tokens, for which the rotary frequencies of ``config`` are the same in a
    packed pass, in the padded rows' pass and in ``generate``; None where they never depend on the
    length (no rope scaling, ``linear``, ``yarn``, ``llama3``, ...).

    Transformers' ``dynamic_rope_update`` recomputes them from ``max(position_ids) + 1`` of each pass
    for ``longrope`` and for every type named ``*dynamic*``; a packed row's largest position is one
    less than the padded rows' (a completion's last token is not in it), so past the limit the two
    can differ (Phi-3 at ``original + 1`` tokens: short factors packed, long ones padded):

    - ``longrope``: the short factors up to ``original_max_position_embeddings`` tokens (seq_len
      ``<= original``), in every pass, so the limit is that length;
    - ``dynamic`` (NTK): the original frequencies while seq_len ``< max_position_embeddings``,
      whatever a longer earlier pass grew them to (they are kept, not reset, at exactly that length),
      so the limit is ``max_position_embeddings - 1``.

    Past the limit no pass reproduces what ``generate`` sampled with (its frequencies follow the
    running length while decoding; Phi-3's recomputes its cache once, at the crossing), and the padded
    pass's choice follows its batch's longest row; a batch with such a row is not packed and runs as
    it always has (for ``longrope`` rows all past ``original + 1`` would pack alike, but only because
    transformers reads the positions, not the packed row's wider length: not relied on). Rope
    parameters are read from ``rope_parameters`` (transformers 5, also one dict per layer type) or
    ``rope_scaling`` (``rope_type`` or the older ``type``); the smallest limit of them all is kept."""
    limits = []
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(config, name, None)
        if not isinstance(params, dict):
            continue
        for rope in [p for p in params.values() if isinstance(p, dict)] or [params]:
            rope_type = rope.get("rope_type") or rope.get("type") or "default"
            if "dynamic" in rope_type:
                limits.append(getattr(config, "max_position_embeddings", 0) - 1)
            elif rope_type == "longrope":
                limits.append(
                    rope.get("original_max_position_embeddings")
                    or getattr(config, "original_max_position_embeddings", None)
                    or getattr(config, "max_position_embeddings", 0)
                )
    return min(limits, default=None)


def packable_model(model, width: int) -> bool:
    """Whether packing gives ``model``'s own results for rows of at most ``width`` tokens: an
    architecture of ``PACKABLE_MODELS``, a 4-D-mask attention, no sliding window narrower than the
    rows, and rows within ``rope_length_limit`` where the rotary frequencies depend on the length."""
    config = model_config(model)
    if config is None or attention_implementation(model) not in PACKABLE_ATTENTION:
        return False
    if getattr(config, "model_type", None) not in PACKABLE_MODELS:
        return False
    layer_types = getattr(config, "layer_types", None) or []
    if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        return False
    limit = rope_length_limit(config)
    if limit is not None and width > limit:
        return False
    window = getattr(config, "sliding_window", None)
    if window is None or (layer_types and "sliding_attention" not in layer_types):
        return True  # no layer attends through a sliding window
    return width <= window


def packing_computes_less(model, packed: tuple[int, int], padded: tuple[int, int]) -> bool:
    """Whether ``packed`` rows x columns cost less than ``padded`` rows x columns: per position the
    layers' weights (``2 * (4 h^2 + 3 h i)`` per layer), per attended pair ``4 h`` per layer, every
    pair of a row counted (neither a dense 4-D mask nor a padding mask skips any)."""
    config = model_config(model)
    h = int(getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 0)
    inner = int(getattr(config, "intermediate_size", None) or 4 * h)
    per_position, per_pair = 2 * (4 * h * h + 3 * h * inner), 4 * h

    def cost(rows, columns):
        return rows * columns * per_position + rows * columns * columns * per_pair

    return cost(*packed) <= cost(*padded)


def pack_groups(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, prompt_index: torch.Tensor
) -> PackedGroups | None:
    """Pack rows ``[left pad | prompt | response | right pad]`` (``response_len`` response columns)
    by ``prompt_index`` (equal index: identical prompt columns). None where packing does not apply:
    not ``packable_model`` for the longest row (its attended tokens), every prompt is distinct, a
    row's attended columns are not one contiguous prompt and one contiguous response, rows said to
    share a prompt do not, or the packed rows would cost more (``packing_computes_less``)."""
    device = input_ids.device
    B, W = input_ids.shape
    T, P = response_len, W - response_len
    if P < 1:
        return None
    mask = attention_mask.bool()
    plen, rlen = mask[:, :P].sum(-1), mask[:, P:].sum(-1)
    if not packable_model(model, int((plen + rlen).max())):
        return None
    _, inverse = torch.unique(prompt_index.to(device), return_inverse=True)
    n = int(inverse.max()) + 1
    if n == B:
        return None
    cols = torch.arange(W, device=device)
    contiguous = (mask[:, :P] == (cols[:P] >= P - plen[:, None])).all() & (
        mask[:, P:] == (cols[:T] < rlen[:, None])
    ).all()
    rows = torch.arange(B, device=device)
    first = torch.full((n,), B, device=device).scatter_reduce(0, inverse, rows, "amin")  # a row of each prompt
    same_prompt = ((input_ids[:, :P] == input_ids[first[inverse], :P]) | ~mask[:, :P]).all() & (
        plen == plen[first[inverse]]
    ).all()
    if not bool(contiguous & same_prompt) or int(plen.min()) < 1:
        return None

    keep = (rlen - 1).clamp(min=0)  # each response's tokens but its last go into the packed row
    # Where row r's kept tokens start: after the prompt and the kept tokens of the earlier rows of its group.
    before = torch.zeros_like(keep)
    for g_rows in _rows_by_group(inverse, n):
        before[g_rows] = torch.cumsum(keep[g_rows], 0) - keep[g_rows]
    totals = torch.zeros(n, dtype=keep.dtype, device=device).scatter_add_(0, inverse, keep)
    N = P + int(totals.max())
    if not packing_computes_less(model, (n, N), (B, W)):
        return None

    ids = torch.zeros((n, N), dtype=input_ids.dtype, device=device)
    positions = torch.zeros((n, N), dtype=torch.long, device=device)
    branch = torch.full((n, N), -2, dtype=torch.long, device=device)  # -2 padding, -1 prompt, r: row r's tokens
    ids[:, :P] = input_ids[first, :P]
    prompt_real = mask[first, :P]
    positions[:, :P] = (prompt_real.long().cumsum(-1) - 1).clamp(min=0)
    branch[:, :P] = torch.where(prompt_real, -1, -2)
    t = torch.arange(T, device=device)[None, :]
    kept = t < keep[:, None]  # (B, T): response tokens placed in the packed rows
    dest_row = inverse[:, None].expand(B, T)[kept]
    dest_col = (P + before[:, None] + t).expand(B, T)[kept]
    ids[dest_row, dest_col] = input_ids[:, P:][kept]
    positions[dest_row, dest_col] = (plen[:, None] + t).expand(B, T)[kept]
    branch[dest_row, dest_col] = rows[:, None].expand(B, T)[kept]

    key_real = branch >= -1
    causal = torch.ones((N, N), dtype=torch.bool, device=device).tril()
    same_branch = (branch[:, None, :] == -1) | (branch[:, None, :] == branch[:, :, None])
    allowed = (key_real[:, None, :] & causal & same_branch) | torch.eye(N, dtype=torch.bool, device=device)

    needed = t < rlen[:, None]  # (B, T): every real response token gets its log-prob
    column = torch.where(t == 0, P - 1, P + before[:, None] + t - 1) - (P - 1)
    return PackedGroups(
        ids,
        positions,
        allowed[:, None],
        P - 1,
        inverse[:, None].expand(B, T)[needed],
        column.expand(B, T)[needed],
        rows[:, None].expand(B, T)[needed],
        t.expand(B, T)[needed],
    )


def _rows_by_group(inverse: torch.Tensor, n: int):
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse, minlength=n).tolist()
    return order.split(counts)
