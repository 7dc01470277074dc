"""The fields and the batch arithmetic TRL 1.16's ``GRPOConfig`` and ``RLOOConfig`` share
(``GenerationArguments``, a ``transformers.TrainingArguments``): TRL's defaults and checks, and the
``RLConfig`` fields both map to (``grpo.py`` adds each trainer's own)."""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from dataclasses import dataclass

from transformers import TrainingArguments

from .. import distributed
from .arguments import check_choice, common, model_dtype, refuse_unsupported, trl_fields


@dataclass
class GenerationArguments(TrainingArguments):
    """The fields GRPO and RLOO share in TRL 1.16 (TRL's defaults), before TRL's own checks."""

    logging_steps: float = 10
    gradient_checkpointing: bool = True
    bf16: bool | None = None  # type: ignore[assignment]  # TRL's None: True unless fp16 (base_config.py)
    learning_rate: float = 1e-6
    remove_unused_columns: bool = False  # TRL's default (its annotation also allows None)
    model_init_kwargs: dict | None = None
    trust_remote_code: bool = False
    router_aux_loss_coef: float | None = None
    disable_dropout: bool = False
    num_generations: int | None = 8
    num_generations_eval: int | None = None
    max_completion_length: int | None = 512
    ds3_gather_for_generation: bool = True
    shuffle_dataset: bool | None = True
    pad_to_multiple_of: int | str | None = "auto"
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    generation_kwargs: dict | None = None
    chat_template_kwargs: dict | None = None
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
    num_iterations: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    reward_weights: list[float] | None = None
    mask_truncated_completions: bool = False
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6
    ref_model_sync_steps: int = 512
    log_completions: bool = False
    log_multimodal: bool = True
    num_completions_to_print: int | None = None
    log_unique_prompts: bool = False
    use_transformers_continuous_batching: bool = False
    transformers_continuous_batching_config: dict | None = None
    use_transformers_paged: bool = False

    # Translated by to_rlhfkit (the rest of TRL's fields: their default only, see arguments.py).
    HANDLED = frozenset(
        {
            "model_init_kwargs",
            "num_generations",
            "num_generations_eval",
            "chat_template_kwargs",
            "max_completion_length",
            "shuffle_dataset",
            "generation_batch_size",
            "steps_per_generation",
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
            "num_iterations",
            "epsilon",
            "epsilon_high",
            "reward_weights",
            "mask_truncated_completions",
            "sync_ref_model",
            "ref_model_mixup_alpha",
            "ref_model_sync_steps",
            "bf16",
            "logging_steps",
            "gradient_checkpointing",
            "activation_checkpointing",
            "learning_rate",
            "remove_unused_columns",
        }
    )

    def __post_init__(self):
        # TrainingArguments' own fields now (its __post_init__ acts on them: DeepSpeed, FSDP, ...); TRL's
        # fields and Liger's when the trainer is built (check_supported), with the values as given here
        refuse_unsupported(self, self.HANDLED | self.checked_late())
        self._given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        self.bf16 = not self.fp16 if self.bf16 is None else self.bf16  # TRL's base_config rule
        with warnings.catch_warnings():  # TRL's own default: transformers 5 calls the field deprecated
            warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning)
            super().__post_init__()
        world = distributed.planned_world()  # TRL's self.world_size, known before any process group
        # TRL's rule (GRPOConfig.__post_init__): one of generation_batch_size / steps_per_generation.
        if self.steps_per_generation is None:
            if self.generation_batch_size is None:
                self.steps_per_generation = self.gradient_accumulation_steps
            else:
                if self.generation_batch_size % (self.per_device_train_batch_size * world):
                    raise ValueError(
                        f"generation_batch_size ({self.generation_batch_size}) must be divisible by the global "
                        f"batch size ({self.per_device_train_batch_size * world})."
                    )
                self.steps_per_generation = self.generation_batch_size // (self.per_device_train_batch_size * world)
        elif self.generation_batch_size is not None:
            raise ValueError(
                "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"
            )
        self.generation_batch_size = self.per_device_train_batch_size * world * self.steps_per_generation
        if self.num_generations is None:  # TRL fails on it below (generation_batch_size % None, a TypeError)
            raise ValueError(
                f"{type(self).__name__} field 'num_generations'=None: it must be the completions per prompt (2 or more)"
            )
        if self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size}) must be divisible by "
                f"num_generations ({self.num_generations})."
            )
        if self.do_eval and self.eval_strategy != "no":  # TRL's rule: an evaluation batch holds whole groups
            group = self.num_generations_eval or self.num_generations
            if (self.per_device_eval_batch_size * world) % group:
                raise ValueError(
                    f"The global eval batch size ({self.per_device_eval_batch_size} * {world}) must be divisible by "
                    f"the number of generations used for evaluation ({group})."
                )
        if self.num_generations < 2:
            raise ValueError(
                "GRPO requires at least 2 generations per prompt to calculate the advantages. You "
                f"provided {self.num_generations}, which is less than the minimum required."
            )

    @classmethod
    def checked_late(cls) -> frozenset:
        """The fields refused when the trainer is built rather than in ``__post_init__``: TRL's own
        (TRL refuses a trainer's settings there too) and Liger's switches."""
        return trl_fields(cls) | {"use_liger_kernel", "liger_kernel_config"}

    def check_supported(self) -> None:
        """rlhfkit's refusals, each one line naming the field: a TRL field rlhfkit does not support
        off its default (``refuse_unsupported``), and the settings of supported fields it cannot run.
        Called when the trainer is built (``_rl_fields``), as TRL refuses a trainer's settings there;
        TRL's own checks stay in ``__post_init__``."""
        given = copy.copy(self)
        for name, value in getattr(self, "_given", {}).items():
            object.__setattr__(given, name, value)
        refuse_unsupported(given, self.HANDLED | ({f.name for f in dataclasses.fields(self)} - self.checked_late()))
        assert self.steps_per_generation is not None  # __post_init__ has set it
        if self.steps_per_generation % self.gradient_accumulation_steps:
            raise ValueError(
                f"{type(self).__name__}: steps_per_generation ({self.steps_per_generation}) must be a "
                f"multiple of gradient_accumulation_steps ({self.gradient_accumulation_steps}) in rlhfkit: "
                "an optimizer step never spans two generations"
            )
        if not self.shuffle_dataset:
            raise ValueError(
                f"{type(self).__name__} field 'shuffle_dataset'=False is not supported by rlhfkit (the "
                "data order is always a seeded shuffle per epoch)"
            )
        check_choice(self, "vllm_mode", ("colocate",))
        check_choice(self, "vllm_tensor_parallel_size", (1,))

    @property
    def optimizer_steps_per_generation(self) -> int:
        assert self.steps_per_generation is not None  # __post_init__ has set it
        return self.num_iterations * self.steps_per_generation // self.gradient_accumulation_steps

    @property
    def prompts_per_generation(self) -> int:
        """Prompts of one generation: ``generation_batch_size / num_generations`` (whole groups:
        ``__post_init__`` checks it)."""
        assert self.generation_batch_size is not None and self.num_generations is not None  # as __post_init__ left them
        return self.generation_batch_size // self.num_generations

    def generations(self, n_rows: int) -> int:
        """RL steps (generations) of the run: ``max_steps`` optimizer steps, or ``num_train_epochs``
        passes over ``n_rows`` prompts as TRL counts them: an epoch is its whole generations only
        (TRL's ``RepeatSampler`` drops the last incomplete one; the drop-in sets ``drop_last``), and
        the optimizer steps are ``ceil(num_train_epochs x steps per epoch)`` (``Trainer``'s rule)."""
        per = self.optimizer_steps_per_generation
        name = type(self).__name__
        if self.max_steps > 0:
            if self.max_steps % per:
                raise ValueError(
                    f"{name}: max_steps={self.max_steps} is not a whole number of "
                    f"generations ({per} optimizer steps each: num_iterations x steps_per_generation / "
                    "gradient_accumulation_steps)"
                )
            return self.max_steps // per
        prompts = self.prompts_per_generation
        if n_rows < prompts:
            raise ValueError(
                f"{name}: the train dataset has {n_rows} prompts, fewer than one generation takes "
                f"({prompts}: generation_batch_size / num_generations), so TRL would train 0 steps; "
                "add prompts or lower per_device_train_batch_size"
            )
        steps = math.ceil(self.num_train_epochs * (n_rows // prompts) * per)
        if steps % per:
            raise ValueError(
                f"{name}: num_train_epochs={self.num_train_epochs} gives {steps} optimizer steps, not a "
                f"whole number of generations ({per} optimizer steps each); set max_steps"
            )
        return steps // per

    def _rl_fields(self, n_rows: int, world: int) -> dict:
        """The fields GRPO and RLOO translate alike (the batch arithmetic of the module docstring),
        after rlhfkit's refusals (``check_supported``)."""
        self.check_supported()
        steps = self.generations(n_rows)
        per_gen = self.optimizer_steps_per_generation
        to_rl = lambda n: max(1, int(n) // per_gen) if n else 0  # noqa: E731  (optimizer steps -> generations)
        fields = common(self, steps * per_gen)
        fields.update(
            max_steps=steps,
            group_size=self.num_generations,
            prompts_per_step=self.prompts_per_generation,
            mini_batch_size=self.per_device_train_batch_size * world * self.gradient_accumulation_steps,
            micro_batch_size=self.per_device_train_batch_size,
            num_iterations=self.num_iterations,
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p or 0.0,  # TRL's None: off
            repetition_penalty=self.repetition_penalty,
            clip_low=self.epsilon,
            clip_high=self.epsilon if self.epsilon_high is None else self.epsilon_high,
            mask_truncated_completions=self.mask_truncated_completions,
            # TR-DPO's reference sync, in optimizer steps as in TRL (rlhfkit counts them alike)
            sync_ref_model=self.sync_ref_model,
            ref_model_mixup_alpha=self.ref_model_mixup_alpha,
            ref_model_sync_steps=self.ref_model_sync_steps,
            # TRL's rules: a masked truncated row still counts as a row, an unscored one stays in the loss with
            # advantage 0, and an epoch's last incomplete generation is dropped
            masked_rows_count=True,
            unscored_in_loss=True,
            drop_last=True,
            dtype=model_dtype(self),
            rollout_engine="vllm" if self.use_vllm else "hf",
            vllm_sleep=self.vllm_enable_sleep_mode,
            vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization,
            log_every=to_rl(self.logging_steps),
            save_steps=to_rl(self.save_steps) if self.save_strategy != "no" else 0,
            save_total_limit=self.save_total_limit,
            eval_every=to_rl(self.eval_steps or self.logging_steps) if self.eval_strategy != "no" else 0,
            overwrite=True,
        )  # TRL writes into an existing output_dir: output_dir.py replaces rlhfkit's files only
        return fields
