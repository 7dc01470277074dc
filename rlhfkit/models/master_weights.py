"""Training a float16 model: its trained weights are kept in float32 for the run (master weights,
Micikevicius et al. 2018, "Mixed Precision Training", arXiv:1710.03740) and returned to float16 at
its end.

AdamW on float16 weights breaks on its own numbers: float16 spaces its values 2^-10 apart relative
to their size, so an update smaller than that rounds away; the second moment ``g²``, stored in
float16, is 0 for ``|g|`` below about 2^-12, leaving ``eps`` as AdamW's denominator; and the norm of a
float16 gradient overflows at 65504 while every element is finite. On TRL's tiny Qwen2 with
``learning_rate=0.1`` (its ``test_train_model_dtype``) TRL 1.16, which trains the float16 weights as
they are, ends with every weight NaN; rlhfkit's guard skipped such steps and, three in a row,
stopped the run. With float32 masters the optimizer's arithmetic and
state are float32, the forward and backward run in the run's ``autocast`` dtype (bfloat16 by
default under the TRL configs), and the model leaves the run in float16, as loaded, from
weights that accumulated every update. The weights take float32's memory during the run (as in
any mixed-precision trainer: DeepSpeed's and Megatron's float16 optimizers keep such masters).

bfloat16 weights are trained as they are: bfloat16 has float32's range (nothing overflows), and
training in it is the common practice.
"""

from __future__ import annotations

import torch


def float32_masters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Cast ``model``'s trainable float16 parameters to float32 in place (the optimizer, built after,
    holds them); returns them for ``back_to_float16``. Frozen ones stay float16."""
    upcast = [p for p in model.parameters() if p.requires_grad and p.dtype == torch.float16]
    for p in upcast:
        p.data = p.data.float()
    return upcast


def back_to_float16(params: list[torch.nn.Parameter]) -> None:
    """The parameters ``float32_masters`` cast, in float16 again (rounded to nearest). FSDP2's
    sharded parameters stay float32 (FSDP2 keeps its own views of them): the saved model is cast
    instead (``models.lora.export_causal_lm``'s ``dtype``)."""
    for p in params:
        if not hasattr(p, "full_tensor"):  # a DTensor under FSDP2
            p.data = p.data.to(torch.float16)
