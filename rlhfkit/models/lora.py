"""LoRA (Hu et al. 2021, arXiv:2106.09685) through ``peft`` for every trainer, and the one way a
trained causal LM leaves a run: ``final/`` as a plain model directory (the adapter merged into a
copy of the base weights) or, when the user asks (``save_adapter``), the adapter alone.

Under torchrun the trained model is sharded (FSDP2); the main process then keeps an unsharded
CPU copy of the LoRA model made before sharding (``unsharded_template``), loads the gathered
full weights into it and merges or saves from there.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from .. import distributed
from ..files import writing
from .loading import check_finite_weights
from .sources import quiet_weight_bars

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


def is_peft(model) -> bool:
    """Whether ``model`` is a ``peft`` model (has adapters that can be disabled and merged)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def apply_lora(model: torch.nn.Module, peft_config, task_type: str | None = "CAUSAL_LM") -> torch.nn.Module:
    """``peft.get_peft_model`` with ``peft_config`` (its ``task_type`` set to ``task_type`` when it
    has none; ``task_type=None``: always none — a plain ``PeftModel`` whose forward is the model's
    own, for a backbone such as a reward model's). A target module the model lacks is one clear
    line, not peft's traceback; transformers' deprecation of ``is_gradient_checkpointing``, which peft
    reads, is not printed (it is no concern of the user's, and it landed around error lines)."""
    import warnings

    from peft import get_peft_model

    current = getattr(peft_config, "task_type", None)
    if current != task_type and (task_type is None or current is None):  # the user's config is kept when it fits
        peft_config = copy.copy(peft_config)
        peft_config.task_type = task_type
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            return get_peft_model(model, peft_config)
    except ValueError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"peft_config does not fit the model {type(model).__name__}: {first}") from None


def unsharded_template(model: torch.nn.Module) -> torch.nn.Module | None:
    """An unsharded CPU copy of a LoRA ``model`` on the main process of a multi-process run (taken
    before sharding), which ``export_causal_lm`` fills with the gathered weights; else None."""
    if is_peft(model) and distributed.role_active() and distributed.is_main():
        return copy.deepcopy(model).cpu()
    return None


def export_causal_lm(
    model: torch.nn.Module,
    path,
    tokenizer=None,
    adapter: bool = False,
    template: torch.nn.Module | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Write ``model`` to ``path`` as ``AutoModelForCausalLM.from_pretrained`` (or, with
    ``adapter`` and a LoRA model, ``PeftModel.from_pretrained`` on the base) loads it. Every
    process must call this under torchrun: the full weights are gathered, the main process writes.
    The trained model is left as it is (merging happens on a copy). ``dtype``: the floating weights
    of a model without adapters are written in it (SFT's float32 masters of a float16 model)."""
    check_finite_weights(model, f"saving {path}")  # every process: a shard each, the verdict shared
    state = distributed.full_state_dict(model) if distributed.role_size() > 1 else None  # a collective
    if dtype is not None and not is_peft(model):
        full = state if state is not None else model.state_dict()
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in full.items()}
    if distributed.is_main():
        path = Path(path)
        with writing(path), quiet_weight_bars():  # a full disk: one line naming the directory
            if is_peft(model):
                source = cast("PeftModel", template if template is not None else model)
                if template is not None:  # a multi-process run (unsharded_template): the weights gathered above
                    assert state is not None
                    source.load_state_dict(state)
                if adapter:
                    source.save_pretrained(path)
                else:
                    copy.deepcopy(source).merge_and_unload().save_pretrained(path)
            else:
                cast("PreTrainedModel", model).save_pretrained(path, state_dict=state)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
    distributed.role_barrier()


def merged_backbone(backbone: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of a (possibly LoRA) backbone with the adapter merged in."""
    return cast("PeftModel", copy.deepcopy(backbone)).merge_and_unload() if is_peft(backbone) else backbone
