"""TRL 1.16's ``RewardConfig`` and ``RewardTrainer`` on rlhfkit's reward-model trainer.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's ``RewardModelConfig``, with the
batch arithmetic of ``supervised.py`` (``per_device_train_batch_size`` pairs per process per
micro-step). The loss is TRL's: Bradley–Terry with the rows' ``margin`` when they have one, plus
``center_rewards_coefficient x mean((r_chosen + r_rejected)^2)``; rlhfkit's centring of the scores
after training (``center``) is off, as TRL has none. The data and the head are TRL's too: text
rows are tokenised as TRL tokenises them (``supervised.trl_encode``: the tokenizer's special
tokens, no second EOS), a pair longer than ``max_length`` is dropped (``_encode_pairs``), and a
causal LM gets TRL's score head (``_load_model``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config.supervised import RewardModelConfig
from ..data.encode import note_unknown
from ..data.preferences import load_preference_dataset
from ..models import ScalarModel
from ..models.heads import HEAD_FILE
from ..models.loading import check_finite_weights, resolve_dtype
from ..models.sources import from_hub_or_dir, resolve_model_dir
from ..trainers.reward_model import Pair, RewardModelTrainer
from .callbacks import trl_callbacks
from .metrics import REWARD_METRICS
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
    quantization_config, peft_config)`` on rlhfkit's reward-model trainer. ``model``: a causal LM's
    or a sequence classifier's directory or Hub id (TRL's score head on the first, drawn from
    ``seed``), or a causal-LM object (rlhfkit's fresh head; TRL refuses one); ``args``: a
    ``RewardConfig`` (default: TRL's, writing to ``<model name>-Reward``). ``save_model`` writes an
    ``<Arch>ForSequenceClassification`` directory with one label."""

    config_class, suffix, loss_key = RewardConfig, "Reward", "rm/loss"
    trl_table = REWARD_METRICS

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
        if type(model).__name__.endswith("ForSequenceClassification"):
            raise ValueError(
                "RewardTrainer: a sequence-classification model object is not supported by rlhfkit: pass "
                "its directory (save_pretrained), from which rlhfkit loads its score head"
            )
        refused = dict(
            data_collator=data_collator,
            compute_metrics=compute_metrics,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
            quantization_config=quantization_config,
        )
        native, eval_dataset = self.native(
            model, args, train_dataset, eval_dataset, lambda d: len(load_preference_dataset(d)), optimizers, refused
        )
        a = self.trl_args
        tokenizer = self.trl_tokenizer(model, processing_class, a.eos_token, a.pad_token, a.chat_template_path)
        super().__init__(
            model,
            native,
            train_dataset,
            eval_dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=trl_callbacks(callbacks, self),
        )

    def _encode_pairs(self, rows: list[dict], name: str) -> list[Pair]:
        """TRL's tokens (``trl_encode``) and length rule, not rlhfkit's (which cuts a long prompt's
        start and drops a pair only when its completion does not fit): a pair either of whose
        sequences, prompt + completion + EOS, is longer than ``max_length`` is dropped; nothing is cut."""
        pairs, limit = [], self.args.max_length
        for i, row in enumerate(rows):
            try:
                chosen, rejected = (trl_encode(row["prompt"], row[k], self.tokenizer) for k in ("chosen", "rejected"))
            except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
                raise ValueError(f"{name}: pair {i} (0-based): {e}") from None
            if max(len(chosen.input_ids), len(rejected.input_ids)) <= limit:
                margin = float(row["margin"]) if row.get("margin") is not None else None
                pairs.append(Pair(chosen.input_ids, rejected.input_ids, margin))
        note_unknown(name, [(p.chosen, p.rejected) for p in pairs], self.tokenizer, "pairs")
        return self.trl_kept_pairs(pairs, len(rows) - len(pairs), len(rows), name, limit, "longer than")

    def _load_model(self, model) -> ScalarModel:
        """A causal LM's directory or Hub id gets TRL's score head, not rlhfkit's fresh one (normal,
        std 1/sqrt(H+1), a bias): ``transformers.set_seed(seed)``, then
        ``AutoModelForSequenceClassification.from_pretrained(model, num_labels=1)``, as TRL's
        RewardTrainer loads it — transformers' initialisation of the head (std ``initializer_range``),
        drawn from the same seed. A sequence classifier's directory, rlhfkit's scalar layout or a
        model object: as rlhfkit loads them."""
        if not isinstance(model, (str, os.PathLike)):
            return super()._load_model(model)
        from transformers import AutoConfig, AutoModelForSequenceClassification, set_seed

        source = resolve_model_dir(model, "model")
        if isinstance(source, Path) and ((source / HEAD_FILE).exists() or not (source / "config.json").exists()):
            return super()._load_model(model)
        archs = from_hub_or_dir(AutoConfig.from_pretrained, source, "model").architectures or []
        if any(a.endswith("ForSequenceClassification") for a in archs):
            return super()._load_model(model)
        from transformers.utils import logging as hf_logging

        set_seed(self.args.seed)
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # not the load report of the new head (TRL hides it too)
        try:
            seq = from_hub_or_dir(
                AutoModelForSequenceClassification.from_pretrained,
                source,
                "model",
                num_labels=1,
                dtype=resolve_dtype(self.args.dtype),
            )
        finally:
            hf_logging.set_verbosity(level)
        heads = [
            m
            for name, m in seq.named_children()
            if name != seq.base_model_prefix and next(m.parameters(), None) is not None
        ]
        if len(heads) != 1 or not isinstance(heads[0], torch.nn.Linear):  # no linear score head: rlhfkit's own
            return super()._load_model(model)
        scalar = ScalarModel(seq.base_model, heads[0])
        check_finite_weights(scalar, f"model {model}")
        return scalar
