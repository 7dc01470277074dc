"""TRL 1.16's ``GRPOTrainer`` and ``RLOOTrainer`` on rlhfkit's one RL loop: TRL's constructor (its
argument forms: ``rl_inputs.py``), TRL's attributes (``model``, ``ref_model``, ``train_dataset``,
``eval_dataset``, ``reward_funcs``, ``reward_func_names``, ``reward_processing_classes``,
``entropy_coef``, ``aux_loss_enabled``; the policy carries TRL's model tags), its evaluation
(``rl_eval.py``), its ``state.log_history`` (``rl_rows.py``) and the warnings TRL logs, under TRL's
logger names (``trl.trainer.grpo_trainer``, ``trl.trainer.rloo_trainer``), where TRL logs them."""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from pathlib import Path
from typing import TypedDict

import torch
from transformers import TrainingArguments

from ..trainers.rl import RLTrainer
from .callbacks import trl_callbacks
from .grpo import GRPOConfig, RLOOConfig
from .rl_eval import TRLRLEvaluation
from .rl_inputs import (
    is_iterable_dataset,
    prompt_rows,
    reward_sources,
    tokenizer_for,
    trl_config,
    with_template_kwargs,
)
from .rl_rows import TRLRLRows
from .state import TRLTrainerMixin


class GRPOTrainer(TRLRLRows, TRLRLEvaluation, TRLTrainerMixin, RLTrainer):
    """TRL's ``GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
    reward_processing_classes, callbacks, optimizers, peft_config, tools, environment_factory)``
    on rlhfkit's RL loop. ``args``: a ``GRPOConfig`` (default: TRL's, writing to
    ``<model name>-GRPO``) or a ``transformers.TrainingArguments``."""

    config_class: type[TrainingArguments] = GRPOConfig  # RLOOConfig, DistillationConfig in the subclasses
    suffix = "GRPO"
    loss_key = "policy/total_loss"  # TRL's train_loss: the mean of the whole loss
    logger_name = "trl.trainer.grpo_trainer"
    _tag_names = ["trl", "grpo"]

    def __init__(
        self,
        model,
        reward_funcs=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        tools=None,
        environment_factory=None,
    ):
        args = trl_config(args, self.config_class)
        if train_dataset is None:
            raise ValueError("`train_dataset` is required unless an `environment_factory` is provided.")
        sources: list
        classes: list
        if reward_funcs is None and environment_factory is not None:
            sources, classes = [], []  # the environments' get_reward scores
        else:
            sources, classes, _ = reward_sources(reward_funcs, reward_processing_classes)
        args = self.trl_config(model, args, optimizers)
        processing_class = with_template_kwargs(
            model, tokenizer_for(model, processing_class), args.chat_template_kwargs
        )
        self.trl_stream_settings(args, train_dataset, eval_dataset)
        train_rows = self._train_rows(args, train_dataset)
        native, _, weights = self.translate(model, args, train_rows, None, None, optimizers)
        self.trl_rows, self.trl_window, self.trl_eval_data = [], [], {}
        super().__init__(
            model,
            sources,
            native,
            train_rows,
            processing_class=processing_class,
            reward_weights=weights,
            peft_config=peft_config,
            tools=tools,
            environment_factory=environment_factory,
            callbacks=trl_callbacks(callbacks, self),
        )
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.reward_processing_classes, self.reward_func_names = classes, list(self.sampler.rewards.names)
        self.trl_eval_data = self.trl_prepare_eval(eval_dataset)
        per = args.optimizer_steps_per_generation
        if not is_iterable_dataset(train_dataset):
            self.trl_steps_per_epoch = len(train_rows) // native.prompts_per_step * per or None
        # Reward functions' trainer_state counts optimizer steps, as TRL's self.state does.
        self.sampler.state_steps_per_step = per
        self.sampler.rewards = TRLRewardView(
            self.sampler.rewards, logging.getLogger(self.logger_name), args.generation_batch_size
        )
        self._logs = self.sampler.rewards.logs  # TRL's table of the latest completions
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names)
        self.trl_warnings()

    def trl_stream_settings(self, args, train_dataset, eval_dataset) -> None:
        """TRL's rules for a stream (``datasets.IterableDataset``), applied to ``args`` as TRL applies
        them (rlhfkit reads neither setting: its prompts are read before the run): any stream needs
        ``accelerator_config.dispatch_batches`` False (refused when True, else set), a streamed train
        set ``dataloader_num_workers=0`` (set, with TRL's warning)."""
        evals = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
        if is_iterable_dataset(train_dataset) or any(is_iterable_dataset(e) for e in evals):
            if args.accelerator_config.dispatch_batches:
                raise ValueError(
                    "Iterable datasets require `dispatch_batches=False`, but it is set to `True` in "
                    "`accelerator_config`. Please set it to `False`."
                )
            args.accelerator_config.dispatch_batches = False
        if is_iterable_dataset(train_dataset) and args.dataloader_num_workers != 0:
            logging.getLogger(self.logger_name).warning(
                "Iterable datasets require `dataloader_num_workers=0` to preserve prompt grouping; overriding the "
                f"provided value ({args.dataloader_num_workers})."
            )
            args.dataloader_num_workers = 0

    def _train_rows(self, args, train_dataset):
        """The train prompts: a stream's first rows as ``max_steps`` takes them (TRL requires
        ``max_steps`` for a stream, whose length is unknown), any other form as it is."""
        if not is_iterable_dataset(train_dataset):
            return train_dataset
        if args.max_steps <= 0:
            raise ValueError(
                f"{type(self).__name__}: an IterableDataset train_dataset needs max_steps > 0 (its length is "
                "unknown, so the run cannot count epochs)"
            )
        prompts = args.generation_batch_size // args.num_generations
        return prompt_rows(train_dataset, args.generations(0) * prompts)

    def trl_warnings(self) -> None:
        """TRL's warnings on a config that may not do what its user means (GRPO's ``__init__``)."""
        a, logger = self.trl_args, logging.getLogger(self.logger_name)
        if a.loss_type == "luspo" and a.importance_sampling_level != "sequence":
            logger.warning(
                "When using `'luspo'` loss, `importance_sampling_level` should be set to `'sequence'` to mirror "
                "the paper's setup."
            )
        if a.loss_type == "vespo" and a.importance_sampling_level != "token":
            logger.warning(
                "VESPO computes sequence-level importance weights internally. `importance_sampling_level` should "
                "be set to `'token'` (the default)."
            )
        if a.importance_sampling_level == "sequence" and a.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
            logger.warning(
                f"When using `importance_sampling_level='sequence'`, the `'{a.loss_type}'` loss sums per-token "
                "contributions, which effectively weights each sequence by its completion length instead of "
                "optimizing the per-sequence objective. To reproduce the GSPO paper's setup, set "
                "`loss_type='grpo'` (see https://huggingface.co/docs/trl/main/en/paper_index"
                "#group-sequence-policy-optimization)."
            )

    def trl_extra_metrics(self) -> dict:
        a = self.trl_args
        return {"entropy_coef": self.entropy_coef} if a.entropy_coef or a.use_adaptive_entropy else {}

    @property
    def args(self):
        """TRL's ``trainer.args``: the ``GRPOConfig`` / ``RLOOConfig`` (rlhfkit's ``RLConfig`` the run
        follows is ``trainer.config``)."""
        return self.trl_args

    @args.setter
    def args(self, value) -> None:
        self.trl_args = value

    def optimizer_steps_total(self) -> int:
        return self.config.max_steps * self.trl_args.optimizer_steps_per_generation

    def save_model(self, output_dir=None):
        """The policy as a ``from_pretrained`` directory: ``output_dir``, else the config's."""
        RLTrainer.save_model(self, Path(output_dir or self.config.output_dir))

    @property
    def model(self):
        """TRL's ``trainer.model``: the policy being trained (a ``peft`` model with LoRA), the very
        module the optimizer steps, so a snapshot of its parameters sees every update."""
        return self.models.policy

    @property
    def ref_model(self):
        """TRL's ``trainer.ref_model``: the reference policy (``beta > 0``), None without one or with
        LoRA (the policy with its adapter disabled is the reference then, as in TRL)."""
        return self.models.reference

    @property
    def reward_funcs(self) -> list:
        """The reward sources as rlhfkit scores them (functions, reward models as functions)."""
        return list(self.sampler.rewards.funcs)

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient (TRL's ``entropy_coef``): with ``use_adaptive_entropy`` the
        controller's, as the last optimizer step left it."""
        return self.entropy_ctl.coef if self.entropy_ctl is not None else float(self.config.entropy_coef)

    aux_loss_enabled = False  # no mixture-of-experts load-balancing loss is added (docs: "Coming from TRL")


class RLOOTrainer(GRPOTrainer):
    """TRL's ``RLOOTrainer`` on rlhfkit's RL loop (``args``: an ``RLOOConfig``)."""

    config_class, suffix = RLOOConfig, "RLOO"
    logger_name = "trl.trainer.rloo_trainer"
    _tag_names = ["trl", "rloo"]

    def trl_warnings(self) -> None:
        """RLOO's config has no loss types: nothing to warn of."""

    def trl_extra_metrics(self) -> dict:
        return {}


class CompletionTable(TypedDict):
    """TRL's ``trainer._logs``: a column of the latest completions each (``TRLRewardView``)."""

    images: deque
    prompt: deque
    completion: deque
    rewards: defaultdict[str, deque]  # reward function name -> its scores
    advantages: deque
    extra: defaultdict[str, deque]  # log_extra's column -> its values


class TRLRewardView:
    """The run's ``RewardFunctions`` as TRL's trainer sees its reward calls (``GRPOTrainer._calculate_rewards``
    and ``_generate_and_score_completions``): TRL's warning when every reward function returned None for a
    completion (the first such completion's keyword arguments, prompt and completion), and TRL's table of the
    latest completions, ``trainer._logs`` (``prompt``, ``completion``, ``rewards`` per function, ``extra``
    columns from ``log_extra``; one generation's worth, ``generation_batch_size``; the ``advantages`` column
    stays empty: they are computed after the call)."""

    def __init__(self, rewards, logger: logging.Logger, size: int):
        self.rewards, self.logger = rewards, logger

        def table() -> deque:
            return deque(maxlen=size)

        self.logs: CompletionTable = {
            "images": table(),
            "prompt": table(),
            "completion": table(),
            "rewards": defaultdict(table),
            "advantages": table(),
            "extra": defaultdict(table),
        }

    def __getattr__(self, name):
        return getattr(self.rewards, name)

    def __call__(self, prompts, completions, columns=None, completion_ids=None, trainer_state=None):
        out = self.rewards(prompts, completions, columns, completion_ids, trainer_state)
        unscored = torch.nonzero(~out.valid).flatten()
        if len(unscored):
            i = int(unscored[0])
            row = {k: v[i] for k, v in (columns or {}).items()}
            row.update(prompt=prompts[i], completion=completions[i])
            self.logger.warning(
                f"All reward functions returned None for the following kwargs:\n{row}\n"
                "Please ensure that at least one reward function returns a valid reward."
            )
        self.logs["prompt"].extend(prompts)
        self.logs["completion"].extend(completions)
        for name, values in out.per_function.items():
            self.logs["rewards"][name].extend(values.tolist())
        for column, values in out.extra.items():
            self.logs["extra"][column].extend(values)
        return out
