"""The algorithms as values of ``AlgorithmConfig``'s preset fields (``algorithm.py``): ``PRESETS``, one
mapping per algorithm, each naming every preset field. ``RLConfig`` (``rl.py``) fills the preset fields the
user left unset from the chosen algorithm's mapping."""

from __future__ import annotations

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
