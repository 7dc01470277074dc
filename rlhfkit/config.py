"""Configuration: dataclasses split by concern, each field documented right under it (that
docstring is the only source of help text). ``RLConfig`` joins them into one flat object, as
TRL's ``GRPOConfig`` is, and fills fields left at ``None`` from the chosen algorithm's preset.
Configs are frozen: nothing changes them at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


# The algorithms of DESIGN.md are presets of one config — never branches in the loop.
PRESETS: dict[str, dict] = {
    "ppo": dict(use_critic=True, advantage_estimator="gae", policy_loss="ppo_clip", loss_agg="token-mean",
                kl_in_reward=True, kl_estimator="k1", kl_coef=0.05, whiten_advantages=True, group_size=1,
                num_iterations=4),
    "grpo": dict(use_critic=False, advantage_estimator="group", policy_loss="ppo_clip",
                 loss_agg="seq-mean-token-mean", kl_in_reward=False, kl_estimator="k3", kl_coef=0.04,
                 whiten_advantages=False, group_size=4, num_iterations=1),
    "dr_grpo": dict(use_critic=False, advantage_estimator="group_no_std", policy_loss="ppo_clip",
                    loss_agg="seq-mean-token-sum-norm", kl_in_reward=False, kl_estimator="k3", kl_coef=0.0,
                    whiten_advantages=False, group_size=4, num_iterations=1),
    "reinforce": dict(use_critic=False, advantage_estimator="reinforce", policy_loss="vanilla",
                      loss_agg="seq-mean-token-sum", kl_in_reward=True, kl_estimator="k1", kl_coef=0.05,
                      whiten_advantages=False, group_size=1, num_iterations=1),
    "rloo": dict(use_critic=False, advantage_estimator="rloo", policy_loss="vanilla",
                 loss_agg="seq-mean-token-sum", kl_in_reward=True, kl_estimator="k1", kl_coef=0.05,
                 whiten_advantages=False, group_size=4, num_iterations=1),
}


@dataclass(frozen=True)
class ModelConfig:
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16. bfloat16 halves memory; float32 is the safe CPU default."""
    critic: str = "separate"
    """PPO critic: 'separate' (its own copy of the backbone, as in the reference) or 'shared' (a value head on the policy's backbone: less memory)."""
    device: str = "auto"
    """Where the models run: 'auto' (the GPU when torch sees one, else the CPU), 'cpu', 'cuda', 'cuda:N'."""
    autocast: str | None = None
    """Mixed precision: 'bfloat16' runs generation and forward/backward matmuls in bfloat16 under torch.autocast while weights, gradients and optimizer states stay in `dtype` (use with float32). None: off."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward instead of keeping them: less memory, ~30% more update time."""
    share_prompt: bool = True
    """Run each prompt through the model once per group and share its key/value cache with the group's G completions, in generation and in the log-prob/update passes (same results, less compute; the update passes skip it under gradient_checkpointing)."""
    critic_init: str | None = None
    """Directory of a trained reward model to initialise the separate critic from; None: from the policy."""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8
    """Distinct prompts sampled per RL step; the batch is prompts_per_step x group_size completions."""
    group_size: int | None = None
    """G completions per prompt (rows g*G .. g*G+G-1 share prompt g). None: the preset's (GRPO/RLOO 4, PPO/REINFORCE 1)."""
    max_new_tokens: int = 32
    """Response length limit in tokens; completions that hit it without EOS count as truncated."""
    max_prompt_length: int | None = None
    """Prompts longer than this (tokens) are cut from the left, keeping their end. None: no limit."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed from logits divided by it too (so they match the sampler)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0: off). Note: log-probs ignore the truncation, as in TRL and verl."""
    top_k: int = 0
    """Top-k sampling (0: off)."""


@dataclass(frozen=True)
class AlgorithmConfig:
    algorithm: str = "grpo"
    """Preset: ppo, grpo, dr_grpo, reinforce or rloo. Any field below left at None takes the preset's value."""
    advantage_estimator: str | None = None
    """Name in ADVANTAGE_ESTIMATORS: gae, group, group_no_std, rloo, reinforce, reinforce_plus_plus."""
    policy_loss: str | None = None
    """Name in POLICY_LOSSES: ppo_clip (clipped surrogate) or vanilla (plain policy gradient)."""
    loss_agg: str | None = None
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    loss_horizon: int | None = None
    """Constant divisor for seq-mean-token-sum-norm (Dr.GRPO); None: max_new_tokens."""
    use_critic: bool | None = None
    """Train a value model (PPO). Required by the gae estimator."""
    kl_coef: float | None = None
    """β of the KL penalty to the reference policy; 0 turns the reference off entirely."""
    kl_estimator: str | None = None
    """k1, k2, k3 or abs (Schulman 2020). PPO puts k1 in the reward; GRPO puts k3 in the loss."""
    kl_in_reward: bool | None = None
    """True: -β·KL is added to every token's reward. False: β·KL is added to the loss (GRPO)."""
    adaptive_kl: bool = False
    """Adapt β towards kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = 6.0
    """Target KL (nats per sequence) of the adaptive controller."""
    kl_horizon: float = 10000.0
    """Horizon of the adaptive controller (samples); larger moves β more slowly."""
    clip_low: float = 0.2
    """PPO clip ε below 1 (ratio floor 1-ε)."""
    clip_high: float = 0.2
    """PPO clip ε above 1 (ratio ceiling 1+ε); DAPO's clip-higher uses 0.28."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (Ye et al. 2020); None: off."""
    value_clip: float | None = 0.2
    """Clip range of the value update around the old values (cliprange_value); None: plain MSE."""
    vf_coef: float = 0.5
    """Weight of the value loss in the total loss (c1 of the PPO paper)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (c2 of the PPO paper); 0 computes entropy as a metric only."""
    gamma: float = 1.0
    """Discount of GAE and REINFORCE++ returns; 1 is standard for LM episodes."""
    lam: float = 0.95
    """GAE λ."""
    whiten_advantages: bool | None = None
    """Whiten advantages over the batch's response tokens (PPO)."""
    num_iterations: int | None = None
    """K: passes (PPO epochs) over each batch; old log-probs are kept from before the first update."""
    missing_eos_penalty: float | None = None
    """Score given to completions that never emit EOS (the EOS trick, e.g. -1). None: off."""
    reward_clip: float | None = None
    """Clip scores to [-reward_clip, reward_clip] before advantages. None: off."""
    normalize_rewards: bool = False
    """Whiten scores over the batch before advantages."""


@dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-5
    """AdamW learning rate of the policy."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critic; None: learning_rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; None: off."""
    warmup_steps: int = 0
    """Linear learning-rate warmup, in optimizer steps."""
    lr_scheduler: str = "constant"
    """constant, linear or cosine decay to 0 (after warmup)."""
    mini_batch_size: int | None = None
    """Rows per optimizer step; None: the whole batch (one step per pass)."""
    micro_batch_size: int | None = None
    """Rows per forward/backward (gradient accumulation inside a mini-batch); None: the mini-batch."""


@dataclass(frozen=True)
class RunConfig:
    max_steps: int = 100
    """RL steps (each: generate, score, update)."""
    seed: int = 0
    """Seed of torch, numpy and Python's random, and of the prompt order."""
    output_dir: str | None = None
    """Run directory (metrics.jsonl, checkpoints, final model); None: nothing is written."""
    save_steps: int = 0
    """Write a checkpoint every this many steps (0: only the final model)."""
    save_total_limit: int | None = None
    """Keep only the newest this many checkpoints of this run (older checkpoint-N directories are deleted); None: keep all."""
    resume_from: str | None = None
    """Checkpoint directory to continue from (weights, optimizer, scheduler, RNG, data position)."""
    log_every: int = 1
    """Print a progress line every this many steps (0: silent)."""
    progress_bar: bool = True
    """On a terminal, show a progress bar with ETA and the main metric; False (--quiet): log lines only."""
    overwrite: bool = False
    """Allow output_dir to exist and hold files already (they may be replaced). False: refuse, so no run is lost."""
    num_logged_samples: int = 4
    """Completions written to samples.jsonl (for the report) at each of ~10 evenly spaced steps."""
    eval_every: int = 0
    """With an eval dataset: evaluate before the first step, every this many steps and after the last (0: before and after only). Greedy completions scored by the training reward sources, logged as eval/<source>_mean, eval/score_mean."""
    eval_max_new_tokens: int | None = None
    """New-token limit of the evaluation's greedy completions; None: max_new_tokens."""


@dataclass(frozen=True)
class RLConfig(RunConfig, OptimConfig, AlgorithmConfig, RolloutConfig, ModelConfig):
    """Everything an RL run reads. ``RLConfig(algorithm="rloo", kl_coef=0.1)``."""

    def __post_init__(self):
        if self.algorithm not in PRESETS:
            raise ValueError(f"algorithm must be one of {', '.join(PRESETS)}, got {self.algorithm!r}")
        for key, value in PRESETS[self.algorithm].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        _validate(self)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def replace(self, **changes) -> "RLConfig":
        """A copy with ``changes``. Switching ``algorithm`` also resets the fields that still hold the
        old preset's values, so the new preset fills them (not the old algorithm's settings)."""
        new_algorithm = changes.get("algorithm", self.algorithm)
        if new_algorithm != self.algorithm and new_algorithm in PRESETS:
            for key, value in PRESETS[self.algorithm].items():
                if key not in changes and getattr(self, key) == value:
                    changes[key] = None
        return dataclasses.replace(self, **changes)


def _validate(c: RLConfig) -> None:
    from .algorithms import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

    ADVANTAGE_ESTIMATORS.get(c.advantage_estimator)
    POLICY_LOSSES.get(c.policy_loss)
    KL_ESTIMATORS.get(c.kl_estimator)
    checks = [
        (c.loss_agg in AGGREGATIONS, "loss_agg", f"one of {', '.join(AGGREGATIONS)}"),
        (c.group_size >= 1, "group_size", ">= 1"),
        (c.advantage_estimator not in ("group", "group_no_std", "rloo") or c.group_size >= 2, "group_size",
         f">= 2 for the {c.advantage_estimator!r} estimator"),
        (c.advantage_estimator != "gae" or c.use_critic, "use_critic", "True for the 'gae' estimator"),
        (not c.use_critic or c.advantage_estimator in ("gae", "reinforce_plus_plus"), "use_critic",
         f"False for the {c.advantage_estimator!r} estimator (it gives the critic no returns to learn)"),
        (c.max_prompt_length is None or c.max_prompt_length >= 1, "max_prompt_length", ">= 1 or None"),
        (c.device == "auto" or c.device.split(":")[0] in ("cpu", "cuda", "mps", "xpu"), "device",
         "'auto', 'cpu', 'cuda' (or 'cuda:N'), 'mps' or 'xpu'"),
        (c.prompts_per_step >= 1, "prompts_per_step", ">= 1"),
        (c.max_new_tokens >= 1, "max_new_tokens", ">= 1"),
        (c.temperature > 0, "temperature", "> 0"),
        (0 < c.top_p <= 1, "top_p", "in (0, 1]"),
        (c.kl_coef >= 0, "kl_coef", ">= 0"),
        (c.num_iterations >= 1, "num_iterations", ">= 1"),
        (c.max_steps >= 0, "max_steps", ">= 0"),
        (c.eval_every >= 0, "eval_every", ">= 0"),
        (c.save_total_limit is None or c.save_total_limit >= 1, "save_total_limit", "None or >= 1"),
        (c.eval_max_new_tokens is None or c.eval_max_new_tokens >= 1, "eval_max_new_tokens", "None or >= 1"),
        (c.learning_rate > 0, "learning_rate", "> 0"),
        (c.lr_scheduler in ("constant", "linear", "cosine"), "lr_scheduler", "'constant', 'linear' or 'cosine'"),
        (c.critic in ("separate", "shared"), "critic", "'separate' or 'shared'"),
        (c.dtype in ("float32", "bfloat16", "float16"), "dtype", "float32, bfloat16 or float16"),
        (c.autocast in (None, "bfloat16", "float16"), "autocast", "None, 'bfloat16' or 'float16'"),
        (c.mini_batch_size is None or 1 <= c.mini_batch_size <= c.batch_size, "mini_batch_size",
         f"between 1 and the batch size {c.batch_size}"),
        (c.micro_batch_size is None or c.micro_batch_size >= 1, "micro_batch_size", ">= 1"),
    ]
    check_fields(c, checks)



@dataclass(frozen=True)
class TrainConfig:
    """Fields shared by the supervised trainers (SFT, reward model); each subclass re-declares the
    fields whose defaults differ."""

    learning_rate: float = 2e-5
    """AdamW peak learning rate."""
    num_epochs: float = 1.0
    """Passes over the training data when max_steps is None (fractions allowed)."""
    max_steps: int | None = None
    """Optimizer steps to run; None: from num_epochs."""
    batch_size: int = 8
    """Rows per step."""
    max_length: int = 1024
    """Tokens per sequence (prompt + completion + EOS); longer: the prompt's start goes first."""
    warmup_steps: int = 0
    """Linear learning-rate warmup, in optimizer steps."""
    lr_scheduler: str = "cosine"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine (Loshchilov & Hutter 2017)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay on every trainable parameter (norms and biases too)."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; None: off."""
    eval_every: int = 0
    """Evaluate on eval_dataset every this many optimizer steps (0: only after the last step)."""
    seed: int = 0
    """Seed of torch, numpy and Python's random and of the per-epoch data order."""
    output_dir: str | None = None
    """Run directory (config.yaml, metrics.jsonl, plots/, final/); None: nothing is written."""
    log_every: int = 10
    """Print a progress line every this many steps (0: silent); metrics.jsonl gets every step."""
    dtype: str = "float32"
    """Weights dtype when the model is loaded from a directory: float32, bfloat16 or float16."""
    progress_bar: bool = True
    """On a terminal, show a progress bar with ETA and the main metric; False (--quiet): log lines only."""
    overwrite: bool = False
    """Allow output_dir to exist and hold files already (they may be replaced). False: refuse, so no run is lost."""

    def __post_init__(self):
        check_fields(self, [
            (self.learning_rate > 0, "learning_rate", "> 0"),
            (self.num_epochs > 0, "num_epochs", "> 0"),
            (self.max_steps is None or self.max_steps >= 0, "max_steps", ">= 0 or None"),
            (self.batch_size >= 1, "batch_size", ">= 1"),
            (self.max_length >= 2, "max_length", ">= 2"),
            (self.warmup_steps >= 0, "warmup_steps", ">= 0"),
            (self.lr_scheduler in ("constant", "linear", "cosine"), "lr_scheduler", "constant, linear or cosine"),
            (self.weight_decay >= 0, "weight_decay", ">= 0"),
            (self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "> 0 or None"),
            (self.eval_every >= 0, "eval_every", ">= 0"),
            (self.log_every >= 0, "log_every", ">= 0"),
            (self.dtype in ("float32", "bfloat16", "float16"), "dtype", "float32, bfloat16 or float16"),
        ])

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def check_fields(config, checks) -> None:
    """Raise for the first ``(ok, field, expected)`` that fails, naming the config and the field."""
    for ok, name, expected in checks:
        if not ok:
            raise ValueError(f"{type(config).__name__}: config field {name!r} must be {expected}, "
                             f"got {getattr(config, name)!r}")


# Re-exported: config files and help text live in config_io.py.
from .config_io import field_docs, format_help, load_config, save_config  # noqa: E402,F401
