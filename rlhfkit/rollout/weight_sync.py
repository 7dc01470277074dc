"""A trained policy's weights as a rollout engine loads them: by Hugging Face name, with a ``peft``
adapter merged exactly as PEFT's own ``merge_and_unload`` merges it.

``hf_weights`` walks the model once, module by module. A weight no adapter touches goes out as it
is (no copy). A PEFT tuner layer (LoRA on a ``Linear``, ``Embedding`` or ``Conv`` layer, in any of
its variants — DoRA, rsLoRA, ``lora_bias`` —, or the ``trainable_token_indices`` layer) is merged by
its own ``merge``, run on a shadow of the layer: a shallow copy sharing the adapter's parameters
whose base layer holds clones of the base weights. So the numbers are PEFT's, the trained model is
never written to (its parameters stay bit for bit as they were; PEFT's merge/unmerge round trip is
not exact in floating point), and the extra memory at any time is one layer's weights. A
``modules_to_save`` wrapper goes out as its active trained copy, under the original's names.

What the engine cannot take is refused in one line by ``check_engine_weights`` (the trainer calls it
when it builds a vLLM engine, before training): prompt-learning adapters (virtual tokens are not
weights), tuner layers other than the above (``target_parameters``, ``MultiheadAttention``,
quantized layers, other PEFT methods), ``lora_bias`` on a layer without a bias (PEFT cannot merge
it), and an adapter that unties tied weights (e.g. LoRA on the embedding, or ``modules_to_save``
on ``lm_head``, of a model with ``tie_word_embeddings``): the engine keeps them tied, and PEFT's
own merge of such an adapter disagrees with its forward.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, cast

import torch

SUPPORTED = (
    "supported: LoRA on Linear/Embedding/Conv layers (DoRA, rsLoRA and lora_bias included), "
    "modules_to_save and trainable_token_indices"
)


def hf_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every weight of ``model`` as a Hugging Face checkpoint of its base
    model names it (tied weights under each of their names), a ``peft`` adapter merged in as
    ``merge_and_unload`` would merge it, without touching ``model``. Checked first
    (``check_engine_weights``). Call it where the parameters are whole (``distributed.gathered``
    under FSDP2)."""
    check_engine_weights(model)
    return _weights(_plan(model))


def check_engine_weights(model: torch.nn.Module) -> None:
    """Refuse, in one line, a model whose adapter a rollout engine cannot receive merged (see the
    module's docstring). A model without an adapter always passes."""
    if not (hasattr(model, "peft_config") and hasattr(model, "get_base_model")):
        return
    configs = cast(dict[str, Any], model.peft_config)  # a peft model's adapter configs, by name
    for adapter in _active(model):
        config = configs[adapter]
        if getattr(config, "is_prompt_learning", False):
            raise ValueError(
                f"peft adapter {adapter!r} is {config.peft_type.value} (prompt learning): its virtual "
                f"tokens are not weights a rollout engine can load; use rollout_engine='hf' ({SUPPORTED})"
            )
    tied: dict[int, list[tuple[str, object]]] = {}
    for name, original, source, _ in _plan(model):
        tied.setdefault(id(original), []).append((name, source))
    for group in tied.values():
        if len({id(source) for _, source in group}) > 1:
            names = " and ".join(name for name, _ in group)
            raise ValueError(
                f"{names} are one tied weight (tie_word_embeddings) but the peft adapter adapts them "
                "separately, which an engine built tied cannot hold (PEFT's merge unties them or "
                "disagrees with its forward): adapt neither, untie them (tie_word_embeddings=False), "
                "or for modules_to_save set ensure_weight_tying=True"
            )


def _active(model) -> list[str]:
    active = getattr(model, "active_adapters", None)
    if callable(active):
        active = active()
    return list(active) if active else [model.active_adapter]


def _plan(model: torch.nn.Module) -> list[tuple[str, torch.Tensor, object, object]]:
    """``(hf_name, original, source, how)`` per weight: ``original`` is the parameter the model
    without its adapter has under that name; ``source`` is what the engine gets (a parameter, or
    the tuner layer that merges into ``original``); ``how`` is a parameter to send as it is, or
    ``(layer, leaf)`` to merge."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    plan: list = []
    _walk(base, "", plan)
    return plan


def _walk(module: torch.nn.Module, prefix: str, plan: list) -> None:
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper, TrainableTokensWrapper

    if isinstance(module, ModulesToSaveWrapper):
        _plan_modules_to_save(module, prefix, plan)
        return
    if isinstance(module, TrainableTokensWrapper):
        module = module.token_adapter
    if isinstance(module, BaseTunerLayer):
        _check_layer(module, prefix.rstrip("."))
        for leaf, param in module.get_base_layer()._parameters.items():
            if param is not None:
                plan.append((prefix + leaf, param, module, (module, leaf)))
        return
    for leaf, param in module._parameters.items():
        if param is not None:
            plan.append((prefix + leaf, param, param, param))
    for name, child in module._modules.items():
        if child is not None:
            _walk(child, f"{prefix}{name}.", plan)


def _plan_modules_to_save(wrapper, prefix: str, plan: list) -> None:
    """A ``modules_to_save`` wrapper's plan: its active trained copy (the original when no adapter
    is active), each parameter under the original's name."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    original = dict(wrapper.original_module.named_parameters(remove_duplicate=False))
    active = wrapper.active_adapters
    target = wrapper.modules_to_save[active[0]] if active else wrapper.original_module
    if any(isinstance(m, BaseTunerLayer) for m in target.modules()):
        raise ValueError(
            f"{prefix.rstrip('.')}: a modules_to_save copy holding another adapter cannot be exported "
            f"to the engine ({SUPPORTED})"
        )
    for leaf, param in target.named_parameters(remove_duplicate=False):
        plan.append((prefix + leaf, original[leaf], param, param))


def _check_layer(layer, name: str) -> None:
    from peft.tuners.lora import layer as lora
    from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

    base = layer.get_base_layer()
    kinds = (lora.Linear, lora.Embedding, lora.Conv1d, lora.Conv2d, lora.Conv3d, TrainableTokensLayer)
    if type(layer) not in kinds or any(True for _ in base.children()):
        raise ValueError(
            f"{name}: a {type(layer).__module__}.{type(layer).__name__} adapter layer cannot be merged "
            f"into the engine's weights ({SUPPORTED}); use rollout_engine='hf'"
        )
    for adapter in layer.active_adapters:
        if getattr(layer, "lora_bias", {}).get(adapter) and getattr(base, "bias", None) is None:
            raise ValueError(
                f"{name}: lora_bias=True on a layer without a bias cannot be merged (PEFT refuses to "
                "merge it too): set lora_bias=False, or leave this layer out of target_modules"
            )


@torch.no_grad()
def _weights(plan) -> Iterator[tuple[str, torch.Tensor]]:
    merged: dict[str, torch.Tensor] = {}
    merged_layer = None
    for name, _, _, how in plan:
        if isinstance(how, tuple):
            layer, leaf = how
            if layer is not merged_layer:  # one layer's merged weights alive at a time
                merged = {}  # the previous layer's tensors go before this layer's are made
                merged, merged_layer = _merged_parameters(layer), layer
            yield name, merged[leaf]
        else:
            yield name, how.detach()


def _merged_parameters(layer) -> dict[str, torch.Tensor]:
    """The parameters of a PEFT tuner layer's base layer with its active adapters merged by the
    layer's own ``merge`` (as ``merge_and_unload`` does), computed on a shadow of the layer: the
    layer and its base weights are not written to."""
    base = layer.get_base_layer()
    shadow_base = copy.copy(base)
    shadow_base._parameters = {
        leaf: None if p is None else torch.nn.Parameter(p.detach().clone(), requires_grad=False)
        for leaf, p in base._parameters.items()
    }
    shadow = copy.copy(layer)
    shadow._modules = dict(layer._modules)
    shadow._modules["base_layer"] = shadow_base
    shadow.merged_adapters = list(layer.merged_adapters)
    if hasattr(layer, "_caches"):
        shadow._caches = dict(layer._caches)
    shadow.merge()
    return {leaf: p.detach() for leaf, p in shadow_base._parameters.items() if p is not None}


def load_weights(model: torch.nn.Module, weights, who: str = "generator rank") -> None:
    """The counterpart of ``hf_weights`` on a receiving process: copy each ``(name, tensor)`` into
    the parameter or buffer of ``model`` (a plain model, no adapter) of that name. A name the model
    lacks, or a shape it holds otherwise, is refused in one line naming the weight."""
    named = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    with torch.no_grad():
        for name, tensor in weights:
            if name not in named or tuple(named[name].shape) != tuple(tensor.shape):
                raise RuntimeError(
                    f"{who}: the trainers sent weight {name!r} {tuple(tensor.shape)}, "
                    "which its copy of the model does not have in that shape"
                )
            named[name].copy_(tensor)
