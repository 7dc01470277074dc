"""Checkpoints are stored without pickle, resume bit-exactly, and old ``training_state.pt`` files are
read only when they hold nothing but tensors and RNG state."""

import json
import pickle
import random
import zipfile

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from rlhfkit.trainers.checkpoint import (
    LEGACY_FILE, META_FILE, STATE_FILE, TENSORS_FILE, load_checkpoint, rng_state, save_checkpoint, trainable_state,
)


def make(seed=0, **adamw):
    """A tiny model, AdamW and a warmup-then-decay LambdaLR, as the trainers build them."""
    with torch.random.fork_rng():  # leaves the global RNG alone: it is part of what is checkpointed
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **adamw)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / 3, 1.0) * 0.9 ** s)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps):
    for _ in range(steps):
        x = torch.randn(5, 4)  # draws from the global RNG, so a badly restored RNG changes the weights
        model(x).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


def draws():
    return torch.rand(8), random.random(), np.random.rand(3)


def continue_both(path, reference, **adamw):
    """Continue ``reference`` 3 steps; restore ``path`` into fresh objects, continue them 3 steps;
    weights, optimizer state, LR and RNG draws must be bit-identical."""
    fresh = make(seed=123, **adamw)  # different init: everything must come from the checkpoint
    train(*reference, 3)
    ref_draws = draws()
    counters = load_checkpoint(path, {"policy": fresh[0]}, fresh[1], fresh[2])
    train(*fresh, 3)
    new_draws = draws()
    for a, b in zip(reference[0].parameters(), fresh[0].parameters()):
        assert torch.equal(a, b)
    for sa, sb in zip(reference[1].state.values(), fresh[1].state.values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert reference[2].get_last_lr() == fresh[2].get_last_lr()
    assert torch.equal(ref_draws[0], new_draws[0]) and ref_draws[1] == new_draws[1]
    assert np.array_equal(ref_draws[2], new_draws[2])
    return counters, fresh


@pytest.mark.parametrize("adamw", [{}, {"foreach": True}, {"fused": True}], ids=["default", "foreach", "fused"])
def test_new_format_resumes_bit_exactly(tmp_path, adamw):
    reference = make(**adamw)
    train(*reference, 4)
    save_checkpoint(tmp_path, {"policy": reference[0]}, reference[1], reference[2], {"step": 4})
    saved_groups = reference[1].state_dict()["param_groups"]
    saved_sched = reference[2].state_dict()
    counters, fresh = continue_both(tmp_path, reference, **adamw)
    assert counters == {"step": 4}
    # param groups (betas a tuple, fused/foreach flags) and the scheduler come back as they were saved
    restored = make(seed=1, **adamw)
    load_checkpoint(tmp_path, {"policy": restored[0]}, restored[1], restored[2])
    assert restored[1].state_dict()["param_groups"] == saved_groups
    assert type(restored[1].param_groups[0]["betas"]) is tuple
    assert restored[2].state_dict() == saved_sched


def test_new_checkpoint_has_no_pickle(tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("checkpoints must not pickle")

    monkeypatch.setattr(torch, "save", forbidden)
    monkeypatch.setattr(pickle, "dump", forbidden)
    monkeypatch.setattr(pickle, "dumps", forbidden)
    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 2)
    (tmp_path / LEGACY_FILE).write_bytes(b"stale")  # an old file in the directory is removed
    save_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler, {"step": 2})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["policy.safetensors", TENSORS_FILE, META_FILE, STATE_FILE])
    assert not list(tmp_path.glob("*.pt"))
    json.loads((tmp_path / META_FILE).read_text())  # plain JSON


def write_legacy(path, model, optimizer, scheduler, training_state):
    """A checkpoint directory as the previous version wrote it."""
    path.mkdir(parents=True, exist_ok=True)
    save_file(trainable_state(model), str(path / "policy.safetensors"))
    torch.save(training_state, path / LEGACY_FILE)
    (path / STATE_FILE).write_text(json.dumps({"step": 4}))


def test_old_format_still_resumes_bit_exactly(tmp_path):
    reference = make()
    train(*reference, 4)
    state = {"optimizer": reference[1].state_dict(), "scheduler": reference[2].state_dict(), "rng": rng_state()}
    write_legacy(tmp_path, reference[0], reference[1], reference[2], state)
    counters, _ = continue_both(tmp_path, reference)
    assert counters == {"step": 4}


def test_old_format_pickled_under_numpy_1_still_loads(tmp_path):
    """numpy 1.x pickled its arrays as ``numpy.core.multiarray._reconstruct``."""
    reference = make()
    train(*reference, 4)
    state = {"optimizer": reference[1].state_dict(), "scheduler": reference[2].state_dict(), "rng": rng_state()}
    write_legacy(tmp_path / "new", *reference, state)
    src, dst = tmp_path / "new" / LEGACY_FILE, tmp_path / "old"
    dst.mkdir()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst / LEGACY_FILE, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray" in data
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            zout.writestr(item, data)
    for name in ("policy.safetensors", STATE_FILE):
        (dst / name).write_bytes((tmp_path / "new" / name).read_bytes())
    continue_both(dst, reference)


class RunsCode:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def test_crafted_old_checkpoint_is_refused_without_running_code(tmp_path):
    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 2)
    pickle.loads(pickle.dumps(RunsCode(tmp_path / "proof")))  # the payload does run under plain pickle
    assert (tmp_path / "proof").exists()

    marker = tmp_path / "pwned"
    evil = {"optimizer": optimizer.state_dict(), "scheduler": RunsCode(marker), "rng": rng_state()}
    write_legacy(tmp_path / "ckpt", model, optimizer, scheduler, evil)
    fresh = make(seed=1)
    before = [p.clone() for p in fresh[0].parameters()]
    with pytest.raises(ValueError, match="cannot be loaded safely") as info:
        load_checkpoint(tmp_path / "ckpt", {"policy": fresh[0]}, fresh[1], fresh[2])
    message = str(info.value)
    assert "\n" not in message and LEGACY_FILE in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not marker.exists()
    assert all(torch.equal(a, b) for a, b in zip(before, fresh[0].parameters()))  # nothing half-loaded


def test_checkpoint_without_training_state_is_refused(tmp_path):
    model, optimizer, scheduler = make()
    save_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler, {"step": 0})
    (tmp_path / TENSORS_FILE).unlink()
    with pytest.raises(ValueError, match="has no"):
        load_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler)
