"""TRL 1.16's ``RewardConfig`` and ``RewardTrainer`` on rlhfkit's reward-model trainer.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's ``RewardModelConfig``, with the
batch arithmetic of ``supervised.py`` (``per_device_train_batch_size`` pairs per process per
micro-step). The loss is TRL's: Bradley–Terry with the rows' ``margin`` when they have one, plus
``center_rewards_coefficient x mean((r_chosen + r_rejected)^2)``; rlhfkit's centring of the scores
after training (``center``) is off, as TRL has none. The data and the head are TRL's too: text
rows are tokenised as TRL tokenises them (``supervised.trl_encode``: the tokenizer's special
tokens, no second EOS; chat rows through the chat template with their ``tools`` and
``chat_template_kwargs``; tokenised rows as they are), a pair longer than ``max_length`` is dropped
(``_encode_pairs``), and the model is the sequence classifier TRL trains, ``peft`` included
(``reward_models.py``).
"""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import distributed
from ..config.supervised import RewardModelConfig
from ..data.encode import note_unknown
from ..data.preferences import is_tokenized, load_preference_dataset
from ..files import writing
from ..models import load_tokenizer
from ..models.loading import resolve_dtype
from ..models.lora import is_peft
from ..trainers.reward_model import Pair, RewardModelTrainer, tokenized_pair
from ..trainers.reward_scoring import Scorer
from .callbacks import trl_callbacks
from .metrics import REWARD_METRICS
from .reward_models import classifier_parts, merged_scalar, scalar_view, trl_reward_model
from .supervised import SupervisedArguments, SupervisedTRLTrainer, trl_encode


@dataclass
class RewardConfig(SupervisedArguments):
    """TRL 1.16's ``RewardConfig``: its fields, defaults and checks; ``to_rlhfkit`` gives the
    rlhfkit ``RewardModelConfig`` it runs as (docs: "Coming from TRL")."""

    learning_rate: float = 1e-4
    chat_template_path: str | None = None
    disable_dropout: bool = True
    eos_token: str | None = None
    center_rewards_coefficient: float | None = None

    # Translated by to_rlhfkit or applied by the trainer (the tokens and template, on the tokenizer).
    HANDLED = SupervisedArguments.HANDLED | {
        "chat_template_path",
        "disable_dropout",
        "eos_token",
        "center_rewards_coefficient",
    }

    def __post_init__(self):
        super().__post_init__()
        if not self.disable_dropout:
            raise ValueError(
                "RewardConfig field 'disable_dropout'=False is not supported by rlhfkit: its reward "
                "models always score without dropout"
            )

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> RewardModelConfig:
        """The rlhfkit ``RewardModelConfig`` of this config for ``n_rows`` pairs on ``world`` processes."""
        fields = self.supervised_fields(n_rows, world)
        fields.update(center=False, center_rewards_coefficient=self.center_rewards_coefficient)
        return RewardModelConfig(**fields)


class RewardTrainer(SupervisedTRLTrainer, RewardModelTrainer):
    """TRL's ``RewardTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class,
    compute_metrics, callbacks, optimizers, optimizer_cls_and_kwargs, preprocess_logits_for_metrics,
    quantization_config, peft_config)`` on rlhfkit's reward-model trainer. ``model``: a directory or
    Hub id, a sequence classifier with one label (or a ``peft`` model of one), or a causal-LM object
    (rlhfkit's fresh head; TRL refuses one); ``trainer.model`` is the sequence classifier TRL trains
    (``reward_models.py``). ``args``: a ``RewardConfig`` (default: TRL's, writing to ``<model
    name>-Reward``). ``save_model`` writes an ``<Arch>ForSequenceClassification`` directory with one
    label (a ``peft`` model's adapter merged into a copy)."""

    config_class, suffix, loss_key = RewardConfig, "Reward", "rm/loss"
    trl_table = REWARD_METRICS
    trl_eval_attr = "eval_pairs"  # the rlhfkit trainer's tokenised evaluation set

    def __init__(
        self,
        model,
        args=None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        optimizer_cls_and_kwargs=None,
        preprocess_logits_for_metrics=None,
        quantization_config=None,
        peft_config=None,
    ):
        refused = dict(
            data_collator=data_collator,
            compute_metrics=compute_metrics,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
            quantization_config=quantization_config,
        )
        native, _ = self.native(
            model, args, train_dataset, eval_dataset, lambda d: len(load_preference_dataset(d)), optimizers, refused
        )
        a = self.trl_args
        seq = trl_reward_model(model, a.seed, resolve_dtype(native.dtype), a.trust_remote_code, peft_config)
        tokenizer = self.trl_tokenizer(model, processing_class, a.eos_token, a.pad_token, a.chat_template_path)
        if tokenizer is None:
            tokenizer = load_tokenizer(model, "model")
        self.trl_model, self._trl_template = seq, None
        if seq is not None:
            _mirror_tokens(seq, tokenizer, eos=a.eos_token is not None)
            backbone = classifier_parts(seq)[0]
            if (
                is_peft(seq)
                and native.gradient_checkpointing != "off"
                and hasattr(backbone, "enable_input_require_grads")
            ):
                backbone.enable_input_require_grads()  # frozen embeddings pass gradients on
            if is_peft(seq) and distributed.planned_world() > 1 and distributed.launch_rank() == 0:
                self._trl_template = copy.deepcopy(seq).cpu()  # merged from here at save time (FSDP2)
        super().__init__(
            model if seq is None else scalar_view(seq),
            native,
            train_dataset,
            eval_dataset,
            processing_class=tokenizer,
            peft_config=peft_config if seq is None else None,  # applied to the classifier, as TRL does
            callbacks=trl_callbacks(callbacks, self),
        )

    def trl_source(self, dataset, name: str, limit: int | None = None):
        """TRL's legacy tokenised columns ``chosen_input_ids`` / ``rejected_input_ids`` renamed to
        ``chosen_ids`` / ``rejected_ids`` with TRL's ``FutureWarning``, then the stream's rows."""
        columns = _column_names(dataset)
        if {"chosen_input_ids", "rejected_input_ids"} <= columns and not {"chosen_ids", "rejected_ids"} <= columns:
            warnings.warn(
                "Detected legacy dataset columns `chosen_input_ids`/`rejected_input_ids`; they are deprecated and "
                "will not be supported in v1. Please migrate to `chosen_ids`/`rejected_ids`.",
                FutureWarning,
                stacklevel=4,
            )
            names = {"chosen_input_ids": "chosen_ids", "rejected_input_ids": "rejected_ids"}
            if isinstance(dataset, (list, tuple)):
                dataset = [{names.get(k, k): v for k, v in row.items()} for row in dataset]
            else:
                dataset = dataset.rename_columns(names)
        return super().trl_source(dataset, name, limit)

    def _encode_pairs(self, rows: list[dict], name: str) -> list[Pair]:
        """TRL's tokens and length rule, not rlhfkit's (which cuts a long prompt's start and drops a
        pair only when its completion does not fit). Text rows: ``trl_encode`` (prompt + completion
        + EOS, the tokenizer's special tokens); chat rows: the whole conversation, prompt then
        completion, through the chat template (``apply_chat_template``, with the row's ``tools``
        and ``chat_template_kwargs``: TRL's ``_tokenize``); tokenised rows as they are. A pair
        either of whose sequences is longer than ``max_length`` is dropped; nothing is cut."""
        pairs, limit = [], self.args.max_length
        for i, row in enumerate(rows):
            try:
                pair = tokenized_pair(row) if is_tokenized(row) else Pair(*self._trl_ids(row), _margin(row))
            except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
                raise ValueError(f"{name}: pair {i} (0-based): {e}") from None
            if max(len(pair.chosen), len(pair.rejected)) <= limit:
                pairs.append(pair)
        note_unknown(name, [(p.chosen, p.rejected) for p in pairs], self.tokenizer, "pairs")
        return self.trl_kept_pairs(pairs, len(rows) - len(pairs), len(rows), name, limit, "longer than")

    def _trl_ids(self, row: dict) -> tuple[list[int], list[int]]:
        """The chosen and rejected token ids of a text or chat row, as TRL tokenises them."""
        if not (isinstance(row["prompt"], list) and isinstance(row["chosen"], list)):  # text (rlhfkit: or mixed)
            chosen, rejected = (
                trl_encode(row["prompt"], row[k], self.tokenizer).input_ids for k in ("chosen", "rejected")
            )
            return chosen, rejected
        tools = row.get("tools")
        try:
            tools = json.loads(tools) if isinstance(tools, str) else tools
        except json.JSONDecodeError as e:
            raise ValueError(f"field 'tools': invalid JSON: {e.msg}") from None
        kwargs = {"tools": tools, **(row.get("chat_template_kwargs") or {})}
        chosen, rejected = (
            list(
                self.tokenizer.apply_chat_template(
                    list(row["prompt"]) + list(row[k]), tokenize=True, return_dict=True, **kwargs
                )["input_ids"]
            )
            for k in ("chosen", "rejected")
        )
        return chosen, rejected

    def trl_prediction_batches(self, items: list[Pair]):
        """``compute_metrics``' predictions as TRL's: per evaluation batch, its chosen scores then its
        rejected scores, shape ``(2 x rows, 1)``; no labels (``evaluation.py``)."""
        size = self.trl_args.per_device_eval_batch_size
        self.scorer.eval()
        for i in range(0, len(items), size):
            with torch.no_grad():
                chosen, rejected, _ = self._score_pairs(items[i : i + size])
            yield self._trl_preprocessed(torch.cat([chosen, rejected]).unsqueeze(-1), None)

    def save_model(self, output_dir=None) -> None:
        """An ``<Arch>ForSequenceClassification`` directory with one label (rlhfkit's reward-model
        layout, ``ScalarModel.save_pretrained``) and the tokenizer in ``output_dir`` (default: the
        config's); a ``peft`` classifier's adapter merged into a copy first."""
        if self.trl_model is None or not is_peft(self.trl_model):
            return super().save_model(output_dir)
        path, source = Path(output_dir or self.args.output_dir), self.trl_model
        if distributed.role_size() > 1 and self.args.parallelism == "fsdp":
            state = distributed.full_state_dict(self.scorer)  # a collective; keys "model.<name>"
            source = self._trl_template
            if source is not None:
                Scorer(scalar_view(source)).load_state_dict(state)
        if distributed.is_main():
            with writing(path):  # a full disk: one line naming the directory
                merged_scalar(source).save_pretrained(path, tokenizer=self.tokenizer)
                self.tokenizer.save_pretrained(path)
        distributed.role_barrier()


def _margin(row: dict) -> float | None:
    return float(row["margin"]) if row.get("margin") is not None else None


def _column_names(dataset) -> set[str]:
    """The columns of a ``datasets.Dataset`` / ``IterableDataset`` or of a list of dicts' first row."""
    if isinstance(dataset, (list, tuple)):
        return set(dataset[0]) if dataset and isinstance(dataset[0], dict) else set()
    names = getattr(dataset, "column_names", None)
    return set(names) if isinstance(names, (list, tuple)) else set()


def _mirror_tokens(seq, tokenizer, eos: bool) -> None:
    """The tokenizer's pad id (and with ``eos``, the ``eos_token`` the config set: its id) on the
    classifier's config, as TRL sets them (transformers' pooling finds a row's last token by the pad id)."""
    config = seq.config.get_text_config()
    config.pad_token_id = tokenizer.pad_token_id
    if eos:
        config.eos_token_id = tokenizer.eos_token_id
