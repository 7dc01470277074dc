"""TRL 1.16's ``DistillationConfig`` / ``DistillationTrainer`` on rlhfkit's one RL loop: on-policy distillation
(Agarwal et al. 2024, arXiv:2306.13649) in ``distillation_mode="full"`` — the student samples one completion per
prompt and is trained on the generalized Jensen-Shannon divergence between its and the teacher's whole next-token
distributions at every sampled position (``beta`` 0 forward KL, 1 reverse KL), at ``temperature``, no reward, no
reference KL (``config/teacher.py``, ``models/teacher.py``).

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, defaults and checks);
``to_rlhfkit`` is the one table that maps it to an ``RLConfig``. The batch arithmetic is TRL's
(``DistillationTrainer._get_train_sampler``): a generation batch of ``per_device_train_batch_size x processes x
gradient_accumulation_steps`` prompts, one completion each, split into ``gradient_accumulation_steps`` micro-batches
of ``per_device_train_batch_size`` per process, one optimizer step per generation batch; the loss of a step is the
sum of the divergence over its completion tokens divided by their number (TRL's ``num_items_in_batch``): rlhfkit's
``loss_agg="token-mean"`` over the step's minibatch. ``max_steps`` counts optimizer steps, i.e. rlhfkit's steps.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from dataclasses import dataclass

from transformers import TrainingArguments

from .. import distributed
from ..config import RLConfig
from ..data import load_prompt_dataset
from ..trainers.rl import RLTrainer
from .arguments import as_steps, check_choice, common, model_dtype, refuse_unsupported, trl_fields
from .callbacks import trl_callbacks
from .metrics import DISTILL_METRICS
from .output_dir import claim_output_dir
from .rl_inputs import is_iterable_dataset, tokenizer_for, trl_config, with_template_kwargs
from .rl_trainers import GRPOTrainer


@dataclass
class DistillationConfig(TrainingArguments):
    """TRL 1.16's ``DistillationConfig``: its fields, defaults and checks; ``to_rlhfkit`` gives the ``RLConfig``
    rlhfkit runs (docs: "Coming from TRL")."""

    _VALID_DICT_FIELDS = [
        *getattr(TrainingArguments, "_VALID_DICT_FIELDS", []),
        "model_init_kwargs",
        "teacher_model_init_kwargs",
        "generation_kwargs",
        "chat_template_kwargs",
    ]

    logging_steps: float = 10
    gradient_checkpointing: bool = True
    bf16: bool | None = None  # type: ignore[assignment]  # TRL's None: True unless fp16 (base_config.py)
    learning_rate: float = 1e-6
    model_init_kwargs: dict | str | None = None
    trust_remote_code: bool = False
    teacher_model_name_or_path: str | None = None
    teacher_model_revision: str | None = None
    teacher_model_init_kwargs: dict | str | None = None
    disable_dropout: bool = False
    remove_unused_columns: bool = False  # TRL's default (its annotation also allows None)
    max_completion_length: int | None = 512
    ds3_gather_for_generation: bool = True
    shuffle_dataset: bool | None = True
    pad_to_multiple_of: int | str | None = "auto"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    generation_kwargs: dict | str | None = None
    chat_template_kwargs: dict | str | None = None
    repetition_penalty: float = 1.0
    cache_implementation: str | None = None
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_model_impl: str = "vllm"
    vllm_enable_sleep_mode: bool = False
    vllm_structured_outputs_regex: str | None = None
    vllm_server_base_url: str | None = None
    vllm_server_host: str = "0.0.0.0"
    vllm_server_port: int = 8000
    vllm_server_timeout: float = 240.0
    vllm_group_port: int = 51216
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_length: int | None = None
    vllm_tensor_parallel_size: int = 1
    beta: float = 1.0
    max_tool_calling_iterations: int | None = None
    log_completions: bool = False
    num_completions_to_print: int | None = None
    log_unique_prompts: bool = False

    # Translated by to_rlhfkit or the trainer (the rest of TRL's fields: their default only, see arguments.py).
    # teacher_model_name_or_path: TRL's trainer reads it nowhere (its scripts pass it as teacher_model), nor does this.
    HANDLED = frozenset(
        {
            "model_init_kwargs",
            "teacher_model_init_kwargs",
            "teacher_model_name_or_path",
            "teacher_model_revision",
            "chat_template_kwargs",
            "max_completion_length",
            "shuffle_dataset",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "use_vllm",
            "vllm_mode",
            "vllm_enable_sleep_mode",
            "vllm_gpu_memory_utilization",
            "vllm_tensor_parallel_size",
            "beta",
            "max_tool_calling_iterations",
            "bf16",
            "logging_steps",
            "gradient_checkpointing",
            "learning_rate",
            "remove_unused_columns",
        }
    )
    optimizer_steps_per_generation = 1  # TRL: one optimizer step per generation batch (no num_iterations)
    num_generations = 1  # one completion per prompt (the GRPO drop-in's arithmetic reads both)

    def __post_init__(self):
        # TrainingArguments' own fields now; TRL's fields when the trainer is built (check_supported), as given here
        refuse_unsupported(self, self.HANDLED | self.checked_late())
        self._given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        self.bf16 = not self.fp16 if self.bf16 is None else self.bf16  # TRL's base_config rule
        with warnings.catch_warnings():  # TRL's own default: transformers 5 calls the field deprecated
            warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning)
            super().__post_init__()
        if isinstance(self.pad_to_multiple_of, str) and self.pad_to_multiple_of != "auto":  # TRL's rules from here
            pad = self.pad_to_multiple_of
            self.pad_to_multiple_of = None if pad.lower() in ("none", "null") else int(pad)
        if self.pad_to_multiple_of == "auto":
            self.pad_to_multiple_of = None  # 128 on Neuron only, where rlhfkit does not run
        if self.beta < 0.0 or self.beta > 1.0:
            raise ValueError(f"beta must be in [0.0, 1.0], got {self.beta}.")
        pc = self.parallelism_config
        if pc is not None and (pc.cp_enabled or pc.sp_enabled):
            raise ValueError(
                "DistillationTrainer does not support sequence-dim parallelism (`parallelism_config.cp_size > 1` "
                "or `parallelism_config.sp_size > 1`) yet. Distillation builds model inputs after generation "
                "inside the trainer, so Transformers' context-parallel / Ulysses sequence-parallel input "
                "sharding cannot be applied to the raw generation batch. Set both `cp_size=1` and `sp_size=1`, "
                "or disable `parallelism_config`."
            )

    @classmethod
    def checked_late(cls) -> frozenset:
        """The fields refused when the trainer is built (TRL's own, and Liger's switches)."""
        return trl_fields(cls) | {"use_liger_kernel", "liger_kernel_config"}

    def check_supported(self) -> None:
        """rlhfkit's refusals, each one line naming the field (``refuse_unsupported`` for a TRL field off its
        default), when the trainer is built."""
        given = _as_given(self)
        refuse_unsupported(given, self.HANDLED | ({f.name for f in dataclasses.fields(self)} - self.checked_late()))
        if not self.shuffle_dataset:
            raise ValueError(
                "DistillationConfig field 'shuffle_dataset'=False is not supported by rlhfkit (the data order is "
                "always a seeded shuffle per epoch)"
            )
        check_choice(self, "vllm_mode", ("colocate",))
        check_choice(self, "vllm_tensor_parallel_size", (1,))
        check_choice(self, "eval_strategy", ("no",))
        if self.teacher_model_revision not in (None, "main"):
            raise ValueError(
                f"DistillationConfig field 'teacher_model_revision'={self.teacher_model_revision!r} is not supported "
                "by rlhfkit: download that revision and pass its directory as teacher_model"
            )

    @property
    def generation_batch_size(self) -> int:
        """Prompts (one completion each) per generation and optimizer step, over every process (TRL's)."""
        return self.per_device_train_batch_size * distributed.planned_world() * self.gradient_accumulation_steps

    def generations(self, n_rows: int) -> int:
        """Optimizer steps (= generations) of the run: ``max_steps``, or ``num_train_epochs`` passes over ``n_rows``
        prompts as TRL counts them (``RepeatSampler`` drops an epoch's incomplete last generation batch; the
        drop-in sets ``drop_last``; ``ceil(num_train_epochs x steps per epoch)``, ``Trainer``'s rule)."""
        if self.max_steps > 0:
            return self.max_steps
        prompts = self.generation_batch_size
        if n_rows < prompts:
            raise ValueError(
                f"DistillationConfig: the train dataset has {n_rows} prompts, fewer than one optimizer step takes "
                f"({prompts}: per_device_train_batch_size x processes x gradient_accumulation_steps), so TRL would "
                "train 0 steps; add prompts or lower per_device_train_batch_size"
            )
        return math.ceil(self.num_train_epochs * (n_rows // prompts))

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> RLConfig:
        """The ``RLConfig`` of this config for ``n_rows`` prompts on ``world`` processes: the one table."""
        self.check_supported()
        steps = self.generations(n_rows)
        per_step = self.per_device_train_batch_size * world * self.gradient_accumulation_steps
        iterations = self.max_tool_calling_iterations
        fields = common(self, steps)
        fields.update(
            algorithm="distill",  # no reward, no reference KL, the token mean over the step (TRL's num_items_in_batch)
            distillation_mode="full",
            distillation_coef=1.0,
            distillation_beta=self.beta,
            max_steps=steps,
            group_size=1,
            prompts_per_step=per_step,
            mini_batch_size=per_step,  # one optimizer step per generation batch
            micro_batch_size=self.per_device_train_batch_size,
            num_iterations=1,
            loss_agg="token-mean",
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,  # sampling and both distributions of the divergence, as TRL's
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p or 0.0,  # TRL's None: off
            repetition_penalty=self.repetition_penalty,
            max_tool_calling_iterations=self.max_completion_length if iterations is None else iterations,
            drop_last=True,
            dtype=model_dtype(self),
            rollout_engine="vllm" if self.use_vllm else "hf",
            rollout_is="none",  # TRL's distillation discards vLLM's log-probs: no sampling correction
            vllm_sleep=self.vllm_enable_sleep_mode,
            vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization,
            log_every=as_steps(self.logging_steps, steps),
            save_steps=as_steps(self.save_steps, steps) if self.save_strategy != "no" else 0,
            save_total_limit=self.save_total_limit,
            eval_every=0,
            overwrite=True,  # TRL writes into an existing output_dir: output_dir.py replaces rlhfkit's files only
        )
        return RLConfig(**fields)

    def teacher_source(self, teacher_model):
        """``teacher_model`` as rlhfkit's RL loop takes it, after TRL's checks of ``teacher_model_init_kwargs``: a
        directory (or Hub id in the cache) is loaded in the policy's ``dtype`` (rlhfkit loads both in one), so a
        ``teacher_model_init_kwargs`` dtype must be that one; with a model object it is refused in TRL's words."""
        if teacher_model is None:
            raise ValueError(
                "DistillationTrainer: teacher_model is required (a model directory, a Hub id in the cache, or a "
                "causal-LM object)"
            )
        kwargs = self.teacher_model_init_kwargs
        if not isinstance(teacher_model, (str, os.PathLike)):
            if kwargs is not None:
                raise ValueError(
                    "You passed teacher_model_init_kwargs to the config, but your teacher_model is already "
                    "instantiated."
                )
            return teacher_model
        student = model_dtype(self)
        if model_dtype(self, "teacher_model_init_kwargs", student) != student:
            raise ValueError(
                f"DistillationConfig field 'teacher_model_init_kwargs'={kwargs!r} is not supported by rlhfkit: the "
                f"teacher loads in the student's dtype ({student}); only {{'dtype': '{student}'}} or None"
            )
        return os.fspath(teacher_model)


def _as_given(config):
    """A copy of ``config`` holding the values given to it (before ``TrainingArguments`` normalised them)."""
    import copy

    given = copy.copy(config)
    for name, value in getattr(config, "_given", {}).items():
        object.__setattr__(given, name, value)
    return given


class DistillationTrainer(GRPOTrainer):
    """TRL's ``DistillationTrainer(model, teacher_model, args, train_dataset, eval_dataset, processing_class,
    callbacks, optimizers, quantization_config, peft_config, tools)`` on rlhfkit's RL loop. ``args``: a
    ``DistillationConfig`` (default: TRL's, writing to ``<model name>-Distillation``) or a
    ``transformers.TrainingArguments``. The GRPO drop-in's attributes, ``state``, ``log_history`` layout
    (``rl_rows.py``), ``train()`` and ``save_model``; the metrics are ``metrics.DISTILL_METRICS``."""

    config_class = DistillationConfig
    suffix = "Distillation"
    loss_key = "distill/divergence"  # TRL's train_loss: the mean of the logged losses
    logger_name = "trl.trainer.distillation_trainer"
    _tag_names = ["trl", "distillation"]

    def __init__(
        self,
        model,
        teacher_model=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
    ):
        args = trl_config(args, self.config_class)
        if train_dataset is None:
            raise ValueError("DistillationTrainer: train_dataset is required (a dataset with a 'prompt' column)")
        if quantization_config is not None:
            raise ValueError(
                "DistillationTrainer: quantization_config is not supported by rlhfkit: load the model in "
                "model_init_kwargs={'dtype': ...} and train a LoRA adapter (peft_config)"
            )
        args = self.trl_config(model, args, optimizers)
        teacher = args.teacher_source(teacher_model)
        processing_class = with_template_kwargs(
            model, tokenizer_for(model, processing_class), args.chat_template_kwargs
        )
        self.trl_stream_settings(args, train_dataset, eval_dataset)
        train_rows = self._train_rows(args, train_dataset)
        n_rows = len(load_prompt_dataset(train_rows))
        native = args.to_rlhfkit(n_rows, distributed.planned_world())
        claim_output_dir(type(self).__name__, native.output_dir, native.resume_from)
        self.trl_rows, self.trl_window, self.trl_eval_data = [], [], {}
        RLTrainer.__init__(
            self,
            model,
            None,  # no reward: the distill preset records the built-in no_reward
            native,
            train_rows,
            processing_class=processing_class,
            peft_config=peft_config,
            tools=tools,
            callbacks=trl_callbacks(callbacks, self),
            teacher_model=teacher,
        )
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        if not is_iterable_dataset(train_dataset):
            self.trl_steps_per_epoch = n_rows // native.prompts_per_step or None
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names)

    @property
    def teacher_model(self):
        """TRL's ``trainer.teacher_model``: the frozen teacher."""
        return self.models.teacher

    def trl_metrics(self) -> dict:
        return dict(DISTILL_METRICS)

    def trl_warnings(self) -> None:
        """TRL's DistillationTrainer warns of nothing the drop-in could meet."""

    def trl_extra_metrics(self) -> dict:
        return {}

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        raise ValueError(
            "DistillationTrainer.evaluate() is not supported by rlhfkit (no evaluation of the divergence on "
            "generated completions yet): evaluate a saved model with rlhfkit eval"
        )
