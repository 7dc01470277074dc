"""TRL 1.16's metric names beside rlhfkit's in ``trainer.state.log_history``: one table per trainer,
TRL's name -> rlhfkit's, for the metrics rlhfkit computes alike (no value is made up: a TRL metric
without an rlhfkit equivalent — ``num_tokens``, ``frac_reward_zero_std``, ``completions/min_length``
... — is absent). Each row keeps rlhfkit's names (``metrics.jsonl``'s) and
gains TRL's; its ``step`` is TRL's, the optimizer steps taken (``trainer.state.global_step``), which for
GRPO and RLOO is rlhfkit's RL step times the optimizer steps per generation (``trainer.history`` keeps
rlhfkit's). Which rows ``log_history`` holds, and the end-of-run summary: ``rl_rows.py`` (GRPO, RLOO)
and ``log_rows.py`` (SFT, DPO, reward).

Sources of TRL's names: ``trl/trainer/{grpo,rloo,sft,dpo,reward}_trainer.py`` (``_metrics`` and
``log``) and ``transformers.Trainer``'s ``loss``, ``grad_norm``, ``learning_rate``, ``epoch``;
TRL's evaluation rows prefix ``eval_``.
"""

from __future__ import annotations

# GRPOConfig / RLOOConfig runs (rlhfkit's RL loop). "loss" is TRL's total loss (the policy loss, beta x KL,
# minus the entropy bonus): rlhfkit's policy/total_loss; TRL logs the policy loss alone as "policy_loss"
# when the entropy bonus is on.
RL_METRICS = {
    "loss": "policy/total_loss",
    "grad_norm": "perf/grad_norm",
    "learning_rate": "perf/lr",
    "completions/mean_length": "rollout/response_length_mean",
    "completions/max_length": "rollout/response_length_max",
    "completions/clipped_ratio": "rollout/truncated_frac",  # completions without an EOS
    "reward": "reward/mean",
    "reward_std": "reward/std",
    "entropy": "policy/entropy",
}
# GRPO only: TRL's per-token k3 KL to the reference (logged when beta > 0) and its clip region
# (ratio below 1 - epsilon with a negative advantage, or above 1 + epsilon_high with a positive one)
GRPO_ONLY = {"kl": "kl/k3", "clip_ratio/region_mean": "policy/clip_frac"}

# DistillationConfig runs (rlhfkit's RL loop, distillation_mode "full"): TRL's "loss" is the step's divergence summed
# over its completion tokens divided by their number, rlhfkit's token mean distill/divergence; "entropy" the student's
# at the temperature (TRL averages its micro-batches' token means, rlhfkit weighs them by their tokens)
DISTILL_METRICS = {
    "loss": "distill/divergence",
    "grad_norm": "perf/grad_norm",
    "learning_rate": "perf/lr",
    "entropy": "policy/entropy",
    "completions/mean_length": "rollout/response_length_mean",
    "completions/max_length": "rollout/response_length_max",
    "completions/clipped_ratio": "rollout/truncated_frac",
}

SFT_METRICS = {
    "loss": "sft/loss",
    "grad_norm": "sft/grad_norm",
    "learning_rate": "sft/lr",
    "epoch": "sft/epoch",
    "entropy": "sft/entropy",
    "mean_token_accuracy": "sft/token_accuracy",
    "eval_loss": "eval/loss",
    "eval_entropy": "eval/entropy",
    "eval_mean_token_accuracy": "eval/token_accuracy",
}

# rewards/*, logps/* are TRL's names already
DPO_METRICS = {
    "loss": "dpo/loss",
    "grad_norm": "perf/grad_norm",
    "learning_rate": "perf/lr",
    "epoch": "dpo/epoch",
    "eval_loss": "eval/loss",
    **{
        f"eval_{k}": f"eval/{k}"
        for k in (
            "rewards/chosen",
            "rewards/rejected",
            "rewards/accuracies",
            "rewards/margins",
            "logps/chosen",
            "logps/rejected",
        )
    },
}

REWARD_METRICS = {
    "loss": "rm/loss",
    "grad_norm": "perf/grad_norm",
    "learning_rate": "perf/lr",
    "epoch": "rm/epoch",
    "accuracy": "rm/accuracy",
    "margin": "rm/margin_mean",
    "mean_reward": "rm/reward_mean",
    "eval_loss": "eval/loss",
    "eval_accuracy": "eval/accuracy",
    "eval_margin": "eval/margin_mean",
    "eval_mean_reward": "eval/reward_mean",
}


def rl_metrics(config, reward_names) -> dict:
    """The table of a ``GRPOConfig`` / ``RLOOConfig`` run: ``RL_METRICS``, GRPO's ``GRPO_ONLY``
    (``kl`` only with ``beta > 0``, the clip region only for the clipped losses — ``cispo``'s clipping
    TRL logs as ``cispo_clip_ratio``, not computed here —, VESPO's weight), ``policy_loss`` with an
    entropy bonus (as TRL logs it), and ``rewards/<function>/mean`` and ``/std`` for each reward
    function (``reward_names``)."""
    table = dict(RL_METRICS)
    grpo = hasattr(config, "loss_type")
    if grpo:
        table.update(GRPO_ONLY)
        if not config.beta:
            del table["kl"]
        if config.loss_type in ("cispo", "sapo", "vespo"):  # TRL logs its clip region for the clipped losses only
            del table["clip_ratio/region_mean"]
        if config.loss_type == "vespo":
            table["vespo/phi_seq_mean"] = "policy/vespo_phi_mean"
    if grpo and (config.entropy_coef or config.use_adaptive_entropy):
        table["policy_loss"] = "policy/loss"
    for name in reward_names:
        table.update({f"rewards/{name}/mean": f"reward/{name}_mean", f"rewards/{name}/std": f"reward/{name}_std"})
    return table


def with_trl_names(row: dict, table: dict, steps_per_row: int = 1) -> dict:
    """``row`` (rlhfkit's names) with TRL's added from ``table`` where rlhfkit logged the metric,
    and ``step`` as TRL counts it (optimizer steps: ``steps_per_row`` per rlhfkit step)."""
    out = dict(row)
    out.update({trl: row[ours] for trl, ours in table.items() if ours in row})
    if "step" in row:
        out["step"] = row["step"] * steps_per_row
    return out
