"""The teacher of on-policy distillation (``config/teacher.py``): a frozen causal LM beside the reference, loaded,
checked against the policy's vocabulary and read through its output layer.

The teacher judges the policy's own sampled tokens, so its token ids must mean what the policy's mean: a teacher
whose tokenizer differs is refused in one line naming the first difference (a token whose id differs, or one side's
extra tokens). A model object comes without its tokenizer; then what can be checked is checked — it must score every
id the policy's tokenizer can sample. The full-distribution divergence compares the two output layers row by row, so
there both must have as many rows (``check_heads``).
"""

from __future__ import annotations

import os

import torch

from ..algorithms import linear_divergence
from .lm_head import output_layer, plain_head
from .loading import disable_dropout, freeze, load_causal_lm, load_pretrained, load_tokenizer


def load_teacher(teacher, tokenizer, dtype: str, device: torch.device) -> torch.nn.Module:
    """The frozen teacher on ``device``: ``teacher`` a directory / GGUF file (loaded in ``dtype``, its tokenizer
    compared with the policy's ``tokenizer``) or a causal-LM object (its vocabulary size checked)."""
    if isinstance(teacher, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        model = disable_dropout(load_pretrained(AutoModelForCausalLM, teacher, dtype, what="teacher_model"))
        try:
            teacher_tokenizer = load_tokenizer(teacher, "teacher_model")
        except (OSError, ValueError, TypeError):  # no tokenizer files beside the weights: the sizes are checked
            teacher_tokenizer = None
        if teacher_tokenizer is not None:
            check_same_vocabulary(tokenizer, teacher_tokenizer, f"teacher_model {os.fspath(teacher)}")
    elif isinstance(teacher, torch.nn.Module):
        model = load_causal_lm(teacher, None)
    else:
        raise TypeError(
            f"teacher_model must be a model directory, a .gguf file or a causal-LM object, got {type(teacher).__name__}"
        )
    rows = _vocabulary_rows(model)
    if rows is not None and rows < len(tokenizer):
        raise ValueError(
            f"teacher_model scores {rows} token ids but the policy's tokenizer has {len(tokenizer)}: "
            "the teacher must share the policy's tokenizer"
        )
    return freeze(model).to(device)


def check_same_vocabulary(student, teacher, where: str) -> None:
    """Refuse, in one line naming ``where`` and the first difference, a teacher tokenizer whose token → id map is not
    the policy's."""
    s, t = student.get_vocab(), teacher.get_vocab()
    if s == t:
        return
    for token, i in sorted(s.items(), key=lambda kv: kv[1]):
        if token in t and t[token] != i:
            raise ValueError(
                f"{where}: its tokenizer differs from the policy's: token {token!r} is id {t[token]} there, {i} in "
                "the policy's (a teacher must share the policy's tokenizer)"
            )
    only_s, only_t = sorted(set(s) - set(t), key=s.get), sorted(set(t) - set(s), key=t.get)
    side, extra = ("the policy's", only_s) if only_s else ("the teacher's", only_t)
    raise ValueError(
        f"{where}: its tokenizer differs from the policy's: {len(s)} tokens in the policy's, {len(t)} in the "
        f"teacher's; {len(extra)} only in {side}, the first {extra[0]!r} (a teacher must share the policy's tokenizer)"
    )


def check_heads(policy: torch.nn.Module, teacher: torch.nn.Module) -> None:
    """The full-distribution divergence reads both output layers from their inputs (``head_tensors``): each must be
    a plain linear map whose output the model hands back untouched (``lm_head.plain_head``; no soft-capping or
    scaling), with as many rows. Refused in one line otherwise."""
    for who, model in (("policy", policy), ("teacher_model", teacher)):
        if not plain_head(model):
            raise ValueError(
                f"distillation_mode='full' needs the {who}'s output layer to be a plain linear map whose logits the "
                "model returns unchanged (this one is adapted, soft-capped or scaled): use distillation_mode='token'"
            )
    v_s, v_t = _head(policy).out_features, _head(teacher).out_features
    if v_s != v_t:
        raise ValueError(
            f"distillation_mode='full' compares the two next-token distributions row by row, but the policy's output "
            f"layer has {v_s} rows and the teacher's {v_t}: use distillation_mode='token'"
        )


def head_tensors(model: torch.nn.Module):
    """``(weight, bias)`` of ``model``'s output layer as whole tensors (a sharded one gathered, differentiably:
    the gradient of the gathered tensor reaches the shards)."""
    head = _head(model)
    weight: torch.Tensor = head.weight
    bias: torch.Tensor | None = head.bias
    if hasattr(weight, "full_tensor"):  # FSDP2's DTensor
        weight = weight.full_tensor()
        bias = bias.full_tensor() if bias is not None and hasattr(bias, "full_tensor") else bias
    return weight, bias


def teacher_divergence(
    policy: torch.nn.Module,
    teacher: torch.nn.Module,
    hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    temperature: float,
) -> torch.Tensor:
    """(B, T) the divergence (``algorithms.linear_divergence``: β 0 forward KL, 1 reverse KL, else the generalized
    JSD) between the policy's and the teacher's next-token distributions at each token of ``mask``, 0 elsewhere;
    from the two models' last hidden states (B, T, H) through their output layers in chunks, differentiable in the
    policy's hidden states and output layer."""
    rows = mask.bool()
    weight, bias = head_tensors(policy)
    with torch.no_grad():
        t_weight, t_bias = head_tensors(teacher)
    div, _ = linear_divergence(
        hidden[rows],
        weight,
        teacher_hidden[rows].to(hidden.device),
        t_weight,
        student_bias=bias,
        teacher_bias=t_bias,
        beta=beta,
        temperature=temperature,
    )
    out = torch.zeros(mask.shape, dtype=div.dtype, device=div.device)
    return out.masked_scatter(rows, div)


def _head(model: torch.nn.Module) -> torch.nn.Linear:
    """The plain output layer (``lm_head.output_layer``), which ``check_heads`` made sure exists."""
    head = output_layer(model)
    if head is None:
        raise ValueError(f"{type(model).__name__} has no plain linear output layer")
    return head


def _vocabulary_rows(model: torch.nn.Module) -> int | None:
    """How many token ids the model scores (its output layer's rows, else its embedding's)."""
    head = output_layer(model)
    if head is not None:
        return head.out_features
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    return getattr(emb, "num_embeddings", None)
