"""TRL 1.16's ``RewardConfig`` and ``RewardTrainer`` on rlhfkit's reward-model trainer.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's ``RewardModelConfig``, with the
batch arithmetic of ``supervised.py`` (``per_device_train_batch_size`` pairs per process per
micro-step). The loss is TRL's: Bradley–Terry with the rows' ``margin`` when they have one, plus
``center_rewards_coefficient x mean((r_chosen + r_rejected)^2)``; rlhfkit's centring of the scores
after training (``center``) is off, as TRL has none.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.supervised import RewardModelConfig
from ..data.preferences import load_preference_dataset
from ..trainers.reward_model import RewardModelTrainer
from .supervised import SupervisedArguments, SupervisedTRLTrainer


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
    HANDLED = SupervisedArguments.HANDLED | {"chat_template_path", "disable_dropout", "eos_token",
                                             "center_rewards_coefficient"}

    def __post_init__(self):
        super().__post_init__()
        if not self.disable_dropout:
            raise ValueError("RewardConfig field 'disable_dropout'=False is not supported by rlhfkit: its reward "
                             "models always score without dropout")

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> RewardModelConfig:
        """The rlhfkit ``RewardModelConfig`` of this config for ``n_rows`` pairs on ``world`` processes."""
        fields = self.supervised_fields(n_rows, world)
        fields.update(center=False, center_rewards_coefficient=self.center_rewards_coefficient)
        return RewardModelConfig(**fields)


class RewardTrainer(SupervisedTRLTrainer, RewardModelTrainer):
    """TRL's ``RewardTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class,
    compute_metrics, callbacks, optimizers, optimizer_cls_and_kwargs, preprocess_logits_for_metrics,
    quantization_config, peft_config)`` on rlhfkit's reward-model trainer. ``model``: a causal LM's
    or a sequence classifier's directory or Hub id (a fresh score head on the first), or a causal-LM
    object; ``args``: a ``RewardConfig`` (default: TRL's, writing to ``<model name>-Reward``).
    ``save_model`` writes an ``<Arch>ForSequenceClassification`` directory with one label."""

    config_class, suffix, loss_key = RewardConfig, "Reward", "rm/loss"

    def __init__(self, model, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, compute_metrics=None, callbacks=None, optimizers=(None, None),
                 optimizer_cls_and_kwargs=None, preprocess_logits_for_metrics=None, quantization_config=None,
                 peft_config=None):
        if type(model).__name__.endswith("ForSequenceClassification"):
            raise ValueError("RewardTrainer: a sequence-classification model object is not supported by rlhfkit: pass "
                             "its directory (save_pretrained), from which rlhfkit loads its score head")
        refused = dict(data_collator=data_collator, compute_metrics=compute_metrics,
                       optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
                       preprocess_logits_for_metrics=preprocess_logits_for_metrics,
                       quantization_config=quantization_config)
        native, eval_dataset = self.native(model, args, train_dataset, eval_dataset,
                                           lambda d: len(load_preference_dataset(d)), optimizers, refused)
        a = self.trl_args
        tokenizer = self.trl_tokenizer(model, processing_class, a.eos_token, a.pad_token, a.chat_template_path)
        super().__init__(model, native, train_dataset, eval_dataset, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=callbacks)
