"""int8 weights and per-token int8 activations (W8A8, dynamic) for the quantized rollouts' CPU copy.

``Int8Linear`` replaces a ``Linear``: its weight is held as int8 with one scale per output channel
(``s_w[o] = max_i |W[o, i]| / 127``), and at run time every token's input row is quantized with a
scale of its own (``s_x[t] = max_i |x[t, i]| / 127``, rounded to nearest, clamped to ±127); the
product runs in PyTorch's int8 matrix multiply (``torch._int_mm``, int32 accumulation) and is
scaled back, ``y[t, o] = s_x[t] s_w[o] Σ_i q_x[t, i] q_w[o, i] + b[o]``.

Why per token: the scale of PyTorch's ``quantize_dynamic`` is one per batch, and a model with a
massive activation (SmolLM2 has |x| ≈ 3,000 at the first position into a middle layer's
``down_proj``, against a median of 0.06) rounds every other token's input to 0 there: the copy
then samples from a different model (2.3 nats of KL per token, measured; docs/results/quantized-
rollouts.md), and a row's logits depend on which rows share its batch. Per-token scales, as in
LLM.int8() / SmoothQuant's dynamic per-token activation quantization and vLLM's W8A8 kernels, keep
each token's error its own and the rows independent of each other.
"""

from __future__ import annotations

import torch

QMAX = 127


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, float32 scales (rows, 1)): each row of the 2-D ``x`` by its own absolute maximum
    (a row of zeros gets the scale of 1e-12 / 127 and stays zeros)."""
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / QMAX
    return (x.float() / scale).round().clamp(-QMAX, QMAX).to(torch.int8), scale


def _conv1d_class():
    """transformers' ``Conv1D`` (GPT-2's projections: a linear map holding its weight as (in, out))."""
    from transformers.pytorch_utils import Conv1D

    return Conv1D


class Int8Linear(torch.nn.Module):
    """A ``Linear`` — or transformers' ``Conv1D``, the same map with its weight stored transposed (GPT-2,
    GPT-J's ancestors) — with int8 weights (per output channel) and per-token dynamic int8 activations
    (module docstring). Output in the input's dtype."""

    weight_t: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Module):
        super().__init__()
        weight = linear.weight
        assert isinstance(weight, torch.Tensor), type(weight)
        weight = weight.detach()
        if not isinstance(linear, torch.nn.Linear):  # Conv1D: y = x W + b with W (in, out)
            weight = weight.t()
        self.out_features, self.in_features = weight.shape
        weight, scale = quantize_rows(weight)
        self.register_buffer("weight_t", weight.t().contiguous())  # (in, out): the right operand of _int_mm
        self.register_buffer("weight_scale", scale.reshape(1, -1))
        bias = linear.bias
        self.register_buffer("bias", bias.detach().float().clone() if isinstance(bias, torch.Tensor) else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        q, scale = quantize_rows(rows)
        y = torch._int_mm(q, self.weight_t).float() * scale * self.weight_scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights, per-token int8 inputs"


def to_int8(model: torch.nn.Module, skip: torch.nn.Module | None = None) -> torch.nn.Module:
    """``model`` with every ``Linear`` and transformers ``Conv1D`` but ``skip`` (the LM head) replaced by
    ``Int8Linear``, in place. A model with none to replace is refused in one line: an "int8" copy that
    quantizes nothing would sample in full precision under the int8 name."""
    kinds = (torch.nn.Linear, _conv1d_class())
    replaced = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, kinds) and child is not skip:
                setattr(module, child_name, Int8Linear(child))
                replaced += 1
    if not replaced:
        raise ValueError(
            f"rollout_precision='int8': {type(model).__name__} has no torch.nn.Linear or transformers Conv1D layer "
            "besides its LM head to quantize; use rollout_precision='bfloat16' or None"
        )
    return model
