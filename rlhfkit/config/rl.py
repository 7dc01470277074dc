"""The RL run's config: ``RLConfig``, joined from dataclasses split by concern into one flat object, as TRL's
``GRPOConfig`` is: the model (``ModelConfig``, here), the sampling side (``rollout.py``: ``RolloutConfig``, the
engines' ``HFOptions`` and ``VLLMOptions``, ``AgentConfig``), the algorithm (``algorithm.py``: ``AlgorithmConfig``
and its ``PRESETS``), the teacher of on-policy distillation (``teacher.py``: ``TeacherConfig``, which checks its
own rules), the optimiser and the run (``OptimConfig``, ``RunConfig``, here). Each field is declared once, in its
concern, with its docstring right under it (the only source of help text); the phases take the fields they read by
name (``parts.py``: ``takes``). ``PRESETS`` fills the algorithm fields the user left unset from the chosen
algorithm's preset. ``validate`` checks the config part by part: each concern's rules live beside its fields
(``model_rules`` here, ``base.shared_rules``, ``rollout.rollout_rules``, the engine's registry entry,
``algorithm.algorithm_rules``, ``teacher.check_teacher``), the rules across concerns in ``cross_part_rules``.
Configs are frozen: nothing changes them at run time."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .algorithm import AlgorithmConfig, algorithm_rules
from .base import AUTOCAST_DTYPES, OptimBase, Rule, RunBase, placement_rules, ranged, shared_rules
from .checks import check_fields, check_ranges, check_run_fields
from .engines import engine_rules
from .presets import PRESETS
from .rollout import (
    HF_DECODE_MODES,
    ROLLOUT_PRECISIONS,
    AgentConfig,
    HFOptions,
    RolloutConfig,
    VLLMOptions,
    rollout_rules,
)
from .teacher import TeacherConfig, check_teacher

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
    critic_learning_rate: float | None = ranged(None, "> 0 or None")
    """AdamW learning rate of the critic; None: learning_rate."""
    mini_batch_size: int | None = ranged(None, "[1, 1e6] or None")
    """Rows per optimizer step; None: the whole batch (one step per pass)."""
    micro_batch_size: int | None = ranged(None, "[1, 1e6] or None")
    """Rows per forward/backward (gradient accumulation inside a mini-batch), and per no-gradient log-prob pass (old
    log-probs, reference, critic values); None: the mini-batch (the batch for the log-prob passes), bounded by
    max_tokens_per_micro_batch."""
    max_tokens_per_micro_batch: int | str | None = ranged(None, "[1, 1e9] or None or 'auto'")
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
    max_steps: int = ranged(100, "[0, 1e9]")
    """RL steps (each: generate, score, update)."""
    num_logged_samples: int = ranged(4, "[0, 1e6]")
    """Completions written to samples.jsonl (for the report) at each of ~10 evenly spaced steps."""
    eval_every: int = ranged(0, "[0, 1e9]")
    """With an eval dataset: evaluate before the first step, every this many steps and after the last (0: before and
    after only). Greedy completions scored by the training reward sources, logged as eval/<source>_mean,
    eval/score_mean."""
    eval_max_new_tokens: int | None = ranged(None, "[1, 1e7] or None")
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
        object.__setattr__(self, "_preset_filled", frozenset(filled))
        validate(self)

    @property
    def preset_filled(self) -> frozenset[str]:
        """The fields whose values came from the preset (the rest the user set); not a dataclass field."""
        return self.__dict__["_preset_filled"]

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


def validate(c: RLConfig) -> None:
    """Check ``c`` part by part, each concern by its own rules, then the rules across concerns; the first
    failure is one ``ValueError`` line naming the field. The ranges (``checks.check_ranges``), the shared run
    fields, the policy loss's knobs (as its registration declares them), then ``RULES`` in order."""
    from ..algorithms import check_loss_options

    check_ranges(c)
    check_run_fields(c)
    check_loss_options(c.policy_loss, c)
    for rules in RULES:
        check_fields(c, rules(c))


def model_rules(c: RLConfig) -> list[Rule]:
    """``ModelConfig``'s rules: the critic's form and where the models run (``base.placement_rules``)."""
    return [(c.critic in CRITICS, "critic", f"one of {', '.join(CRITICS)}"), *placement_rules(c)]


def cross_part_rules(c: RLConfig) -> list[Rule]:
    """The rules that join two concerns: the batch the rollout side samples against the algorithm's and the
    optimiser's needs of it."""
    from ..algorithms import ADVANTAGE_ESTIMATORS

    return [
        (
            not ADVANTAGE_ESTIMATORS.traits(c.advantage_estimator)["needs_groups"] or c.group_size >= 2,
            "group_size",
            f">= 2 for the {c.advantage_estimator!r} estimator (its baseline is the rest of the group)",
        ),
        (
            not c.dynamic_sampling or c.group_size >= 2,
            "dynamic_sampling",
            "False when group_size is 1 "
            "(a group of one sample never has reward variance: every group would be dropped)",
        ),
        (
            not (c.unscored_in_loss and (c.dynamic_sampling or c.rollout_workers)),
            "unscored_in_loss",
            "False with dynamic_sampling or rollout_workers "
            "(their filler rows are unscored too, and must stay out of the loss)",
        ),
        (
            c.mini_batch_size is None or c.mini_batch_size <= c.batch_size,
            "mini_batch_size",
            f"at most the batch size {c.batch_size} (prompts_per_step x group_size) or None",
        ),
        (
            c.overlong_buffer_len is None or c.overlong_buffer_len < c.max_new_tokens,
            "overlong_buffer_len",
            f"less than max_new_tokens ({c.max_new_tokens}) or None: the buffer is the last tokens before the limit",
        ),
    ]


# Each concern's rules (rl.py, base.py, rollout.py, the engine's registry entry, algorithm.py, teacher.py),
# then those across concerns; ``validate`` raises for the first that fails.
RULES = (
    model_rules,
    shared_rules,
    rollout_rules,
    engine_rules,
    algorithm_rules,
    check_teacher,
    cross_part_rules,
)
