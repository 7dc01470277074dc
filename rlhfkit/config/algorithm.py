"""The algorithm's fields of ``RLConfig`` (``rl.py``): ``AlgorithmConfig`` (advantages, losses, KL, clipping,
score shaping, the rollout correction) and its rules among them (``algorithm_rules``, read from the
registries' traits: no algorithm is named here). The algorithms themselves are values of these fields
(``presets.py``: ``PRESETS``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .base import Rule, preset, ranged

ENTROPY_AGGREGATIONS = ("micro-batch-token-mean",)
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


@dataclass(frozen=True)
class AlgorithmConfig:
    algorithm: str = "grpo"
    """Preset: ppo, grpo, dr_grpo, reinforce, reinforce_plus_plus, rloo, gspo (GSPO: sequence-level ratio), cispo
    (CISPO: capped, detached ratio), dapo (DAPO: clip-higher, dynamic sampling, token-mean) or distill (on-policy
    distillation from teacher_model alone). Every field below that
    defaults to None takes the preset's value unless you set it: a value you set always wins, also when
    `replace(algorithm=...)` switches presets."""
    advantage_estimator: str = preset()
    """Name in ADVANTAGE_ESTIMATORS: gae, group, group_no_std, group_batch_std (the group mean, the batch's std), rloo,
    reinforce, reinforce_plus_plus."""
    policy_loss: str = preset()
    """Name in POLICY_LOSSES: ppo_clip (clipped surrogate), vanilla (plain policy gradient), cispo (policy gradient
    weighted by the detached ratio capped at 1 + clip_high: MiniMax-M1's CISPO), sapo (a soft sigmoid gate in place of
    the clip; loss_options temperature_pos, temperature_neg) or vespo (policy gradient weighted by a Gamma function of
    the sequence ratio; loss_options k_pos, lambda_pos, k_neg, lambda_neg); or a loss of your own module named by path,
    'module:function' (my_pkg.losses:my_loss; the module is imported, and a function it did not register itself is
    registered under the path). The rollout correction weighs every loss's per-token loss (docs/guides/rl.md)."""
    loss_agg: str = preset()
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, or
    micro-batch-token-mean (each micro-batch's token mean, the micro-batches of a step weighed alike: TRL's bnpo)."""
    loss_horizon: int | None = ranged(None, "[1, 1e7] or None")
    """Constant divisor for seq-mean-token-sum-norm (Dr.GRPO); None: max_new_tokens."""
    use_critic: bool = preset()
    """Train a value model (PPO). Required by the gae estimator."""
    kl_coef: float = preset(">= 0")
    """β of the KL penalty to the reference policy; 0 turns the reference off entirely."""
    kl_estimator: str = preset()
    """k1, k2, k3 or abs (Schulman 2020). In the reward (kl_in_reward) any of them works: PPO and RLOO put k1 there. In
    the loss only k2 and k3 work, because only their gradients follow a divergence: k2's gradient is that of KL(π‖ref),
    k3's (GRPO's choice) that of KL(ref‖π); k1's gradient is zero in expectation (the penalty would do nothing) and
    abs's follows no divergence, so both are refused there."""
    kl_in_reward: bool = preset()
    """True: -β·KL is added to every token's reward. False: β·KL is added to the loss (GRPO)."""
    adaptive_kl: bool = False
    """Adapt β towards kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = ranged(6.0, "> 0")
    """Target KL (nats per sequence) of the adaptive controller."""
    kl_horizon: float = ranged(10000.0, "> 0")
    """Horizon of the adaptive controller (samples); larger moves β more slowly."""
    sync_ref_model: bool = False
    """TR-DPO's soft update of the reference (Gorbatovski et al. 2024, arXiv:2404.09656), TRL's sync_ref_model for GRPO
    and RLOO: every ref_model_sync_steps optimizer steps the reference becomes ref_model_mixup_alpha x policy + (1 -
    ref_model_mixup_alpha) x reference, so the KL pulls toward a reference that follows the policy; checkpoints hold it.
    Needs a reference of its own (kl_coef > 0, not a LoRA policy, whose reference is its base model)."""
    ref_model_mixup_alpha: float = ranged(0.6, "(0, 1]")
    """With sync_ref_model: the policy's share α of each update of the reference."""
    ref_model_sync_steps: int = ranged(512, "[1, 1e9]")
    """With sync_ref_model: optimizer steps between two updates of the reference."""
    clip_low: float = preset("(0, 1)")
    """PPO clip ε below 1 (ratio floor 1-ε). TRL's epsilon, verl's clip_ratio_low. Presets: 0.2; gspo 3e-4. Set with
    cispo or vanilla, which do not read it, it is refused."""
    clip_high: float = preset("> -1")
    """PPO clip ε above 1 (ratio ceiling 1+ε); DAPO's clip-higher uses 0.28. TRL's epsilon_high, verl's clip_ratio_high.
    Presets: 0.2; dapo 0.28; gspo 4e-4; cispo 4 (its weight's cap 1+ε = 5)."""
    importance_sampling_level: str = preset()
    """Whose importance ratio the policy loss uses (TRL's name): 'token' (each token's π/π_old: PPO, GRPO), 'sequence'
    (GSPO: the sequence's exp(mean_t log(π/π_old)), one per completion, clipped as one), 'sequence_token' (GSPO-token:
    the sequence ratio's value with each token's own gradient) or 'sequence_sum' (the sequence's probability ratio
    exp(sum_t log(π/π_old)): TRL's RLOO clips it). The ratio differs from 1 only off-policy (num_iterations
    > 1 or several minibatches per batch). vanilla has no ratio: 'token' only."""
    dual_clip: float | None = ranged(None, "> 1 or None")
    """Dual-clip constant c > 1 for negative advantages (Ye et al. 2020): the loss is at most c·|A|. verl's clip_ratio_c
    (3.0 there). None: off. ppo_clip only: set with another loss, it is refused."""
    loss_options: dict = dataclasses.field(default_factory=dict)
    """Knobs of the policy loss that are no config field of their own, by name, as its registration
    declares them (POLICY_LOSSES; the built-in losses have none: their knobs are the fields clip_low,
    clip_high and dual_clip). A YAML mapping, or JSON on the command line: loss_options='{"tau": 0.5}'.
    A knob left out takes its declared default; an unknown key, a wrong type or a value out of range
    is refused."""
    top_entropy_quantile: float = ranged(1.0, "[0, 1]")
    """ρ of "Beyond the 80/20 Rule" (arXiv:2506.01939; TRL's name): the policy loss (and the entropy bonus) keeps only
    the tokens whose entropy is in the top ρ of each micro-batch's; the rest keep their place in the loss's normaliser.
    1.0: every token (off); the paper uses 0.2."""
    off_policy_mask_threshold: float | None = ranged(None, "> 0 or None")
    """δ of DeepSeek-V3.2's off-policy sequence masking (arXiv:2512.02556, eq. 9; TRL's name): a completion with a
    negative advantage whose mean per-token KL from the sampler to the current policy exceeds δ leaves the policy loss
    (its tokens keep their place in the normaliser). None: off."""
    value_clip: float | None = ranged(0.2, "> 0 or None")
    """Clip range of the value update around the old values (cliprange_value); None: plain MSE."""
    vf_coef: float = ranged(0.5, ">= 0")
    """Weight of the value loss in the total loss (c1 of the PPO paper)."""
    entropy_coef: float = ranged(0.0, ">= 0")
    """Weight of the entropy bonus (c2 of the PPO paper); 0 computes entropy as a metric only."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1's adaptive entropy coefficient (arXiv:2505.22312; TRL's name): entropy_coef is the starting value,
    after each optimizer step raised by entropy_coef_delta when the step's entropy is at most entropy_target, else
    lowered, within [entropy_coef_min, entropy_coef_max]; a step applies the bonus only when the previous step's entropy
    was at most the target."""
    entropy_target: float = ranged(0.2, ">= 0")
    """With use_adaptive_entropy: the entropy (nats per token) the coefficient steers toward."""
    entropy_coef_delta: float = ranged(0.005, ">= 0")
    """With use_adaptive_entropy: the coefficient's change per optimizer step."""
    entropy_coef_min: float = ranged(0.0, ">= 0")
    """With use_adaptive_entropy: the coefficient's floor."""
    entropy_coef_max: float = ranged(1.0, ">= 0")
    """With use_adaptive_entropy: the coefficient's ceiling."""
    entropy_agg: str | None = None
    """How the entropy bonus is averaged: None, as the policy loss (loss_agg); 'micro-batch-token-mean', each
    micro-batch's token mean divided by the micro-batches of the optimizer step (TRL's GRPOTrainer, whatever its
    loss_type)."""
    gamma: float = ranged(1.0, "[0, 1]")
    """Discount of GAE and REINFORCE++ returns; 1 is standard for LM episodes."""
    lam: float = ranged(0.95, "[0, 1]")
    """GAE λ."""
    whiten_advantages: bool = preset()
    """Whiten advantages over the batch's response tokens (PPO)."""
    advantage_epsilon: float = ranged(1e-6, "(0, 1]")
    """ε of the group advantages (r - mean_g) / (std_g + ε) (GRPO's 'group' estimator), as verl's 1e-6; TRL uses 1e-4
    (rlhfkit.trl's GRPOConfig sets that)."""
    num_iterations: int = preset("[1, 1e4]")
    """K: passes (PPO epochs) over each batch; old log-probs are kept from before the first update."""
    missing_eos_penalty: float | None = ranged(None, "[-1e6, 1e6] or None")
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
    overlong_buffer_len: int | None = ranged(None, "[1, 1e7] or None")
    """DAPO's soft overlong punishment (eq. 13; verl's overlong_buffer.len): a completion longer than max_new_tokens -
    overlong_buffer_len tokens loses overlong_penalty x (excess / overlong_buffer_len) of score, the whole
    overlong_penalty at max_new_tokens. None: off, also under the dapo preset (DAPO used 4096 of 20480 tokens: set it to
    suit max_new_tokens, e.g. a quarter)."""
    overlong_penalty: float = ranged(1.0, "[0, 1e6]")
    """Score lost by a completion of max_new_tokens tokens under overlong_buffer_len (verl's
    overlong_buffer.penalty_factor)."""
    dynamic_sampling: bool = preset()
    """DAPO's dynamic sampling (verl's algorithm.filter_groups): a group whose valid rewards are all equal, or with
    fewer than two valid, has no learning signal and is dropped; more prompts are generated until prompts_per_step
    groups are kept or max_sampling_rounds rounds are spent, after which the step trains on the groups kept. Needs
    group_size >= 2. Presets: dapo True, the others False."""
    max_sampling_rounds: int = ranged(10, "[1, 1e6]")
    """With dynamic_sampling: the most generation rounds per step (verl's filter_groups.max_num_gen_batches)."""
    reward_aggregation: str = "sum_then_normalize"
    """How several reward functions make one score: 'sum_then_normalize', their weighted sum (the advantage estimator
    normalises it); 'normalize_then_sum', GDPO (arXiv:2601.05242; TRL's multi_objective_aggregation): each function's
    scores normalised within each group first, then weighted and summed (pair it with advantage_estimator
    'batch_standardized', as TRL does). The logged reward/mean stays the weighted sum."""
    reward_clip: float | None = ranged(None, "> 0 or None")
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
    rollout_is_threshold: float | None = ranged(2.0, "> 1 or None")
    """The threshold C (> 1) of rollout_is: the truncation cap, or the mask's bounds [1/C, C]. None: no cap, nothing
    masked above."""
    rollout_is_threshold_low: float | None = ranged(None, "[0, 1e6] or None")
    """The lower bound of rollout_is when it is not 1/C (mask modes) or none (truncation modes): the truncation modes
    floor the weight at it, the mask modes drop ratios below it (0: no lower bound). TRL's
    vllm_importance_sampling_clip_min."""
    rollout_is_zero_masked: bool = False
    """The tokens (or sequences) a mask mode of rollout_is rejects keep their place in the loss's normaliser with weight
    0 (TRL's GRPOTrainer). False: they leave the loss and its normaliser."""


def algorithm_rules(c) -> list[Rule]:
    """``AlgorithmConfig``'s rules, as ``check_fields`` entries: those of the advantages and the KL
    (``estimator_rules``), of the policy loss (``loss_rules``) and of the scores and their correction
    (``score_rules``). The policy loss's own knobs are checked by its registration
    (``algorithms.check_loss_options``, which ``RLConfig`` calls)."""
    return estimator_rules(c) + loss_rules(c) + score_rules(c)


def estimator_rules(c) -> list[Rule]:
    """What the advantage estimator needs of the critic (its traits ``needs_values``, ``gives_returns``), and the
    KL estimators whose gradient may enter the loss (``loss_gradient``)."""
    from ..algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS

    estimator = ADVANTAGE_ESTIMATORS.traits(c.advantage_estimator)
    kl = KL_ESTIMATORS.traits(c.kl_estimator)
    in_loss = [n for n in KL_ESTIMATORS.names() if KL_ESTIMATORS.traits(n)["loss_gradient"]]
    named = f"for the {c.advantage_estimator!r} estimator"
    return [
        (not estimator["needs_values"] or c.use_critic, "use_critic", f"True {named}"),
        (
            not c.use_critic or estimator["gives_returns"],
            "use_critic",
            f"False {named} (it gives the critic no returns to learn)",
        ),
        (
            c.kl_in_reward or c.kl_coef == 0 or kl["loss_gradient"],
            "kl_estimator",
            f"one of {', '.join(in_loss)} when the KL goes into the loss (kl_in_reward=False): the gradient of "
            f"{c.kl_estimator!r} {kl['why_not_in_loss']}",
        ),
    ]


def loss_rules(c) -> list[Rule]:
    """The rules of the loss's fields: the aggregation, the token filters, the entropy bonus, the ratio's level
    (one the policy loss's registration admits)."""
    from ..algorithms import AGGREGATIONS, IMPORTANCE_SAMPLING_LEVELS, POLICY_LOSSES

    levels = POLICY_LOSSES.traits(c.policy_loss)["importance_sampling_levels"]
    filtered = c.top_entropy_quantile < 1.0 or c.off_policy_mask_threshold is not None
    return [
        (c.loss_agg in AGGREGATIONS, "loss_agg", f"one of {', '.join(AGGREGATIONS)}"),
        (
            not POLICY_LOSSES.traits(c.policy_loss)["applies_correction"] or not filtered,
            "policy_loss",
            "a loss the framework weighs by the correction with top_entropy_quantile < 1 or "
            "off_policy_mask_threshold: this one applies its token weights itself (VESPO folds them into its "
            "sequence ratio), where a token filter has no place",
        ),
        (
            c.entropy_coef_min <= c.entropy_coef_max,
            "entropy_coef_min",
            f"at most entropy_coef_max ({c.entropy_coef_max})",
        ),
        (
            c.entropy_agg in (None, *ENTROPY_AGGREGATIONS),
            "entropy_agg",
            f"None or one of {', '.join(ENTROPY_AGGREGATIONS)}",
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
    ]


def score_rules(c) -> list[Rule]:
    """The rules of the scores' fields (how several rewards make one, their shaping), of the reference's soft
    update and of the rollout correction."""
    from ..algorithms import ROLLOUT_IS_MODES

    shaped = c.missing_eos_penalty is not None or c.overlong_buffer_len is not None or c.reward_clip is not None
    return [
        (
            c.reward_aggregation in REWARD_AGGREGATIONS,
            "reward_aggregation",
            "'sum_then_normalize' or 'normalize_then_sum'",
        ),
        (
            c.reward_aggregation == "sum_then_normalize" or not (shaped or c.normalize_rewards),
            "reward_aggregation",
            "'sum_then_normalize' with missing_eos_penalty, overlong_buffer_len, reward_clip or normalize_rewards: "
            "they shape the weighted sum, which 'normalize_then_sum' does not use",
        ),
        (
            not c.sync_ref_model or c.kl_coef > 0,
            "sync_ref_model",
            "False when kl_coef is 0: there is no reference to synchronise",
        ),
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
    ]
