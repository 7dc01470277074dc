"""TRL 1.16's ``KTOConfig`` and ``KTOTrainer`` on rlhfkit's KTO trainer.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's ``KTOConfig``, with the batch
arithmetic of ``supervised.py`` (``per_device_train_batch_size`` rows per process per micro-step).
Both of TRL's ``loss_type`` values are formulas of rlhfkit's algorithm core (``algorithms/kto.py``).
TRL reads the rows in order (``train_sampling_strategy="sequential"``, its default): so does the
drop-in (``shuffle=False``), and each micro-batch's mismatched pairs are TRL's, its completions
rotated by one. The data are TRL's too (``_encode``): unpaired rows, or paired rows split in two as
TRL splits them (``data.unpaired``); text tokenised as TRL tokenises it (``supervised.trl_encode``),
chat rows through the chat template (``dpo.trl_chat_ids``); ``max_length`` drops a row whose prompt
fills it and cuts each sequence (the mismatched ones too) to its first ``max_length`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config.supervised import KTOConfig as NativeKTOConfig
from ..data.encode import note_unknown
from ..data.unpaired import load_unpaired_dataset
from ..trainers.kto import KTOExample
from ..trainers.kto import KTOTrainer as NativeKTOTrainer
from .callbacks import trl_callbacks
from .dpo import trl_chat_ids
from .supervised import SupervisedArguments, SupervisedTRLTrainer, trl_encode

LOSS_TYPES = ("kto", "apo_zero_unpaired")

# TRL's metric name -> rlhfkit's (the names TRL and rlhfkit share need no entry).
KTO_METRICS = {
    "loss": "kto/loss",
    "grad_norm": "perf/grad_norm",
    "learning_rate": "perf/lr",
    "epoch": "kto/epoch",
    "eval_loss": "eval/loss",
    **{
        f"eval_{k}": f"eval/{k}"
        for k in (
            "kl",
            "rewards/chosen",
            "rewards/rejected",
            "rewards/margins",
            "logps/chosen",
            "logps/rejected",
        )
    },
}


@dataclass
class KTOConfig(SupervisedArguments):
    """TRL 1.16's ``KTOConfig``: its fields, defaults and checks; ``to_rlhfkit`` gives the
    rlhfkit ``KTOConfig`` it runs as (docs: "Coming from TRL")."""

    learning_rate: float = 1e-6
    train_sampling_strategy: str = "sequential"
    router_aux_loss_coef: float | None = None
    disable_dropout: bool = True
    precompute_ref_log_probs: bool = False
    precompute_ref_batch_size: int | None = None
    loss_type: str = "kto"
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512

    # Translated by to_rlhfkit; precompute_ref_batch_size only sets how many rows one reference pass
    # scores. Any other: default only.
    HANDLED = SupervisedArguments.HANDLED | {
        "train_sampling_strategy",
        "disable_dropout",
        "precompute_ref_log_probs",
        "precompute_ref_batch_size",
        "loss_type",
        "beta",
        "desirable_weight",
        "undesirable_weight",
        "sync_ref_model",
        "ref_model_mixup_alpha",
        "ref_model_sync_steps",
    }

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"KTOConfig field 'loss_type'={self.loss_type!r} must be one of {', '.join(LOSS_TYPES)}")
        if self.train_sampling_strategy not in ("sequential", "random"):
            raise ValueError(
                f"KTOConfig field 'train_sampling_strategy'={self.train_sampling_strategy!r} is not supported by "
                "rlhfkit: 'sequential' (the dataset's order) or 'random' (a seeded shuffle per epoch)"
            )
        if self.sync_ref_model and self.precompute_ref_log_probs:
            raise ValueError(  # TRL's message (its trainer's)
                "You cannot use `sync_ref_model=True` together with `precompute_ref_log_probs=True`. "
                "`precompute_ref_log_probs=True` assumes a fixed reference model, but with `sync_ref_model=True` "
                "the reference model is periodically updated during training, making any precomputed reference "
                "log-probs stale. Set `precompute_ref_log_probs=False` or disable `sync_ref_model`."
            )
        if not self.disable_dropout:
            raise ValueError(
                "KTOConfig field 'disable_dropout'=False is not supported by rlhfkit: its KTO always turns "
                "dropout off (the implicit rewards must not be noise)"
            )

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> NativeKTOConfig:
        """The rlhfkit ``KTOConfig`` of this config for ``n_rows`` rows on ``world`` processes."""
        fields = self.supervised_fields(n_rows, world)
        fields.update(
            loss_type=self.loss_type,
            beta=self.beta,
            desirable_weight=self.desirable_weight,
            undesirable_weight=self.undesirable_weight,
            shuffle=self.train_sampling_strategy == "random",
            precompute_ref_logprobs=self.precompute_ref_log_probs,
            sync_ref_model=self.sync_ref_model,
            ref_model_mixup_alpha=self.ref_model_mixup_alpha,
            ref_model_sync_steps=self.ref_model_sync_steps,
        )
        return NativeKTOConfig(**fields)


class KTOTrainer(SupervisedTRLTrainer, NativeKTOTrainer):
    """TRL's ``KTOTrainer(model, ref_model, args, data_collator, train_dataset, eval_dataset,
    processing_class, compute_metrics, callbacks, optimizers, quantization_config, peft_config)`` on
    rlhfkit's KTO trainer. ``args``: a ``KTOConfig`` (default: TRL's, writing to ``<model name>-KTO``);
    ``ref_model``: None is a frozen copy of the initial model (with ``peft_config``: the model with
    its adapter off; with ``precompute_ref_log_probs``: the model itself before its first update), as
    in TRL; ``trainer.ref_model`` is the reference model kept (None when there is none)."""

    config_class = KTOConfig
    suffix, loss_key = "KTO", "kto/loss"
    model: Any  # the policy (the rlhfkit trainer sets it)
    trl_table = KTO_METRICS
    aux_loss_enabled = False  # TRL's flag for a Mixture-of-Experts load-balancing loss: rlhfkit adds none

    def __init__(
        self,
        model,
        ref_model=None,
        args=None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
    ):
        if compute_metrics is not None:
            raise ValueError(
                "KTOTrainer: compute_metrics=... is not supported by rlhfkit (TRL 1.16 deprecates it for KTO: the "
                "logits are recomputed by an extra pass); its metrics are the loss, kl, rewards/* and logps/*"
            )
        refused = dict(data_collator=data_collator, quantization_config=quantization_config)
        native, eval_dataset = self.native(
            model, args, train_dataset, eval_dataset, lambda d: len(load_unpaired_dataset(d)), optimizers, refused
        )
        a = self.trl_args
        uses_kl = a.loss_type != "apo_zero_unpaired"
        if uses_kl and a.train_sampling_strategy != "sequential":
            raise ValueError(  # TRL's message
                f"Loss type `'{a.loss_type}'` estimates the KL divergence term and requires "
                f"`train_sampling_strategy='sequential'` because the KL completion for each example is precomputed "
                f"against its neighbors in a fixed-order batch; any other strategy breaks that pairing. "
                f"Got `train_sampling_strategy='{a.train_sampling_strategy}'`."
            )
        if uses_kl and a.per_device_train_batch_size <= 1:
            raise ValueError(  # TRL's message
                "Actual (not effective) batch size must be > 1. KTO will not work properly because the KL term "
                "will be equivalent to the implied reward."
            )
        tokenizer = self.trl_tokenizer(model, processing_class, pad_token=a.pad_token)
        super().__init__(
            model,
            native,
            train_dataset,
            eval_dataset,
            processing_class=tokenizer,
            ref_model=ref_model,
            peft_config=peft_config,
            callbacks=trl_callbacks(callbacks, self),
        )

    @property
    def ref_model(self):
        """TRL's ``trainer.ref_model``: the reference model (None under LoRA and with
        ``precompute_ref_log_probs`` and no ``ref_model``)."""
        return self.reference

    # ---------------------------------------------------------------- the drop-in's data
    trl_eval_attr = "eval_rows"

    def trl_load(self, dataset, name: str) -> list[dict]:
        return load_unpaired_dataset(dataset, name)

    def trl_encode(self, rows: list[dict], name: str) -> list:
        return self._encode(rows, name)

    @property
    def train_dataset(self):
        """TRL's prepared training set: ``prompt_ids``, ``completion_ids`` and ``label`` columns."""
        if "train" not in self._trl_views:
            self._trl_views["train"] = _view(self.train_rows)
        return self._trl_views["train"]

    @property
    def eval_dataset(self):
        """TRL's prepared evaluation set(s): None, one dataset, or a dict of them by name."""
        if not self.trl_eval_sets:
            return None
        views = {n: _view(items) for n, items in self.trl_eval_sets.items()}
        return views[None] if None in views else views

    def _encode(self, rows: list[dict], name: str) -> list[KTOExample]:
        """TRL's tokens and length filter, not rlhfkit's: a row whose prompt alone fills
        ``max_length`` is dropped; the others keep their whole completion here, cut with their
        mismatched one when a micro-batch is formed (``_items``: TRL's keep_start)."""
        examples, limit = [], self.args.max_length
        for i, row in enumerate(rows):
            try:
                if isinstance(row["prompt"], list):
                    enc = trl_chat_ids(row, [row["completion"]], self.tokenizer)[0]
                else:
                    enc = trl_encode(row["prompt"], row["completion"], self.tokenizer)
            except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
                raise ValueError(f"{name}: row {i} (0-based): {e}") from None
            prompt = enc.input_ids[: enc.prompt_len]
            if len(prompt) < limit:
                examples.append(KTOExample(prompt, enc.input_ids[enc.prompt_len :], row["label"]))
        note_unknown(name, [(e.prompt, e.completion) for e in examples], self.tokenizer, "rows")
        return self._kept(examples, len(rows) - len(examples), len(rows), name, "whose prompt fills")


def _view(rows: list[KTOExample]):
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "prompt_ids": [r.prompt for r in rows],
            "completion_ids": [r.completion for r in rows],
            "label": [r.label for r in rows],
        }
    )
