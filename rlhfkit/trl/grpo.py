"""TRL 1.16's ``GRPOConfig`` / ``RLOOConfig`` (their trainers: ``rl_trainers.py``), on rlhfkit's one RL loop.

The config is TRL's dataclass (``transformers.TrainingArguments`` plus TRL's fields, TRL's defaults
and checks); ``to_rlhfkit`` is the one table that maps it to an ``RLConfig``. The batch arithmetic
is TRL's (``GRPOConfig.__post_init__``): ``per_device_train_batch_size`` completions per process
per micro-step; a generation covers ``steps_per_generation`` micro-steps of every process
(``generation_batch_size`` completions, ``num_generations`` per prompt); an optimizer step closes
every ``gradient_accumulation_steps`` micro-steps; ``num_iterations`` passes over each generation.
In rlhfkit's terms: ``prompts_per_step = generation_batch_size / num_generations``,
``mini_batch_size = per_device_train_batch_size x processes x gradient_accumulation_steps``
(completions per optimizer step), ``micro_batch_size = per_device_train_batch_size``; so both
sample the same completions per optimizer step and take ``num_iterations x steps_per_generation /
gradient_accumulation_steps`` optimizer steps per generation. ``max_steps`` counts optimizer steps,
as in TRL (it must be a whole number of generations).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import RLConfig
from ..data.encode import warn_once
from .arguments import check_choice
from .generation import GenerationArguments

# TRL's loss_type -> (rlhfkit's policy_loss, loss_agg). "grpo": each sequence's token mean, averaged;
# "bnpo": each micro-batch's token mean, averaged; "dapo": the mean over every token of the optimizer
# step; "dr_grpo": token sums over a constant (max_completion_length); "luspo": each sequence's token
# sum, averaged (a sequence ratio weighs its sequence by its length); "cispo": the capped, detached ratio
# and "vespo": the Gamma-weighted sequence ratio, both with the dapo normaliser; "sapo": the soft gate
# per sequence as "grpo".
LOSS_TYPES = {
    "grpo": ("ppo_clip", "seq-mean-token-mean"),
    "bnpo": ("ppo_clip", "micro-batch-token-mean"),
    "dapo": ("ppo_clip", "token-mean"),
    "dr_grpo": ("ppo_clip", "seq-mean-token-sum-norm"),
    "luspo": ("ppo_clip", "seq-mean-token-sum"),
    "cispo": ("cispo", "token-mean"),
    "sapo": ("sapo", "seq-mean-token-mean"),
    "vespo": ("vespo", "token-mean"),
}
SCALE_REWARDS = {"group": "group", "batch": "group_batch_std", "none": "group_no_std"}
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class GRPOConfig(GenerationArguments):
    """TRL 1.16's ``GRPOConfig``: its fields, defaults and checks; ``to_rlhfkit`` gives the
    ``RLConfig`` rlhfkit runs (docs: "Coming from TRL")."""

    beta: float = 0.0
    delta: float | None = None
    cast_lm_head_to_fp32: bool = False
    sapo_temperature_neg: float = 1.05
    sapo_temperature_pos: float = 1.0
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    importance_sampling_level: str = "token"
    multi_objective_aggregation: str = "sum_then_normalize"
    scale_rewards: str = (
        "group"  # TRL's annotation (str), so its parsers read --scale_rewards batch; True / False still work
    )
    loss_type: str = "dapo"
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2
    max_tool_calling_iterations: int | None = None
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_max: float | None = 3.0
    vllm_importance_sampling_clip_min: float | None = None
    off_policy_mask_threshold: float | None = None
    use_bias_correction_kl: bool = True
    log_completions_hub_repo: str | None = None
    vllm_importance_sampling_cap: float | None = None

    HANDLED = GenerationArguments.HANDLED | {
        "beta",
        "delta",
        "sapo_temperature_neg",
        "sapo_temperature_pos",
        "vespo_k_pos",
        "vespo_lambda_pos",
        "vespo_k_neg",
        "vespo_lambda_neg",
        "importance_sampling_level",
        "top_entropy_quantile",
        "off_policy_mask_threshold",
        "scale_rewards",
        "multi_objective_aggregation",
        "loss_type",
        "entropy_coef",
        "use_adaptive_entropy",
        "entropy_target",
        "entropy_coef_delta",
        "entropy_coef_min",
        "entropy_coef_max",
        "max_tool_calling_iterations",
        "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode",
        "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min",
        "use_bias_correction_kl",
    }

    def __post_init__(self):
        booleans: dict[str | bool, str] = {True: "group", False: "none"}  # TRL's rule
        self.scale_rewards = booleans.get(self.scale_rewards, self.scale_rewards)
        super().__post_init__()

    def check_supported(self) -> None:
        super().check_supported()
        check_choice(self, "loss_type", tuple(LOSS_TYPES))
        check_choice(self, "scale_rewards", tuple(SCALE_REWARDS))
        check_choice(self, "multi_objective_aggregation", ("sum_then_normalize", "normalize_then_sum"))
        check_choice(self, "importance_sampling_level", ("token", "sequence"))
        check_choice(self, "vllm_importance_sampling_mode", IS_MODES)
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if high is not None and not high > 1 or low is not None and not (0 <= low and (high is None or low < high)):
            raise ValueError(
                f"GRPOConfig fields 'vllm_importance_sampling_clip_min'={low!r} and "
                f"'vllm_importance_sampling_clip_max'={high!r} are not supported by rlhfkit: a cap above 1 "
                "(or None) and a floor in [0, cap) (or None)"
            )
        if self.loss_type == "vespo" and self.use_vllm and self.vllm_importance_sampling_correction:
            if self.vllm_importance_sampling_mode not in ("token_truncate", "token_mask"):  # TRL's rule
                raise ValueError(
                    "VESPO loss requires `vllm_importance_sampling_mode` to be either 'token_truncate' or "
                    f"'token_mask'. Got: {self.vllm_importance_sampling_mode}."
                )

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> RLConfig:
        """The ``RLConfig`` of this config for a dataset of ``n_rows`` prompts on ``world`` processes."""
        fields = self._rl_fields(n_rows, world)  # rlhfkit's refusals first
        assert isinstance(self.scale_rewards, str)  # __post_init__ named the booleans, check_supported refused the rest
        gdpo = self.multi_objective_aggregation == "normalize_then_sum"
        policy_loss, loss_agg = LOSS_TYPES[self.loss_type]
        loss_options, level = {}, self.importance_sampling_level
        if self.loss_type == "cispo":  # TRL caps the ratio at epsilon_high itself; rlhfkit at 1 + clip_high
            fields["clip_high"] -= 1.0  # (TRL's default epsilon_high 0.2 caps it at 0.2: -0.8 here, as TRL runs it)
            del fields["clip_low"]  # CISPO has no lower bound (TRL's cispo ignores epsilon; rlhfkit refuses it set)
        elif self.loss_type in ("sapo", "vespo"):  # no clip: TRL's sapo and vespo read no epsilon
            del fields["clip_low"], fields["clip_high"]
            if self.loss_type == "sapo":
                loss_options = {
                    "temperature_pos": self.sapo_temperature_pos,
                    "temperature_neg": self.sapo_temperature_neg,
                }
            else:  # VESPO builds its own sequence ratio whatever the level (TRL warns of a level other than token)
                loss_options = {k: getattr(self, f"vespo_{k}") for k in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")}
                level = "token"
        if self.delta is not None:
            fields["dual_clip"] = self._two_sided_clip(self.delta, fields.get("clip_high"))
        iterations = self.max_tool_calling_iterations
        if self.beta and self.use_bias_correction_kl:
            warn_once(
                "GRPOConfig: rlhfkit's KL term is not weighted by the importance ratio as TRL's "
                "use_bias_correction_kl=True weighs it (the same value on policy, another gradient); set "
                "use_bias_correction_kl=False to say you know"
            )
        fields.update(
            algorithm="grpo",
            # GDPO (normalize_then_sum): each function normalised in its group, summed, then standardised over the batch
            advantage_estimator="batch_standardized" if gdpo else SCALE_REWARDS[self.scale_rewards],
            reward_aggregation=self.multi_objective_aggregation,
            policy_loss=policy_loss,
            loss_agg=loss_agg,
            loss_horizon=self.max_completion_length if self.loss_type == "dr_grpo" else None,
            use_critic=False,
            kl_coef=self.beta,
            kl_estimator="k3",
            kl_in_reward=False,
            whiten_advantages=False,
            advantage_epsilon=1e-4,  # TRL's (rewards - mean) / (std + 1e-4)
            importance_sampling_level=level,
            loss_options=loss_options,
            dynamic_sampling=False,
            entropy_coef=self.entropy_coef,
            use_adaptive_entropy=self.use_adaptive_entropy,
            entropy_target=self.entropy_target,
            entropy_coef_delta=self.entropy_coef_delta,
            entropy_coef_min=self.entropy_coef_min,
            entropy_coef_max=self.entropy_coef_max,
            top_entropy_quantile=self.top_entropy_quantile,
            off_policy_mask_threshold=self.off_policy_mask_threshold,
            entropy_agg="micro-batch-token-mean",
            max_tool_calling_iterations=self.max_completion_length if iterations is None else iterations,
            # TRL's sampling correction: clip_max caps (None: no cap), clip_min floors (None: none), and a mask
            # mode's rejected tokens stay in the normaliser with weight 0
            rollout_is=self.vllm_importance_sampling_mode if self.vllm_importance_sampling_correction else "none",
            rollout_is_threshold=self.vllm_importance_sampling_clip_max,
            rollout_is_threshold_low=self.vllm_importance_sampling_clip_min or 0.0,
            rollout_is_zero_masked=True,
        )
        return RLConfig(**fields)

    def _two_sided_clip(self, delta: float, clip_high: float | None) -> float:
        """``delta`` (INTELLECT-2's two-sided clip, arXiv:2505.07291: the ratio of a token's unclipped
        term capped at ``delta``) as rlhfkit's ``dual_clip``: with ``delta >= 1 + epsilon_high`` both
        bound a negative advantage's loss at ``delta x |A|`` and leave the rest as PPO's (the same loss
        and gradient); a smaller one, or a loss without PPO's clip (no ``clip_high``), is refused in one line."""
        if clip_high is None or LOSS_TYPES[self.loss_type][0] != "ppo_clip":
            raise ValueError(
                f"GRPOConfig field 'delta'={delta!r} is not supported by rlhfkit with loss_type="
                f"{self.loss_type!r} (TRL applies it to the clipped losses only: grpo, bnpo, dapo, dr_grpo, luspo)"
            )
        if not delta >= 1.0 + clip_high:
            raise ValueError(
                f"GRPOConfig field 'delta'={delta!r} is not supported by rlhfkit below 1 + epsilon_high "
                f"({1.0 + clip_high:g}), where it would cap the clipped term too (TRL recommends delta > 1 + epsilon)"
            )
        return float(delta)


@dataclass
class RLOOConfig(GenerationArguments):
    """TRL 1.16's ``RLOOConfig``: its fields, defaults and checks; ``to_rlhfkit`` gives the
    ``RLConfig`` of rlhfkit's ``rloo`` preset (leave-one-out baseline, k1 KL in the reward) with TRL's
    loss: PPO's clip on each completion's probability ratio ``exp(Σ_t log π/π_old)``
    (``importance_sampling_level="sequence_sum"``), averaged over completions — at ``π = π_old``
    REINFORCE's gradient, the preset's own; off policy (``num_iterations > 1``, or several optimizer
    steps per generation) clipped as TRL clips it."""

    num_generations: int | None = 2
    beta: float = 0.05
    normalize_advantages: bool = False
    reward_clip_range: tuple[float, float] | None = None

    HANDLED = GenerationArguments.HANDLED | {"beta", "reward_clip_range", "normalize_advantages"}

    def check_supported(self) -> None:
        super().check_supported()
        clip = self.reward_clip_range
        if clip is not None and clip[0] != -clip[1]:
            raise ValueError(
                f"RLOOConfig field 'reward_clip_range'={clip!r} is not supported by rlhfkit: only a range "
                "symmetric about 0, (-c, c)"
            )

    def to_rlhfkit(self, n_rows: int, world: int = 1) -> RLConfig:
        fields = self._rl_fields(n_rows, world)
        fields.update(
            algorithm="rloo",
            policy_loss="ppo_clip",
            importance_sampling_level="sequence_sum",
            loss_agg="seq-mean-token-mean",  # one loss per completion, averaged
            # TRL standardises the leave-one-out advantages over the batch's completions: (A - mean) / (std + 1e-4)
            advantage_estimator="rloo_standardized" if self.normalize_advantages else "rloo",
            advantage_epsilon=1e-4,
            kl_coef=self.beta,
            rollout_is="none",  # TRL's RLOO corrects no vLLM gap
            reward_clip=None if self.reward_clip_range is None else self.reward_clip_range[1],
        )
        return RLConfig(**fields)
