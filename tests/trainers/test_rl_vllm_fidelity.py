"""Rollout fidelity with a real vLLM (CPU build) engine: every preset corrects the engine/trainer
mismatch and logs it every step, and truncated sampling (top-k / top-p) is compared like with
like — right after a weight sync the measured gap is float32 noise and no token is masked. Run by
``make test-vllm``; deselected from ``make test``."""

import pytest

from rlhfkit.tasks.toy import toy_trainer

pytestmark = pytest.mark.vllm

VLLM = dict(rollout_engine="vllm", vllm_kv_cache_gb=0.25)
HEADS = {"heads": 2}  # head size 32: vLLM's CPU attention needs >= 32
ROLLOUT_METRICS = (
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "rollout/is_weight_mean",
    "rollout/is_masked_frac",
)


@pytest.fixture(autouse=True)
def _threads(engine_threads):
    """Two threads alone, one per pytest-xdist worker (tests/conftest.py)."""


STEPS = 2  # the first generates from the weights synced at build, the second after an update's sync


# GRPO and PPO (4 iterations, its default): test_rl_vllm.py's few-step runs of those presets check
# the same per step (and more).
@pytest.mark.parametrize(
    "preset",
    [
        dict(algorithm="ppo", num_iterations=1),
        dict(algorithm="dr_grpo"),
        dict(algorithm="reinforce"),
        dict(algorithm="reinforce_plus_plus"),
        dict(algorithm="rloo"),
    ],
    ids=["ppo-1", "dr_grpo", "reinforce", "reinforce_plus_plus", "rloo"],
)
def test_every_preset_logs_the_correction_every_step(preset):
    """Each preset's run logs the engine/trainer log-prob gap, the IS weight and the masked share
    at every step, and the gap is float32 kernel noise (synced before every generation)."""
    history = toy_trainer(model_kwargs=HEADS, max_steps=STEPS, **preset, **VLLM).train()
    assert len(history) == STEPS
    for row in history:
        assert all(k in row for k in ROLLOUT_METRICS), sorted(row)
        assert row["rollout/logprob_diff_max"] < 1e-3  # synced before every generation: kernel noise only


@pytest.mark.parametrize("top_p, top_k", [(0.7, 5), (1.0, 1)])
def test_truncated_sampling_gap_after_a_sync_is_float32_noise(top_p, top_k):
    """With top-p / top-k both sides renormalise over the same kept tokens: right after a sync the
    gap is float32 noise, no token is masked and the IS weights are 1."""
    history = toy_trainer(
        "grpo", model_kwargs=HEADS, max_steps=STEPS, top_p=top_p, top_k=top_k, rollout_is="token_mask", **VLLM
    ).train()
    assert len(history) == STEPS
    for row in history:
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
        assert row["rollout/is_masked_frac"] == 0
        assert abs(row["rollout/is_weight_mean"] - 1) < 1e-4
