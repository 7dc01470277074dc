"""Scalar-head models: the PPO critic (a value per response token) and the reward model (one
score per sequence, read at its last attended token). One class serves both: a transformer
backbone plus a linear head ``H -> 1``.

Saved layout (a directory): the backbone as a normal HF model (safetensors), ``scalar_head.safetensors``
and ``rlhfkit_scalar.json`` (head size and the reward centring offset). ``from_pretrained`` also
accepts an ``AutoModelForSequenceClassification`` directory with one label, or a plain causal-LM
directory (fresh head).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch

from ..algorithms import last_token_index
from .loading import _check_dir, disable_dropout, resolve_dtype
from .policy import position_ids_from_mask

META_FILE, HEAD_FILE = "rlhfkit_scalar.json", "scalar_head.safetensors"


class ScalarModel(torch.nn.Module):
    """``backbone`` returns ``last_hidden_state``; ``head`` maps it to one number per position.

    ``offset`` is subtracted from every score: a trained reward model stores the mean score of a
    reference set there, so loaded scores are centred (its head stays untouched).
    """

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Module | None = None, offset: float = 0.0):
        super().__init__()
        self.backbone = disable_dropout(backbone)
        hidden = backbone.config.hidden_size
        if head is None:
            # std 1/sqrt(H+1): the value/reward head init of "The N Implementation Details of RLHF with PPO".
            head = torch.nn.Linear(hidden, 1)
            torch.nn.init.normal_(head.weight, std=1.0 / math.sqrt(hidden + 1))
            torch.nn.init.zeros_(head.bias)
            head.to(next(backbone.parameters()).dtype)
        self.head = head
        self.register_buffer("offset", torch.tensor(float(offset)), persistent=False)

    @property
    def config(self):
        return self.backbone.config

    @classmethod
    def from_causal_lm(cls, model: torch.nn.Module) -> "ScalarModel":
        """A new scalar model whose backbone is a *copy* of the causal LM's transformer."""
        return cls(copy.deepcopy(model.base_model))

    @classmethod
    def from_pretrained(cls, path, dtype="float32") -> "ScalarModel":
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification
        from safetensors.torch import load_file

        path = _check_dir(path, "scalar model")
        dtype = resolve_dtype(dtype)
        if (path / META_FILE).exists():
            meta = json.loads((path / META_FILE).read_text())
            backbone = AutoModel.from_pretrained(path, dtype=dtype)
            head = torch.nn.Linear(meta["hidden_size"], 1, bias=meta.get("bias", True))
            head.load_state_dict(load_file(str(path / HEAD_FILE)))
            return cls(backbone, head.to(dtype), offset=meta.get("offset", 0.0))
        archs = AutoConfig.from_pretrained(path).architectures or []
        if any(a.endswith("ForSequenceClassification") for a in archs):
            seq = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, num_labels=1)
            head = getattr(seq, "score", None) or getattr(seq, "classifier", None)
            if head is None:
                raise ValueError(f"{path}: sequence-classification model without a 'score' or 'classifier' head")
            return cls(seq.base_model, head)
        return cls(AutoModel.from_pretrained(path, dtype=dtype))

    def save_pretrained(self, path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        self.backbone.save_pretrained(path)
        state = {k: v.detach().contiguous() for k, v in self.head.state_dict().items()}
        save_file(state, str(path / HEAD_FILE))
        meta = {"hidden_size": self.config.hidden_size, "bias": "bias" in state, "offset": float(self.offset)}
        (path / META_FILE).write_text(json.dumps(meta, indent=2))

    def set_offset(self, offset: float) -> None:
        self.offset.fill_(float(offset))

    def _hidden(self, input_ids, attention_mask):
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_from_mask(attention_mask), use_cache=False)
        return out.last_hidden_state

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
