"""Scalar-head models: the PPO critic (a value per response token) and the reward model (one
score per sequence, read at its last attended token). One class serves both: a transformer
backbone plus a linear head ``H -> 1``.

Saved layout (a directory; ``save_pretrained``): a Hugging Face ``<Arch>ForSequenceClassification``
with one label, so ``AutoModelForSequenceClassification.from_pretrained(dir)`` (TRL, OpenRLHF,
vLLM's reward serving) loads it: ``config.json`` names that class, the backbone's weights sit
under the class's base-model prefix (``model.*`` for Llama, ``transformer.*`` for GPT-2) and the
head's weight is ``score.weight``. HF reads the logit at the last token that is not
``config.pad_token_id``: with right padding by a pad id that differs from EOS that is the last
attended token, the one ``score`` reads (the EOS that rlhfkit appends). ``pad_token_id`` is
saved only when it differs from every EOS id, else as ``null`` (see ``save_pretrained``).

In transformers 5.23 every decoder ``*ForSequenceClassification`` that reads the last token
(``GenericForSequenceClassification``: Llama, Qwen, Mistral, Gemma, ...; GPT-2, GPT-NeoX, OPT,
Falcon, ...) has a bias-free ``score``. Nothing else after the last norm can hold a constant:
RMSNorm models (Llama, Qwen, ...) have no bias there at all, and folding it into a LayerNorm's
bias (GPT-2, OPT, ...) would change the backbone's hidden states. So HF's logits lack the
centring offset (and a head bias); ``config.json`` records both (a critic trains its bias; a
reward model's stays at its init, 0, as the Bradley–Terry gradient for it cancels):

* ``rlhfkit_score_offset``: the centring offset (``ScalarModel.offset``);
* ``rlhfkit_head_bias``: the head's bias (``null``: a head without one);
* ``rlhfkit_score_shift``: ``ScalarModel.score == hf_logits[:, 0] - rlhfkit_score_shift``
  (``offset - bias`` for a bias-free HF head; ``0.0`` where the HF head has a bias, which then
  holds ``bias - offset``). For a reward model trained here the shift is its offset.

``rlhfkit_scalar.json`` repeats these numbers for people and older tools; it is not read back.
``from_pretrained`` reads this layout, the older one (an ``AutoModel`` backbone,
``scalar_head.safetensors`` and ``rlhfkit_scalar.json``, still written for backbones without a
sequence-classification class), any ``AutoModelForSequenceClassification`` directory with one
label, or a plain causal-LM directory (fresh head).
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from ..algorithms import last_token_index
from .loading import check_finite_weights, disable_dropout, eos_token_ids, resolve_dtype
from .policy import position_ids_from_mask
from .sources import from_hub_or_dir, resolve_model_dir

META_FILE, HEAD_FILE = "rlhfkit_scalar.json", "scalar_head.safetensors"
OFFSET_KEY, BIAS_KEY, SHIFT_KEY = "rlhfkit_score_offset", "rlhfkit_head_bias", "rlhfkit_score_shift"

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedConfig, PreTrainedModel


class ScalarModel(torch.nn.Module):
    """``backbone`` returns ``last_hidden_state``; ``head`` maps it to one number per position.

    ``offset`` is subtracted from every score: a trained reward model stores the mean score of a
    reference set there, so loaded scores are centred (its head stays untouched).
    """

    offset: torch.Tensor  # a buffer (not saved in the state dict)

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Module | None = None, offset: float = 0.0):
        super().__init__()
        self.backbone = disable_dropout(backbone)
        hidden = self.config.hidden_size
        if head is None:
            # std 1/sqrt(H+1): the value/reward head init of "The N Implementation Details of RLHF with PPO".
            head = torch.nn.Linear(hidden, 1)
            torch.nn.init.normal_(head.weight, std=1.0 / math.sqrt(hidden + 1))
            torch.nn.init.zeros_(head.bias)
            head.to(next(backbone.parameters()).dtype)
        self.head = head
        self.register_buffer("offset", torch.tensor(float(offset)), persistent=False)

    @property
    def config(self) -> PreTrainedConfig:
        """The backbone's config (a transformers model's; a peft model forwards its base model's)."""
        return cast("PreTrainedConfig", self.backbone.config)

    @classmethod
    def from_causal_lm(cls, model: torch.nn.Module) -> ScalarModel:
        """A new scalar model whose backbone is a *copy* of the causal LM's transformer."""
        return cls(copy.deepcopy(cast(torch.nn.Module, model.base_model)))  # the transformer under the LM head

    @classmethod
    def from_pretrained(cls, path, dtype="float32") -> ScalarModel:
        """A scalar model from a directory or Hub id (see the module docstring for the layouts);
        non-finite weights are refused in one line."""
        model = from_hub_or_dir(lambda source: cls._load(source, dtype), path, "scalar model")  # failures: one line
        check_finite_weights(model, f"scalar model {path}")
        return model

    @classmethod
    def _load(cls, path, dtype) -> ScalarModel:
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

        path = resolve_model_dir(path, "scalar model")
        dtype = resolve_dtype(dtype)
        if isinstance(path, str):  # a Hub id: its config says which layout
            archs = from_hub_or_dir(AutoConfig.from_pretrained, path, "scalar model").architectures or []
        elif (path / HEAD_FILE).exists():  # the older layout: AutoModel backbone + head file + json
            meta = json.loads((path / META_FILE).read_text())
            backbone = AutoModel.from_pretrained(path, dtype=dtype)
            head = torch.nn.Linear(meta["hidden_size"], 1, bias=meta.get("bias", True))
            head.load_state_dict(load_file(str(path / HEAD_FILE)))
            offset = _number(meta.get("offset", 0.0), path / META_FILE, "offset")
            return cls(backbone, head.to(dtype), offset=offset)
        else:
            archs = AutoConfig.from_pretrained(path).architectures or []
        if any(a.endswith("ForSequenceClassification") for a in archs):
            seq, info = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=dtype, num_labels=1, output_loading_info=True
            )
            found = _sequence_head(seq)
            if found is None:
                raise ValueError(f"{path}: sequence-classification model without a linear 'score' or 'classifier' head")
            untrained = sorted(k for k in info.get("missing_keys", ()) if k.split(".")[0] == found[0])
            if untrained:  # transformers would score with a freshly initialised head: noise, not a reward
                raise ValueError(
                    f"{path}: its weights hold no trained {found[0]!r} head ({', '.join(untrained)} missing), so "
                    "it would score with a randomly initialised one; give a trained reward model's directory"
                )
            head = found[1]
            config = seq.config
            if getattr(config, SHIFT_KEY, None) is not None:  # saved by rlhfkit: rebuild the exact head
                bias = getattr(config, BIAS_KEY, None)
                exact = torch.nn.Linear(head.in_features, 1, bias=bias is not None, dtype=head.weight.dtype)
                with torch.no_grad():
                    exact.weight.copy_(head.weight)
                    if bias is not None:
                        exact.bias.fill_(float(bias))
                head = exact
            offset = _number(getattr(config, OFFSET_KEY, None) or 0.0, Path(str(path)) / "config.json", OFFSET_KEY)
            return cls(seq.base_model, head, offset=offset)
        return cls(AutoModel.from_pretrained(path, dtype=dtype))

    def save_pretrained(self, path, tokenizer=None) -> None:
        """Save as an HF ``<Arch>ForSequenceClassification`` with one label (see the module docstring).

        ``config.pad_token_id``: ``tokenizer.pad_token_id`` when a tokenizer is given, else the
        backbone config's — kept only if it is no EOS id. HF scores the last token that is not the
        pad id; every sequence rlhfkit scores ends with EOS, so a pad id equal to EOS would make HF
        read the token *before* it. It is then saved as ``null``: HF scores a single unpadded
        sequence at its last token (exactly like ``score``) and refuses padded batches instead of
        scoring the wrong token. Backbones without a sequence-classification class in transformers
        are saved in the older layout (with a warning).
        """
        path = Path(path)
        seq = self._as_sequence_classifier(tokenizer)
        if seq is None:
            return self.save_scalar_layout(path)
        seq.save_pretrained(path)
        (path / HEAD_FILE).unlink(missing_ok=True)  # a stale older-layout head would be read first
        config = seq.config
        meta = {
            "format": "hf_sequence_classification",
            "architecture": type(seq).__name__,
            "hidden_size": self.config.hidden_size,
            "bias": self.head.bias is not None,
            "offset": getattr(config, OFFSET_KEY),
            "head_bias": getattr(config, BIAS_KEY),
            "score_shift": getattr(config, SHIFT_KEY),
            "pad_token_id": config.get_text_config().pad_token_id,
        }
        (path / META_FILE).write_text(json.dumps(meta, indent=2))

    def _as_sequence_classifier(self, tokenizer=None):
        """An HF sequence classifier holding this backbone (the same modules, not a copy) and this
        head; ``None`` where transformers has no matching class (a last-token linear head)."""
        from transformers import AutoModelForSequenceClassification

        config = copy.deepcopy(self.config)
        config.num_labels = 1
        try:
            with torch.device("meta"):  # no second copy of the weights: its modules are replaced below
                seq = AutoModelForSequenceClassification.from_config(config)
        except (ValueError, KeyError) as err:
            warnings.warn(
                f"{type(self.backbone).__name__}: no sequence-classification class in transformers "
                f"({err}); saving the rlhfkit scalar layout",
                stacklevel=3,
            )
            return None
        prefix, found = seq.base_model_prefix, _sequence_head(seq)
        if (
            found is None
            or type(getattr(seq, prefix, None)) is not type(self.backbone)
            or found[1].in_features != config.hidden_size
        ):
            warnings.warn(
                f"{type(seq).__name__} is not a {type(self.backbone).__name__} plus a linear head; "
                "saving the rlhfkit scalar layout",
                stacklevel=3,
            )
            return None
        name, hf_head = found
        config = seq.config
        text = config.get_text_config()
        text.pad_token_id = _pooling_pad_id(text, tokenizer)
        setattr(seq, prefix, self.backbone)
        linear = cast(torch.nn.Linear, self.head)  # H -> 1 (peft's wrapper of a trained head forwards these)
        weight = linear.weight
        head = torch.nn.Linear(
            weight.shape[1], 1, bias=hf_head.bias is not None, device=weight.device, dtype=weight.dtype
        )
        bias = float(linear.bias.detach()) if linear.bias is not None else None
        offset = float(self.offset)
        with torch.no_grad():
            head.weight.copy_(weight)
            if head.bias is not None:  # fold the bias and the centring into the HF head's own bias
                head.bias.fill_((bias or 0.0) - offset)
        setattr(seq, name, head)
        setattr(config, OFFSET_KEY, offset)
        setattr(config, BIAS_KEY, bias)
        setattr(config, SHIFT_KEY, 0.0 if head.bias is not None else offset - (bias or 0.0))
        return seq

    def save_scalar_layout(self, path: Path) -> None:
        """The older layout: an ``AutoModel`` backbone, ``scalar_head.safetensors`` and ``rlhfkit_scalar.json``."""
        from safetensors.torch import save_file

        cast("PreTrainedModel | PeftModel", self.backbone).save_pretrained(str(path))
        state = {k: v.detach().contiguous() for k, v in self.head.state_dict().items()}
        save_file(state, str(path / HEAD_FILE))
        meta = {"hidden_size": self.config.hidden_size, "bias": "bias" in state, "offset": float(self.offset)}
        (path / META_FILE).write_text(json.dumps(meta, indent=2))

    def set_offset(self, offset: float) -> None:
        self.offset.fill_(float(offset))

    def _hidden(self, input_ids, attention_mask):
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
        return out.last_hidden_state

    def forward(self, input_ids, attention_mask, response_len: int) -> torch.Tensor:
        """``values`` (a wrapper such as DDP calls ``forward``)."""
        return self.values(input_ids, attention_mask, response_len)

    def values(self, input_ids, attention_mask, response_len: int) -> torch.Tensor:
        """(B, T) float32 value of the state before each of the last ``response_len`` tokens."""
        hidden = self._hidden(input_ids, attention_mask)[:, -(response_len + 1) : -1]
        return self.head(hidden).squeeze(-1).float()

    def score(self, input_ids, attention_mask) -> torch.Tensor:
        """(B,) float32 score at the last attended token of each row, minus ``offset``."""
        hidden = self._hidden(input_ids, attention_mask)
        last = last_token_index(attention_mask)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return self.head(hidden[rows, last]).squeeze(-1).float() - self.offset


def _number(value, file: Path, key: str) -> float:
    """``value`` as a float, or one line naming ``file`` and ``key`` (a reward model's saved score offset)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{file}: {key!r} must be a number (the saved score offset), got {value!r}") from None


def _sequence_head(seq):
    """``(name, module)`` of a sequence classifier's head — its one child with parameters besides
    the base model — when that is an ``nn.Linear`` with one output; else ``None``."""
    children = [
        (n, m) for n, m in seq.named_children() if n != seq.base_model_prefix and next(m.parameters(), None) is not None
    ]
    if len(children) == 1 and isinstance(children[0][1], torch.nn.Linear) and children[0][1].out_features == 1:
        return children[0]
    return None


def _pooling_pad_id(config, tokenizer=None) -> int | None:
    """The pad id HF's last-non-pad pooling may use: the tokenizer's (else the config's) pad id
    unless it is an EOS id (then ``None``, with a warning)."""
    pad = tokenizer.pad_token_id if tokenizer is not None else getattr(config, "pad_token_id", None)
    eos = eos_token_ids(config, tokenizer)
    if pad is not None and pad in eos:
        warnings.warn(
            f"pad id {pad} is an EOS id: HF sequence classification would score the token before the "
            "final EOS, so the saved config has pad_token_id null (batch size 1 scores exactly; pad "
            "batches with a distinct pad token and set config.pad_token_id to it)",
            stacklevel=4,
        )
        return None
    return pad
