"""The RL run's config: ``RLConfig``, joined from dataclasses split by concern into one flat object, as TRL's
``GRPOConfig`` is: the model (``ModelConfig``, here), the sampling side (``rollout.py``: ``RolloutConfig``, the
engines' ``HFOptions`` and ``VLLMOptions``, ``AgentConfig``), the algorithm (``algorithm.py``: ``AlgorithmConfig``
and its ``PRESETS``), the teacher of on-policy distillation (``teacher.py``: ``TeacherConfig``, which checks its
own rules), the optimiser and the run (``OptimConfig``, ``RunConfig``, here). Each field is declared once, in its
concern, with its docstring right under it (the only source of help text); the phases take the fields they read by
name (``parts.py``: ``takes``). ``PRESETS`` fills the algorithm fields the user left unset from the chosen
algorithm's preset; ``_validate`` checks the combinations, reading the registries' traits (no algorithm is named
here). Configs are frozen: nothing changes them at run time."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..rollout.registry import check_engine_options, engine_names
from .algorithm import PRESETS, AlgorithmConfig
from .base import DEVICE_KINDS, DTYPES, LM_HEADS, PARALLELISMS, SCHEDULERS, OptimBase, RunBase
from .checks import check_fields, check_ranges, check_run_fields
from .rollout import (
    HF_DECODE_MODES,
    ROLLOUT_PRECISIONS,
    AgentConfig,
    HFOptions,
    RolloutConfig,
    VLLMOptions,
)
from .teacher import TeacherConfig, check_teacher

AUTOCAST_DTYPES = ("bfloat16", "float16")
CRITICS = ("separate", "shared")

# The concerns RLConfig joins, each declaring its own fields (rollout.py, algorithm.py, here).
__all__ = [
    "AUTOCAST_DTYPES",
    "CRITICS",
    "HF_DECODE_MODES",
    "PRESETS",
    "ROLLOUT_PRECISIONS",
    "AgentConfig",
    "AlgorithmConfig",
    "HFOptions",
    "ModelConfig",
    "OptimConfig",
    "RLConfig",
    "RolloutConfig",
    "RunConfig",
    "TeacherConfig",
    "VLLMOptions",
]


@dataclass(frozen=True)
class ModelConfig:
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16 (DTYPES). bfloat16 halves memory; float32 is the safe CPU default."""
    critic: str = "separate"
    """PPO critic: 'separate' (its own copy of the backbone, as in the reference) or 'shared' (a value head on the
    policy's backbone: less memory)."""
    device: str = "auto"
    """Where the models run: 'auto' (the GPU when torch sees one, else the CPU), 'cpu', 'cuda', 'cuda:N'."""
    autocast: str | None = None
    """Mixed precision: 'bfloat16' runs generation and forward/backward matmuls in bfloat16 under torch.autocast while
    weights, gradients and optimizer states stay in `dtype` (use with float32). None: off."""
    share_prompt: bool = True
    """Run each prompt through the model once per group: generation shares its key/value cache with the group's G
    completions, and the log-prob/update passes pack the group into one row (the prompt, then each completion without
    padding; ``models/packing.py``: for full-attention architectures, where it computes less, else the rows run as they
    are). Same results, less compute, on any number of processes and under gradient_checkpointing."""
    critic_init: str | None = None
    """Directory of a trained reward model to initialise the separate critic from; None: from the policy."""
    parallelism: str = "fsdp"
    """With several processes (torchrun): 'fsdp' shards the policy, critic and reference with FSDP2 (each process holds
    1/N of the weights, gradients and AdamW states; on GPUs with autocast set, FSDP2 computes in that dtype over float32
    master weights); 'ddp' keeps a full copy per process and averages gradients. Ignored in a single process."""


@dataclass(frozen=True)
class OptimConfig(OptimBase):
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critic; None: learning_rate."""
    mini_batch_size: int | None = None
    """Rows per optimizer step; None: the whole batch (one step per pass)."""
    micro_batch_size: int | None = None
    """Rows per forward/backward (gradient accumulation inside a mini-batch), and per no-gradient log-prob pass (old
    log-probs, reference, critic values); None: the mini-batch (the batch for the log-prob passes), bounded by
    max_tokens_per_micro_batch."""
    max_tokens_per_micro_batch: int | str | None = None
    """Token budget of each micro-batch of the update and of the log-prob passes (verl's dynamic batch size): rows are
    sorted by length and filled greedily into micro-batches of at most this many tokens, counted as the padded pass
    computes them — rows x (prompt columns from the earliest attended one + response columns up to the last attended
    one) of the micro-batch (``models/micro_batches.py``). A single row longer than the budget runs alone (no error);
    with share_prompt a prompt's group stays in one micro-batch when it fits. With micro_batch_size also set both bounds
    hold. The loss weights are those of one batch, so the update is the same up to float rounding. None: 16384 tokens
    when micro_batch_size is None (TRL's default micro-batch of 8 rows at 2048 tokens a row: short completions run as
    one micro-batch, as before; long ones never more tokens at once than TRL's 8 rows), else no token bound
    (micro_batch_size rows, as TRL's per_device_train_batch_size, which the TRL drop-in sets). 'auto': the most
    tokens whose activations fit in the free memory (memory_budget_gb; the activation cost measured at set-up, with
    checkpointing unless gradient_checkpointing='off'), re-derived each step. Under gradient_checkpointing='auto' any
    budget is capped by that one, so a micro-batch that would not fit is split instead of running out of memory."""
    skip_zero_gradient_rows: bool = True
    """Leave out of the update's forward/backward the rows whose loss has no gradient: an advantage of exactly 0 on
    every token (a GRPO/RLOO group whose completions all scored alike) when nothing else reaches them (no critic, no
    entropy bonus, no KL in the loss). The weights are the same (their share of the loss's denominator is kept); the
    update's per-token metrics (policy/entropy, clip fractions) cover the rows it ran, and
    policy/zero_gradient_rows_frac says how many it left out."""


@dataclass(frozen=True)
class RunConfig(RunBase):
    max_steps: int = 100
    """RL steps (each: generate, score, update)."""
    num_logged_samples: int = 4
    """Completions written to samples.jsonl (for the report) at each of ~10 evenly spaced steps."""
    eval_every: int = 0
    """With an eval dataset: evaluate before the first step, every this many steps and after the last (0: before and
    after only). Greedy completions scored by the training reward sources, logged as eval/<source>_mean,
    eval/score_mean."""
    eval_max_new_tokens: int | None = None
    """New-token limit of the evaluation's greedy completions; None: max_new_tokens."""


@dataclass(frozen=True)
class RLConfig(
    RunConfig,
    OptimConfig,
    TeacherConfig,
    AlgorithmConfig,
    AgentConfig,
    VLLMOptions,
    HFOptions,
    RolloutConfig,
    ModelConfig,
):
    """Everything an RL run reads. ``RLConfig(algorithm="rloo", kl_coef=0.1)``.

    The preset rule: a preset's values are defaults. A preset field you leave unset (None) takes
    the preset's value; a value you set always wins — at construction and when ``replace`` switches
    ``algorithm`` (only the fields the old preset filled are refilled by the new one)."""

    def __post_init__(self):
        if self.algorithm not in PRESETS:
            raise ValueError(f"algorithm must be one of {', '.join(PRESETS)}, got {self.algorithm!r}")
        filled = []
        for key, value in PRESETS[self.algorithm].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
                filled.append(key)
        # Not a dataclass field: which values came from the preset (the rest the user set).
        object.__setattr__(self, "preset_filled", frozenset(filled))
        _validate(self)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def check_processes(self, world: int) -> None:
        """Refuse, in one line, a split of ``world`` processes this config cannot run on (called
        before torchrun starts any, and again by the trainer): each process's share of the prompts
        must be whole groups, ``rollout_workers`` must leave a trainer and need torchrun."""
        workers = self.rollout_workers
        if workers and workers >= world:
            where = (
                f"{world} processes"
                if world > 1
                else "one process (generator ranks run under torchrun: --nproc-per-node N, N > rollout_workers)"
            )
            raise ValueError(
                f"config field 'rollout_workers' is {workers} but the job has {where}: at least one process must train"
            )
        if self.max_staleness and not workers:
            raise ValueError(
                f"config field 'max_staleness' is {self.max_staleness} but rollout_workers is 0: "
                "staleness needs generator ranks (rollout_workers >= 1) to overlap with training"
            )
        for n, who in ((workers, "generator"), (world - workers, "trainer" if workers else "")):
            if n and self.prompts_per_step % n:
                kind = f"{who} processes" if who else "processes"
                raise ValueError(
                    f"prompts_per_step={self.prompts_per_step} must be divisible by the number of "
                    f"{kind} ({n}): each process samples its share, and a group never spans two"
                )

    def replace(self, **changes) -> RLConfig:
        """A copy with ``changes``. Fields the preset filled are refilled by the (new) preset; fields
        the user set keep their values unless ``changes`` names them."""
        for key in self.preset_filled:
            changes.setdefault(key, None)
        return dataclasses.replace(self, **changes)


def _validate(c: RLConfig) -> None:
    from ..algorithms import (
        ADVANTAGE_ESTIMATORS,
        AGGREGATIONS,
        IMPORTANCE_SAMPLING_LEVELS,
        KL_ESTIMATORS,
        POLICY_LOSSES,
        ROLLOUT_IS_MODES,
        check_loss_options,
    )

    check_ranges(c)
    check_run_fields(c)
    ENTROPY_AGGREGATIONS = ("micro-batch-token-mean",)
    estimator = ADVANTAGE_ESTIMATORS.traits(c.advantage_estimator)
    levels = POLICY_LOSSES.traits(c.policy_loss)["importance_sampling_levels"]
    check_loss_options(c.policy_loss, c)  # the loss's knobs, as its registration declares them
    if c.rollout_engine in engine_names():  # the engine's own options, as its registry entry declares them
        check_engine_options(c.rollout_engine, c.engine_options)
    kl = KL_ESTIMATORS.traits(c.kl_estimator)
    in_loss = [n for n in KL_ESTIMATORS.names() if KL_ESTIMATORS.traits(n)["loss_gradient"]]
    check_fields(
        c,
        [
            (c.loss_agg in AGGREGATIONS, "loss_agg", f"one of {', '.join(AGGREGATIONS)}"),
            (
                not estimator["needs_groups"] or c.group_size >= 2,
                "group_size",
                f">= 2 for the {c.advantage_estimator!r} estimator (its baseline is the rest of the group)",
            ),
            (
                not estimator["needs_values"] or c.use_critic,
                "use_critic",
                f"True for the {c.advantage_estimator!r} estimator",
            ),
            (
                not c.use_critic or estimator["gives_returns"],
                "use_critic",
                f"False for the {c.advantage_estimator!r} estimator (it gives the critic no returns to learn)",
            ),
            (
                c.kl_in_reward or c.kl_coef == 0 or kl["loss_gradient"],
                "kl_estimator",
                f"one of {', '.join(in_loss)} when the KL goes into the loss (kl_in_reward=False): the gradient of "
                f"{c.kl_estimator!r} {kl['why_not_in_loss']}",
            ),
            (
                c.policy_loss != "vespo" or (c.top_entropy_quantile == 1.0 and c.off_policy_mask_threshold is None),
                "policy_loss",
                "not 'vespo' with top_entropy_quantile < 1 or off_policy_mask_threshold: VESPO folds its token "
                "weights into the sequence ratio, where a token filter has no place",
            ),
            (
                c.entropy_coef_min <= c.entropy_coef_max,
                "entropy_coef_min",
                f"at most entropy_coef_max ({c.entropy_coef_max})",
            ),
            (
                c.reward_aggregation in ("sum_then_normalize", "normalize_then_sum"),
                "reward_aggregation",
                "'sum_then_normalize' or 'normalize_then_sum'",
            ),
            (
                c.reward_aggregation == "sum_then_normalize"
                or (
                    c.missing_eos_penalty is None
                    and c.overlong_buffer_len is None
                    and c.reward_clip is None
                    and not c.normalize_rewards
                ),
                "reward_aggregation",
                "'sum_then_normalize' with missing_eos_penalty, overlong_buffer_len, reward_clip or normalize_rewards: "
                "they shape the weighted sum, which 'normalize_then_sum' does not use",
            ),
            (
                not c.sync_ref_model or c.kl_coef > 0,
                "sync_ref_model",
                "False when kl_coef is 0: there is no reference to synchronise",
            ),
            (
                c.device == "auto" or c.device.split(":")[0] in DEVICE_KINDS,
                "device",
                "'auto', 'cpu', 'cuda' (or 'cuda:N'), 'mps' or 'xpu'",
            ),
            (c.lr_scheduler in SCHEDULERS, "lr_scheduler", f"one of {', '.join(SCHEDULERS)}"),
            (c.critic in CRITICS, "critic", f"one of {', '.join(CRITICS)}"),
            (c.parallelism in PARALLELISMS, "parallelism", f"one of {', '.join(PARALLELISMS)}"),
            (c.dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}"),
            (c.lm_head in LM_HEADS, "lm_head", f"one of {', '.join(LM_HEADS)}"),
            (c.rollout_engine in engine_names(), "rollout_engine", f"one of {', '.join(engine_names())}"),
            (c.hf_decode in HF_DECODE_MODES, "hf_decode", f"one of {', '.join(HF_DECODE_MODES)}"),
            (
                c.rollout_precision is None or c.rollout_precision in ROLLOUT_PRECISIONS,
                "rollout_precision",
                f"None or one of {', '.join(ROLLOUT_PRECISIONS)}",
            ),
            (
                c.rollout_precision is None or (c.rollout_engine == "hf" and not c.rollout_workers),
                "rollout_precision",
                "None with rollout_engine='vllm' or rollout_workers "
                "(quantized rollouts are the HF engine's, in a training process)",
            ),
            (
                c.rollout_precision != "fp8" or c.device.startswith("cuda") or (c.device == "auto" and _cuda()),
                "rollout_precision",
                "'bfloat16' or 'int8' on this device: 'fp8' (torchao's float8 kernels) runs on CUDA only",
            ),
            (c.truncate_prompts in (None, "left"), "truncate_prompts", "None or 'left'"),
            (c.rollout_is in ROLLOUT_IS_MODES, "rollout_is", f"one of {', '.join(ROLLOUT_IS_MODES)}"),
            (
                c.rollout_is_threshold_low is None
                or c.rollout_is_threshold is None
                or c.rollout_is_threshold_low < c.rollout_is_threshold,
                "rollout_is_threshold_low",
                f"below rollout_is_threshold ({c.rollout_is_threshold}) or None",
            ),
            (
                not (c.unscored_in_loss and c.use_critic),
                "unscored_in_loss",
                "False with a critic (an unscored row has no return for it to learn)",
            ),
            (
                not (c.unscored_in_loss and (c.dynamic_sampling or c.rollout_workers)),
                "unscored_in_loss",
                "False with dynamic_sampling or rollout_workers "
                "(their filler rows are unscored too, and must stay out of the loss)",
            ),
            (
                c.entropy_agg in (None, *ENTROPY_AGGREGATIONS),
                "entropy_agg",
                f"None or one of {', '.join(ENTROPY_AGGREGATIONS)}",
            ),
            (
                c.autocast is None or c.autocast in AUTOCAST_DTYPES,
                "autocast",
                f"None or one of {', '.join(AUTOCAST_DTYPES)}",
            ),
            (
                c.mini_batch_size is None or c.mini_batch_size <= c.batch_size,
                "mini_batch_size",
                f"at most the batch size {c.batch_size} (prompts_per_step x group_size) or None",
            ),
            (
                c.importance_sampling_level in IMPORTANCE_SAMPLING_LEVELS,
                "importance_sampling_level",
                f"one of {', '.join(IMPORTANCE_SAMPLING_LEVELS)}",
            ),
            (
                c.importance_sampling_level in levels,
                "importance_sampling_level",
                f"{' or '.join(map(repr, levels))} with the {c.policy_loss!r} policy loss",
            ),
            (
                c.overlong_buffer_len is None or c.overlong_buffer_len < c.max_new_tokens,
                "overlong_buffer_len",
                f"less than max_new_tokens ({c.max_new_tokens}) or None: "
                "the buffer is the last tokens before the limit",
            ),
            (
                not c.dynamic_sampling or c.group_size >= 2,
                "dynamic_sampling",
                "False when group_size is 1 "
                "(a group of one sample never has reward variance: every group would be dropped)",
            ),
            *check_teacher(c),
        ],
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
