"""The algorithm's fields of ``RLConfig`` (``rl.py``): ``AlgorithmConfig`` (advantages, losses, KL, clipping,
score shaping, the rollout correction) and ``PRESETS``, the algorithms as values of those fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The algorithms of docs/architecture.md ("Presets") are presets of one config — never branches in the loop. Every
# preset
# names every preset field (those defaulting to None); _TOKEN_PPO holds the values most share,
# _GROUP_NO_KL those of the critic-free, KL-free group recipes (GSPO, CISPO, DAPO).
_TOKEN_PPO = dict(
    clip_low=0.2, clip_high=0.2, importance_sampling_level="token", dynamic_sampling=False, distillation_coef=0.0
)
_GROUP_NO_KL = dict(
    use_critic=False,
    advantage_estimator="group",
    kl_in_reward=False,
    kl_estimator="k3",
    kl_coef=0.0,
    whiten_advantages=False,
    group_size=4,
    num_iterations=1,
    distillation_coef=0.0,
)
PRESETS: dict[str, dict] = {
    "ppo": dict(
        _TOKEN_PPO,
        use_critic=True,
        advantage_estimator="gae",
        policy_loss="ppo_clip",
        loss_agg="token-mean",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.05,
        whiten_advantages=True,
        group_size=1,
        num_iterations=4,
    ),
    "grpo": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="group",
        policy_loss="ppo_clip",
        loss_agg="seq-mean-token-mean",
        kl_in_reward=False,
        kl_estimator="k3",
        kl_coef=0.04,
        whiten_advantages=False,
        group_size=4,
        num_iterations=1,
    ),
    "dr_grpo": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="group_no_std",
        policy_loss="ppo_clip",
        loss_agg="seq-mean-token-sum-norm",
        kl_in_reward=False,
        kl_estimator="k3",
        kl_coef=0.0,
        whiten_advantages=False,
        group_size=4,
        num_iterations=1,
    ),
    "reinforce": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="reinforce",
        policy_loss="vanilla",
        loss_agg="seq-mean-token-sum",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.05,
        whiten_advantages=False,
        group_size=1,
        num_iterations=1,
    ),
    "rloo": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="rloo",
        policy_loss="vanilla",
        loss_agg="seq-mean-token-sum",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.05,
        whiten_advantages=False,
        group_size=4,
        num_iterations=1,
    ),
    # REINFORCE++ (Hu 2025, arXiv:2501.03262): token-level k1 KL in the reward, discounted returns
    # whitened over the batch (the estimator does it), PPO's clipped surrogate, no critic, no groups.
    "reinforce_plus_plus": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="reinforce_plus_plus",
        policy_loss="ppo_clip",
        loss_agg="token-mean",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.01,
        whiten_advantages=False,
        group_size=1,
        num_iterations=1,
    ),
    # GSPO (Zheng et al. 2025, arXiv:2507.18071): group advantages, the sequence-level ratio clipped
    # to [1 - 3e-4, 1 + 4e-4] (§5.1), one term per sequence (seq-mean-token-mean), no KL (TRL's
    # recipe: importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0).
    "gspo": dict(
        _GROUP_NO_KL,
        policy_loss="ppo_clip",
        importance_sampling_level="sequence",
        clip_low=3e-4,
        clip_high=4e-4,
        loss_agg="seq-mean-token-mean",
        dynamic_sampling=False,
    ),
    # CISPO (MiniMax-M1, arXiv:2506.13585, eqs. 4-5): group advantages, the detached ratio capped
    # above only (clip_low is unused), normalised by the batch's tokens, no KL. The paper tunes only
    # ε_high; 4 (a cap of 5) is ScaleRL's ε_max (Khatri et al. 2025, arXiv:2510.13786), TRL's advice.
    "cispo": dict(
        _GROUP_NO_KL,
        policy_loss="cispo",
        importance_sampling_level="token",
        clip_low=0.2,
        clip_high=4.0,
        loss_agg="token-mean",
        dynamic_sampling=False,
    ),
    # DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher 0.2/0.28 (§3.1), dynamic sampling (§3.2),
    # token-level loss (§3.3), no KL. Its soft overlong punishment (§3.4) needs a buffer length
    # that suits max_new_tokens: overlong_buffer_len stays off unless set.
    "dapo": dict(
        _GROUP_NO_KL,
        policy_loss="ppo_clip",
        importance_sampling_level="token",
        clip_low=0.2,
        clip_high=0.28,
        loss_agg="token-mean",
        dynamic_sampling=True,
    ),
    # On-policy distillation (Agarwal et al. 2024, arXiv:2306.13649; config/teacher.py): the teacher's per-token
    # signal alone (distillation_coef 1), one completion per prompt, no reward needed, no reference KL, the token
    # mean over the batch (TRL's DistillationTrainer). With reward functions too, their scores' batch-mean
    # baseline (REINFORCE) adds to it.
    "distill": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="reinforce",
        policy_loss="ppo_clip",
        loss_agg="token-mean",
        kl_in_reward=False,
        kl_estimator="k3",
        kl_coef=0.0,
        whiten_advantages=False,
        group_size=1,
        num_iterations=1,
        distillation_coef=1.0,
    ),
}


@dataclass(frozen=True)
class AlgorithmConfig:
    algorithm: str = "grpo"
    """Preset: ppo, grpo, dr_grpo, reinforce, reinforce_plus_plus, rloo, gspo (GSPO: sequence-level ratio), cispo
    (CISPO: capped, detached ratio), dapo (DAPO: clip-higher, dynamic sampling, token-mean) or distill (on-policy
    distillation from teacher_model alone). Every field below that
    defaults to None takes the preset's value unless you set it: a value you set always wins, also when
    `replace(algorithm=...)` switches presets."""
    advantage_estimator: str | None = None
    """Name in ADVANTAGE_ESTIMATORS: gae, group, group_no_std, group_batch_std (the group mean, the batch's std), rloo,
    reinforce, reinforce_plus_plus."""
    policy_loss: str | None = None
    """Name in POLICY_LOSSES: ppo_clip (clipped surrogate), vanilla (plain policy gradient), cispo (policy gradient
    weighted by the detached ratio capped at 1 + clip_high: MiniMax-M1's CISPO), sapo (a soft sigmoid gate in place of
    the clip; loss_options temperature_pos, temperature_neg) or vespo (policy gradient weighted by a Gamma function of
    the sequence ratio; loss_options k_pos, lambda_pos, k_neg, lambda_neg)."""
    loss_agg: str | None = None
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, or
    micro-batch-token-mean (each micro-batch's token mean, the micro-batches of a step weighed alike: TRL's bnpo)."""
    loss_horizon: int | None = None
    """Constant divisor for seq-mean-token-sum-norm (Dr.GRPO); None: max_new_tokens."""
    use_critic: bool | None = None
    """Train a value model (PPO). Required by the gae estimator."""
    kl_coef: float | None = None
    """β of the KL penalty to the reference policy; 0 turns the reference off entirely."""
    kl_estimator: str | None = None
    """k1, k2, k3 or abs (Schulman 2020). In the reward (kl_in_reward) any of them works: PPO and RLOO put k1 there. In
    the loss only k2 and k3 work, because only their gradients follow a divergence: k2's gradient is that of KL(π‖ref),
    k3's (GRPO's choice) that of KL(ref‖π); k1's gradient is zero in expectation (the penalty would do nothing) and
    abs's follows no divergence, so both are refused there."""
    kl_in_reward: bool | None = None
    """True: -β·KL is added to every token's reward. False: β·KL is added to the loss (GRPO)."""
    adaptive_kl: bool = False
    """Adapt β towards kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = 6.0
    """Target KL (nats per sequence) of the adaptive controller."""
    kl_horizon: float = 10000.0
    """Horizon of the adaptive controller (samples); larger moves β more slowly."""
    sync_ref_model: bool = False
    """TR-DPO's soft update of the reference (Gorbatovski et al. 2024, arXiv:2404.09656), TRL's sync_ref_model for GRPO
    and RLOO: every ref_model_sync_steps optimizer steps the reference becomes ref_model_mixup_alpha x policy + (1 -
    ref_model_mixup_alpha) x reference, so the KL pulls toward a reference that follows the policy; checkpoints hold it.
    Needs a reference of its own (kl_coef > 0, not a LoRA policy, whose reference is its base model)."""
    ref_model_mixup_alpha: float = 0.6
    """With sync_ref_model: the policy's share α of each update of the reference."""
    ref_model_sync_steps: int = 512
    """With sync_ref_model: optimizer steps between two updates of the reference."""
    clip_low: float | None = None
    """PPO clip ε below 1 (ratio floor 1-ε). TRL's epsilon, verl's clip_ratio_low. Presets: 0.2; gspo 3e-4. Set with
    cispo or vanilla, which do not read it, it is refused."""
    clip_high: float | None = None
    """PPO clip ε above 1 (ratio ceiling 1+ε); DAPO's clip-higher uses 0.28. TRL's epsilon_high, verl's clip_ratio_high.
    Presets: 0.2; dapo 0.28; gspo 4e-4; cispo 4 (its weight's cap 1+ε = 5)."""
    importance_sampling_level: str | None = None
    """Whose importance ratio the policy loss uses (TRL's name): 'token' (each token's π/π_old: PPO, GRPO), 'sequence'
    (GSPO: the sequence's exp(mean_t log(π/π_old)), one per completion, clipped as one), 'sequence_token' (GSPO-token:
    the sequence ratio's value with each token's own gradient) or 'sequence_sum' (the sequence's probability ratio
    exp(sum_t log(π/π_old)): TRL's RLOO clips it). The ratio differs from 1 only off-policy (num_iterations
    > 1 or several minibatches per batch). vanilla has no ratio: 'token' only."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (Ye et al. 2020): the loss is at most c·|A|. verl's clip_ratio_c
    (3.0 there). None: off. ppo_clip only: set with another loss, it is refused."""
    loss_options: dict = dataclasses.field(default_factory=dict)
    """Knobs of the policy loss that are no config field of their own, by name, as its registration
    declares them (POLICY_LOSSES; the built-in losses have none: their knobs are the fields clip_low,
    clip_high and dual_clip). A YAML mapping, or JSON on the command line: loss_options='{"tau": 0.5}'.
    A knob left out takes its declared default; an unknown key, a wrong type or a value out of range
    is refused."""
    top_entropy_quantile: float = 1.0
    """ρ of "Beyond the 80/20 Rule" (arXiv:2506.01939; TRL's name): the policy loss (and the entropy bonus) keeps only
    the tokens whose entropy is in the top ρ of each micro-batch's; the rest keep their place in the loss's normaliser.
    1.0: every token (off); the paper uses 0.2."""
    off_policy_mask_threshold: float | None = None
    """δ of DeepSeek-V3.2's off-policy sequence masking (arXiv:2512.02556, eq. 9; TRL's name): a completion with a
    negative advantage whose mean per-token KL from the sampler to the current policy exceeds δ leaves the policy loss
    (its tokens keep their place in the normaliser). None: off."""
    value_clip: float | None = 0.2
    """Clip range of the value update around the old values (cliprange_value); None: plain MSE."""
    vf_coef: float = 0.5
    """Weight of the value loss in the total loss (c1 of the PPO paper)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (c2 of the PPO paper); 0 computes entropy as a metric only."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1's adaptive entropy coefficient (arXiv:2505.22312; TRL's name): entropy_coef is the starting value,
    after each optimizer step raised by entropy_coef_delta when the step's entropy is at most entropy_target, else
    lowered, within [entropy_coef_min, entropy_coef_max]; a step applies the bonus only when the previous step's entropy
    was at most the target."""
    entropy_target: float = 0.2
    """With use_adaptive_entropy: the entropy (nats per token) the coefficient steers toward."""
    entropy_coef_delta: float = 0.005
    """With use_adaptive_entropy: the coefficient's change per optimizer step."""
    entropy_coef_min: float = 0.0
    """With use_adaptive_entropy: the coefficient's floor."""
    entropy_coef_max: float = 1.0
    """With use_adaptive_entropy: the coefficient's ceiling."""
    entropy_agg: str | None = None
    """How the entropy bonus is averaged: None, as the policy loss (loss_agg); 'micro-batch-token-mean', each
    micro-batch's token mean divided by the micro-batches of the optimizer step (TRL's GRPOTrainer, whatever its
    loss_type)."""
    gamma: float = 1.0
    """Discount of GAE and REINFORCE++ returns; 1 is standard for LM episodes."""
    lam: float = 0.95
    """GAE λ."""
    whiten_advantages: bool | None = None
    """Whiten advantages over the batch's response tokens (PPO)."""
    advantage_epsilon: float = 1e-6
    """ε of the group advantages (r - mean_g) / (std_g + ε) (GRPO's 'group' estimator), as verl's 1e-6; TRL uses 1e-4
    (rlhfkit.trl's GRPOConfig sets that)."""
    num_iterations: int | None = None
    """K: passes (PPO epochs) over each batch; old log-probs are kept from before the first update."""
    missing_eos_penalty: float | None = None
    """Score given to completions that never emit EOS (the EOS trick, e.g. -1). None: off."""
    mask_truncated_completions: bool = False
    """Completions that never emitted EOS (cut at max_new_tokens) leave the loss: they still count in their group's
    reward statistics but get no gradient (TRL's name; DAPO's overlong filtering)."""
    masked_rows_count: bool = False
    """With mask_truncated_completions: a truncated row still counts as a row (an empty one) in the denominator of a
    per-sequence loss_agg (seq-mean-*), as in TRL's GRPOTrainer. False: it leaves the denominator too. token-mean counts
    tokens either way."""
    unscored_in_loss: bool = False
    """Completions no reward function scored stay in the loss with advantage 0: their tokens count in its normaliser and
    their KL and entropy terms act (TRL's GRPOTrainer). False: they leave the loss entirely. Either way they are left
    out of every reward statistic."""
    overlong_buffer_len: int | None = None
    """DAPO's soft overlong punishment (eq. 13; verl's overlong_buffer.len): a completion longer than max_new_tokens -
    overlong_buffer_len tokens loses overlong_penalty x (excess / overlong_buffer_len) of score, the whole
    overlong_penalty at max_new_tokens. None: off, also under the dapo preset (DAPO used 4096 of 20480 tokens: set it to
    suit max_new_tokens, e.g. a quarter)."""
    overlong_penalty: float = 1.0
    """Score lost by a completion of max_new_tokens tokens under overlong_buffer_len (verl's
    overlong_buffer.penalty_factor)."""
    dynamic_sampling: bool | None = None
    """DAPO's dynamic sampling (verl's algorithm.filter_groups): a group whose valid rewards are all equal, or with
    fewer than two valid, has no learning signal and is dropped; more prompts are generated until prompts_per_step
    groups are kept or max_sampling_rounds rounds are spent, after which the step trains on the groups kept. Needs
    group_size >= 2. Presets: dapo True, the others False."""
    max_sampling_rounds: int = 10
    """With dynamic_sampling: the most generation rounds per step (verl's filter_groups.max_num_gen_batches)."""
    reward_aggregation: str = "sum_then_normalize"
    """How several reward functions make one score: 'sum_then_normalize', their weighted sum (the advantage estimator
    normalises it); 'normalize_then_sum', GDPO (arXiv:2601.05242; TRL's multi_objective_aggregation): each function's
    scores normalised within each group first, then weighted and summed (pair it with advantage_estimator
    'batch_standardized', as TRL does). The logged reward/mean stays the weighted sum."""
    reward_clip: float | None = None
    """Clip scores to [-reward_clip, reward_clip] before advantages. None: off."""
    normalize_rewards: bool = False
    """Whiten scores over the batch before advantages."""
    rollout_is: str = "token_truncate"
    """Importance-sampling correction for the gap between the engine's and the trainer's log-probs of the sampled tokens
    (ratio ρ = π_trainer / π_engine; rollout_is_weights in algorithms/rollout_is.py): none, token_truncate (each token's
    loss × min(ρ_t, threshold): TIS, Yao et al. 2025), token_mask (tokens with ρ_t outside [1/threshold, threshold]
    leave the update), sequence_truncate, sequence_mask (the same with the sequence's ρ). The HF engine samples from the
    trained weights themselves: its ρ is 1 and nothing changes, unless rollout_precision gives it a quantized sampling
    copy, whose gap this corrects."""
    rollout_is_threshold: float | None = 2.0
    """The threshold C (> 1) of rollout_is: the truncation cap, or the mask's bounds [1/C, C]. None: no cap, nothing
    masked above."""
    rollout_is_threshold_low: float | None = None
    """The lower bound of rollout_is when it is not 1/C (mask modes) or none (truncation modes): the truncation modes
    floor the weight at it, the mask modes drop ratios below it (0: no lower bound). TRL's
    vllm_importance_sampling_clip_min."""
    rollout_is_zero_masked: bool = False
    """The tokens (or sequences) a mask mode of rollout_is rejects keep their place in the loss's normaliser with weight
    0 (TRL's GRPOTrainer). False: they leave the loss and its normaliser."""
