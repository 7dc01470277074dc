"""KTO against TRL 1.16 itself: two optimizer steps of TRL's ``KTOTrainer`` and of the drop-in from
the same tiny model, rows and config (weights on the two sides not 1). Both read the rows in order
(TRL's ``train_sampling_strategy="sequential"``), so each micro-batch holds the same rows and the
same mismatched pairs of the KL estimate. Compared: the weights after the two steps
(``harness.update_difference``), and the loss and ``kl`` each trainer logged at the second step —
where the policy has left the reference, so the KL estimate is no longer 0."""

from __future__ import annotations

import pytest
from harness import start_weights, update_difference, weights
from test_supervised_parity import PAIRS, WORDS, _steps

# 16 unpaired rows, labels mixed within every micro-batch of 4, some completions ending with the EOS text
UNPAIRED = [
    {"prompt": w, "completion": (w[::-1] if i % 3 else w + "z") + ("<eos>" if i % 5 == 0 else ""), "label": i % 3 != 0}
    for i, w in enumerate(WORDS + [w + "!" for w in WORDS])
]

CASES = {
    # 2 accumulated micro-batches of 4: a KL estimate per micro-batch, the loss the mean of their means
    "kto_accumulated": (UNPAIRED, dict(per_device_train_batch_size=4, gradient_accumulation_steps=2)),
    "kto_one_batch": (UNPAIRED, dict(per_device_train_batch_size=8)),
    "apo_zero_unpaired": (UNPAIRED, dict(per_device_train_batch_size=8, loss_type="apo_zero_unpaired")),
    # preference pairs split in two as TRL's unpair_preference_dataset splits them: 8 chosen rows, then 8 rejected
    "paired_rows": (PAIRS, dict(per_device_train_batch_size=8)),
    "max_length": (UNPAIRED, dict(per_device_train_batch_size=8, max_length=9)),
}


@pytest.mark.parametrize("case", CASES)
def test_kto_matches_trl(model_dir, tmp_path, case):
    rows, extra = CASES[case]
    kwargs = dict(max_steps=2, beta=0.5, desirable_weight=1.5, undesirable_weight=0.7, **extra)
    theirs, ours = _steps("KTO", model_dir, rows, kwargs, tmp_path)
    difference = update_difference(start_weights(model_dir), weights(theirs.model), weights(ours.model))
    second = [next(r for r in t.state.log_history if r.get("step") == 2 and "loss" in r) for t in (theirs, ours)]
    print(
        f"{case}: update difference {difference:.1e}; second-step loss TRL {second[0]['loss']:.6f}, "
        f"rlhfkit {second[1]['loss']:.6f}; kl TRL {second[0].get('kl')}, rlhfkit {second[1].get('kl')}"
    )
    assert difference < 1e-3, difference
    assert second[1]["loss"] == pytest.approx(second[0]["loss"], rel=1e-4, abs=1e-6)
    if extra.get("loss_type") != "apo_zero_unpaired":
        assert second[0]["kl"] > 1e-3  # the KL estimate is compared where it is not 0
    assert second[1]["kl"] == pytest.approx(second[0]["kl"], rel=1e-4, abs=1e-6)
    for key in ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"):
        if key in second[0]:
            assert second[1][key] == pytest.approx(second[0][key], rel=1e-4, abs=1e-5), key
