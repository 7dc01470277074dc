"""Checkpoints (DCP shards + JSON/safetensors) resume bit-exactly; loading one unpickles nothing but
DCP's index, through a restricted unpickler, so a crafted checkpoint is refused without running code;
the previous single-process formats still resume (an old ``training_state.pt`` only when it holds
nothing but tensors and RNG state)."""

import json
import pickle
import random
import zipfile

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from rlhfkit.run.checkpoint import (
    DCP_DIR,
    LEGACY_FILE,
    META_FILE,
    STATE_FILE,
    TENSORS_FILE,
    load_checkpoint,
    load_module_weights,
    rng_state,
    save_checkpoint,
    trainable_state,
)


def make(seed=0, **adamw):
    """A tiny model, AdamW and a warmup-then-decay LambdaLR, as the trainers build them."""
    with torch.random.fork_rng():  # leaves the global RNG alone: it is part of what is checkpointed
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **adamw)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / 3, 1.0) * 0.9**s)
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


def test_layout_is_dcp_shards_json_and_safetensors_and_a_rewrite_leaves_nothing_stale(tmp_path):
    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 2)
    for stale in (LEGACY_FILE, TENSORS_FILE, "policy.safetensors", "rng-1.json"):  # an older checkpoint's files
        (tmp_path / stale).write_bytes(b"stale")
    save_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler, {"step": 2})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([DCP_DIR, "rng-0.json", "rng-0.safetensors", META_FILE, STATE_FILE])
    assert sorted(p.name for p in (tmp_path / DCP_DIR).iterdir()) == [".metadata", "__0_0.distcp"]
    meta = json.loads((tmp_path / META_FILE).read_text())  # plain JSON
    assert meta["format"] == 2 and meta["world_size"] == 1


def test_loading_unpickles_only_dcp_metadata_with_a_restricted_unpickler(tmp_path, monkeypatch):
    reference = make()
    train(*reference, 2)
    save_checkpoint(tmp_path, {"policy": reference[0]}, reference[1], reference[2], {"step": 2})

    def forbidden(*args, **kwargs):
        raise AssertionError("loading a checkpoint must not unpickle freely")

    torch_load = torch.load

    def weights_only_load(*args, **kwargs):  # DCP's tensor payloads: torch's restricted unpickler
        assert kwargs.get("weights_only") is True
        return torch_load(*args, **kwargs)

    for name in ("load", "loads", "Unpickler"):  # ours is the pure-Python pickle._Unpickler
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", weights_only_load)
    continue_both(tmp_path, reference)


def test_a_checkpoint_saved_before_any_step_leaves_the_optimizer_fresh(tmp_path):
    reference = make()
    save_checkpoint(tmp_path, {"policy": reference[0]}, reference[1], reference[2], {"step": 0})
    assert not reference[1].state  # saving did not initialise the optimizer (that would change the run)
    continue_both(tmp_path, reference)


def test_previous_single_process_format_still_resumes_bit_exactly(tmp_path):
    from rlhfkit.run.checkpoint import save_tree

    reference = make()
    train(*reference, 4)
    save_file(trainable_state(reference[0]), str(tmp_path / "policy.safetensors"))
    save_tree(
        tmp_path,
        "training_state",
        {"optimizer": reference[1].state_dict(), "scheduler": reference[2].state_dict(), "rng": rng_state()},
        format=1,
    )
    (tmp_path / STATE_FILE).write_text(json.dumps({"step": 4}))
    counters, _ = continue_both(tmp_path, reference)
    assert counters == {"step": 4}


def test_module_weights_load_alone_into_a_fresh_model(tmp_path):
    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 2)
    save_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler, {"step": 2})
    fresh = make(seed=7)[0]
    load_module_weights(tmp_path, "policy", fresh)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    with pytest.raises(ValueError, match="does not match"):
        load_module_weights(tmp_path, "policy", torch.nn.Linear(4, 3, bias=False))


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


@pytest.mark.parametrize("crafted", ["runs-code", "non-tensor-entry", "shard-outside"])
def test_crafted_dcp_checkpoint_is_refused_without_running_code(tmp_path, crafted):
    """torch 2.13's own DCP reader unpickles .metadata with plain pickle and non-tensor entries with
    torch.load(weights_only=False): ours refuses anything but DCP's index of tensor shards."""
    import torch.distributed.checkpoint as dcp

    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 2)
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, {"policy": model}, optimizer, scheduler, {"step": 2})
    marker, metadata = tmp_path / "pwned", ckpt / DCP_DIR / ".metadata"
    if crafted == "runs-code":
        metadata.write_bytes(pickle.dumps(RunsCode(marker)))
    elif crafted == "non-tensor-entry":  # DCP would torch.load(weights_only=False) the entry's bytes
        state = {**{f"policy.{k}": v for k, v in model.state_dict().items()}, "extra": RunsCode(marker)}
        with pytest.warns(UserWarning):
            dcp.save(state, checkpoint_id=ckpt / DCP_DIR)
    else:
        metadata.write_bytes(metadata.read_bytes().replace(b"__0_0.distcp", b"../../x.distcp"))
    fresh = make(seed=1)
    before = [p.clone() for p in fresh[0].parameters()]
    with pytest.raises(ValueError, match="cannot be loaded safely") as info:
        load_checkpoint(ckpt, {"policy": fresh[0]}, fresh[1], fresh[2])
    assert "\n" not in str(info.value) and ".metadata" in str(info.value)
    with pytest.raises(ValueError, match="cannot be loaded safely"):
        load_module_weights(ckpt, "policy", fresh[0])
    assert not marker.exists()
    assert all(torch.equal(a, b) for a, b in zip(before, fresh[0].parameters()))  # nothing half-loaded


def _allowed_objects():
    """Every object a DCP index may name (the restricted unpickler's allow-list), and an enum member
    it can build by calling one: all process-wide, so none may be given state."""
    import collections
    import pathlib

    import torch.distributed.checkpoint.filesystem as fs
    import torch.distributed.checkpoint.metadata as md
    from torch.serialization import _get_layout

    names = (
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
    found = {f"{md.__name__}.{n}": (b"c%s\n%s\n" % (md.__name__.encode(), n.encode()), getattr(md, n)) for n in names}
    for obj, module in [
        (fs._StorageInfo, fs.__name__),
        (torch.Size, "torch"),
        (torch.float32, "torch"),
        (_get_layout, "torch.serialization"),
        (collections.OrderedDict, "collections"),
        (pathlib.Path, "pathlib"),
        (pathlib.PosixPath, "pathlib"),
    ]:
        name = str(obj).removeprefix("torch.") if obj is torch.float32 else obj.__name__
        found[f"{module}.{name}"] = (b"c%s\n%s\n" % (module.encode(), name.encode()), obj)
    enum_class = found[f"{md.__name__}._MEM_FORMAT_ENCODING"]
    found["an enum member"] = (enum_class[0] + b"K\x00\x85R", enum_class[1](0))  # _MEM_FORMAT_ENCODING(0)
    return found


@pytest.mark.parametrize("state", ["slots", "dict"])
@pytest.mark.parametrize("target", list(_allowed_objects()))
def test_crafted_dcp_metadata_cannot_set_attributes_on_an_allowed_class(tmp_path, target, state):
    """A BUILD whose target is a class (or function, enum member, dtype) would set its attributes
    process-wide while the file is read — here in front of a real index, so the file would load."""
    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 2)
    save_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler, {"step": 2})
    metadata = tmp_path / DCP_DIR / ".metadata"
    real = metadata.read_bytes()
    assert real[:2] == b"\x80\x04" and real[2] == pickle.FRAME[0]
    attrs = b"}\x8c\x09some_attrK\x01s"  # {"some_attr": 1}
    build = attrs if state == "dict" else b"N" + attrs + b"\x86"  # (None, {"some_attr": 1}): setattr
    objects = _allowed_objects()
    metadata.write_bytes(b"\x80\x04" + objects[target][0] + build + b"b0" + real[11:])  # BUILD, POP, the index

    def snapshot():
        return {name: dict(vars(obj)) if hasattr(obj, "__dict__") else None for name, (_, obj) in objects.items()}

    before = snapshot()
    try:
        with pytest.raises(ValueError, match="cannot be loaded safely") as info:
            load_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler)
        assert "\n" not in str(info.value) and ".metadata" in str(info.value)
        after = snapshot()
        for name, (_, obj) in objects.items():
            assert not hasattr(obj, "some_attr"), name
            assert after[name] is None or (
                after[name].keys() == before[name].keys() and all(after[name][k] is v for k, v in before[name].items())
            ), name
    finally:  # a failure must not leak the attribute into the other tests
        for _, obj in objects.values():
            if "some_attr" in getattr(obj, "__dict__", {}):
                delattr(obj, "some_attr")


@pytest.mark.parametrize("missing", [META_FILE, f"{DCP_DIR}/.metadata", "rng-0.json"])
def test_checkpoint_without_training_state_is_refused(tmp_path, missing):
    model, optimizer, scheduler = make()
    save_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler, {"step": 0})
    (tmp_path / missing).unlink()
    with pytest.raises(ValueError, match="has no"):
        load_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    model, optimizer, scheduler = make()
    save_checkpoint(tmp_path, {"policy": model}, optimizer, scheduler, {"step": 0})
    other = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="does not match the model"):
        load_checkpoint(tmp_path, {"policy": other}, torch.optim.AdamW(other.parameters()), scheduler)
