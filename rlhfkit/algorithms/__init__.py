"""The algorithm core: pure tensor math (torch and the standard library only).

Every formula of rlhfkit lives here once: advantages, KL estimators and controllers, policy losses
(PPO's clip with GSPO's sequence-level ratio, CISPO, SAPO, VESPO, plain policy gradient; one interface,
``LossInputs`` -> ``LossOutputs``) and the value loss, loss
aggregation, the DPO-family preference losses, SFT's per-token losses (NLL, DFT), reward shaping
and DAPO's sample filters, the rollout importance-sampling correction, and lean per-token
log-probs / entropies (and the teacher–student divergence of on-policy distillation); the losses'
metrics as sufficient statistics of declared kinds (``metrics.py``).
"""

from ._checks import masked_mean, masked_sum, masked_var
from .advantages import (
    broadcast_sequence_advantages,
    gae,
    group_advantages,
    group_batch_std_advantages,
    group_normalized_sum,
    reinforce_advantages,
    rloo_advantages,
    whiten,
)
from .dpo import DPO_LOSS_TYPES, F_DIVERGENCES, dpo_loss
from .dpo_terms import ld_logps, log_sum_sq_probs, wpo_weights
from .kl import AdaptiveEntropyController, AdaptiveKLController, FixedKLController, kl_penalty
from .linear_divergence import divergence_from_logits, linear_divergence
from .linear_logprobs import linear_logprobs
from .logprobs import entropy_from_logits, log_kept_mass, selective_logprobs
from .loss_interface import Hyperparameter, LossInputs, LossOutputs
from .loss_registry import POLICY_LOSSES, check_loss_options, loss_hyperparameters
from .losses import AGGREGATIONS, aggregate, bradley_terry_loss, corrected_loss, value_loss
from .metrics import (
    Metric,
    StepMetrics,
    as_metric,
    explained_variance,
    global_values,
    metric_values,
    reduce_steps,
    token_max,
    token_mean,
    token_std,
)
from .policy_losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    cispo_policy_loss,
    cispo_token_loss,
    importance_ratio,
    pg_loss,
    pg_token_loss,
    ppo_policy_loss,
    ppo_token_loss,
    sapo_policy_loss,
    sapo_token_loss,
    vespo_policy_loss,
)
from .registry import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, Registry, sequence_rewards
from .rollout_is import ROLLOUT_IS_MODES, rollout_is_weights
from .sft_losses import SFT_LOSS_TYPES, is_top1, sft_token_loss
from .shaping import (
    apply_missing_eos_penalty,
    group_has_variance,
    high_entropy_mask,
    last_token_index,
    mask_truncated,
    off_policy_sequence_mask,
    overlong_penalty,
    teacher_token_advantages,
    token_level_rewards,
)

__all__ = [
    "SFT_LOSS_TYPES",
    "sft_token_loss",
    "is_top1",
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "DPO_LOSS_TYPES",
    "F_DIVERGENCES",
    "dpo_loss",
    "ld_logps",
    "log_sum_sq_probs",
    "wpo_weights",
    "AdaptiveEntropyController",
    "AdaptiveKLController",
    "FixedKLController",
    "KL_ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "Hyperparameter",
    "LossInputs",
    "LossOutputs",
    "Metric",
    "StepMetrics",
    "as_metric",
    "explained_variance",
    "global_values",
    "metric_values",
    "reduce_steps",
    "token_max",
    "token_mean",
    "token_std",
    "POLICY_LOSSES",
    "ROLLOUT_IS_MODES",
    "Registry",
    "aggregate",
    "apply_missing_eos_penalty",
    "bradley_terry_loss",
    "broadcast_sequence_advantages",
    "check_loss_options",
    "cispo_policy_loss",
    "cispo_token_loss",
    "corrected_loss",
    "entropy_from_logits",
    "log_kept_mass",
    "loss_hyperparameters",
    "gae",
    "group_advantages",
    "group_batch_std_advantages",
    "group_normalized_sum",
    "group_has_variance",
    "high_entropy_mask",
    "off_policy_sequence_mask",
    "importance_ratio",
    "kl_penalty",
    "last_token_index",
    "mask_truncated",
    "teacher_token_advantages",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "overlong_penalty",
    "linear_logprobs",
    "linear_divergence",
    "divergence_from_logits",
    "pg_loss",
    "pg_token_loss",
    "ppo_policy_loss",
    "ppo_token_loss",
    "sapo_policy_loss",
    "sapo_token_loss",
    "vespo_policy_loss",
    "reinforce_advantages",
    "rloo_advantages",
    "rollout_is_weights",
    "selective_logprobs",
    "sequence_rewards",
    "token_level_rewards",
    "value_loss",
    "whiten",
]
