"""Quantized rollouts (``rollout_precision``): the HF engine sampling from a lower-precision copy
of the policy, kept honest by the rollout importance-sampling correction.

The sampling copy is a separate plain model of the policy's architecture (built from its config:
no adapter, no value head), which receives the trained weights through ``sync_weights`` — by
Hugging Face name, a ``peft`` adapter merged (``weight_sync.hf_weights``) — whenever the policy
has taken an optimizer step since the last sync (``engines.engine_ready``, as for vLLM), and is
then quantized again:

- ``bfloat16``: the copy cast to bfloat16 (every weight, the LM head included, as vLLM's
  ``dtype="bfloat16"``); CPU or GPU.
- ``int8``: every ``Linear`` layer but the LM head replaced by ``int8.Int8Linear``: int8 weights
  with one scale per output channel, each token's activations quantized to int8 at run time with
  a scale of its own, products in PyTorch's int8 matrix multiply (``torch._int_mm``); CPU. (Not
  ``torch.ao``'s ``quantize_dynamic``, whose one scale per batch breaks on a model with massive
  activations: ``rollout/int8.py``.)
- ``fp8``: torchao's ``Float8DynamicActivationFloat8WeightConfig`` (float8 e4m3 weights and
  per-row dynamic activations) on every ``Linear`` but the LM head; CUDA only (needs torchao and
  a GPU with float8 matmuls: H100 class). Not exercised on a CPU.

The LM head stays at the policy's precision under int8 and fp8, as vLLM's fp8 and FlashRL's int8
rollouts keep it: the logits are the sampled distribution itself, the head's error moves every
token's probability at once (the body's errors are partly absorbed by the normalisations), and it
is one layer of many. The engine reports the log-prob each token was drawn with (``HFEngine``'s
``logprobs``: the copy's, under the sampler's temperature / top-k / top-p), so the trainer's
``rollout_is`` correction and the ``rollout/*`` mismatch metrics treat it as they treat vLLM's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..config.rl import ROLLOUT_PRECISIONS
from .hf import DEFAULT_DECODE, HFEngine

FP8_ACTIVATION_LB = 1e-12  # the least activation |max| a per-row float8 scale is computed from
FP8_HINT = "rollout_precision='fp8' needs torchao (pip install torchao) and a CUDA GPU with float8 matmuls"


def plain_copy(policy: torch.nn.Module, device=None) -> torch.nn.Module:
    """A plain model of ``policy``'s architecture (its base model's class and config; no adapter,
    no value head), float32 weights on ``device`` (the policy's), in eval mode. Its weights are
    whatever initialisation gives: ``sync_weights`` fills them."""
    get_base = getattr(policy, "get_base_model", None)
    base = get_base() if callable(get_base) else policy
    device = device or next(policy.parameters()).device
    with torch.device(device):
        model = type(base)(base.config)
    return model.float().eval().requires_grad_(False)


def quantize(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """``model`` (float, plain, left unchanged) at ``precision`` (``ROLLOUT_PRECISIONS``): a new
    model. int8 and fp8 keep the LM head (``get_output_embeddings``) at its precision."""
    if precision not in ROLLOUT_PRECISIONS:
        raise ValueError(f"rollout_precision={precision!r}: one of {', '.join(ROLLOUT_PRECISIONS)}")
    import copy

    if precision == "bfloat16":
        return copy.deepcopy(model).to(torch.bfloat16)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    if precision == "int8":  # per-token activation scales: rollout/int8.py
        from .int8 import to_int8

        copied: Any = copy.deepcopy(model)  # a transformers model: get_output_embeddings
        return to_int8(copied, skip=copied.get_output_embeddings())  # the copy's own head stays in float
    try:  # fp8: CUDA only (refused elsewhere by the config)
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except ImportError as err:
        raise ValueError(f"{FP8_HINT} ({err})") from None
    quantized = copy.deepcopy(model).to(torch.bfloat16)  # torchao's per-row float8 takes bfloat16 weights
    keep = {id(m) for name, m in quantized.named_modules() if name in set(linears)}
    # activation_value_lb: a row of zeros (the zero-initialised embedding of a pad token, fed to finished or padded
    # rows) would get a scale of 0 and turn into NaNs (0/0), which attention then spreads over the row's other tokens
    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), activation_value_lb=FP8_ACTIVATION_LB)
    quantize_(
        quantized,
        config,
        filter_fn=lambda module, name: id(module) in keep,
    )
    return quantized


class QuantizedEngine(HFEngine):
    """``HFEngine`` over a quantized copy of the policy (``quantize``), synced like vLLM's
    (``needs_sync``: ``engine_ready`` calls ``sync_weights(hf_weights(policy), version)`` before
    generating whenever the policy took an optimizer step since ``synced_version``). It reports
    its own log-probs of the sampled tokens, always. Before the first sync it holds no weights
    and refuses to generate."""

    needs_sync = True

    def __init__(
        self,
        policy,
        precision: str,
        pad_id: int,
        eos_id: int | Sequence[int],
        share_prompt: bool = True,
        decode: str = DEFAULT_DECODE,
    ):
        if precision not in ROLLOUT_PRECISIONS:
            raise ValueError(f"rollout_precision={precision!r}: one of {', '.join(ROLLOUT_PRECISIONS)}")
        device = next(policy.parameters()).device
        if precision == "fp8" and device.type != "cuda":
            raise ValueError(
                f"rollout_precision='fp8' runs on CUDA only (the policy is on {device}): use 'bfloat16' or 'int8'"
            )
        if precision == "int8" and device.type != "cpu":  # PyTorch's dynamic int8 Linear has CPU kernels only
            raise ValueError(
                f"rollout_precision='int8' runs on the CPU only (the policy is on {device}): "
                "use 'fp8' or 'bfloat16' on a GPU"
            )
        self.precision, self.synced_version = precision, None
        self.master = plain_copy(policy, device)  # float32: the trained weights, quantized from at each sync
        # the policy's generation config names its EOS ids (the copy's is built from the config alone)
        super().__init__(policy, pad_id, eos_id, share_prompt, logprobs=True, decode=decode)
        self.model = None

    @torch.no_grad()
    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version=None) -> None:
        """Copy ``weights`` ((HF name, tensor) pairs: ``hf_weights(policy)``) into the float copy,
        then quantize it again; ``version`` is remembered as ``synced_version``."""
        from .weight_sync import load_weights

        load_weights(self.master, weights, who="quantized rollout engine")
        self.model = None  # the previous quantized copy goes before the next is made
        self.model = quantize(self.master, self.precision)
        self.synced_version = version

    def generate(self, prompts, n, sampling, seed=None):
        if self.model is None:
            raise RuntimeError("the quantized rollout engine generates after its first sync_weights")
        return super().generate(prompts, n, sampling, seed)
