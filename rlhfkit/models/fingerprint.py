"""A model's fingerprint, taken when a trainer has built its model and before any step: every
checkpoint records it, so ``resume_from`` onto another base model (a different directory, Hub id or
model object: other weights under the same names, or another architecture) is refused in one line
instead of continuing silently from weights and a reference the checkpoint was not trained with.

The fingerprint is the same on any number of processes: parameter names, global shapes and dtypes
(hashed), and the sums of |w| and w² over every parameter in float64, a sharded parameter's local
parts summed over the processes. Every process must call ``model_fingerprint`` (a collective under
torchrun)."""

from __future__ import annotations

import hashlib

import torch

_CHUNK = 1 << 22  # elements converted to float64 at a time
_TOLERANCE = 1e-9  # relative: float64 sums in another order (another number of processes) differ by ~1e-15


def model_fingerprint(modules: dict[str, torch.nn.Module]) -> dict:
    """``{"layout": <hash of names, shapes, dtypes>, "sums": [Σ|w|, Σw²], "source": <where it was loaded
    from, or "">, "parts": {name: {"lora": <has LoRA adapters>}}}`` of the parameters of ``modules``
    (name -> module). ``parts`` lets a refusal say what differs: another set of trained modules (a
    GRPO checkpoint resumed as PPO, which trains a critic too) or LoRA adapters on one side only."""
    from .. import distributed

    layout = hashlib.sha256()
    local, sharded = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    source = ""
    parts: dict[str, dict] = {}
    for prefix, module in modules.items():
        source = source or _origin(module)
        parts[prefix] = {"lora": any("lora_" in name for name, _ in module.named_parameters())}
        for name, p in module.named_parameters():
            layout.update(f"{prefix}.{name}:{tuple(p.shape)}:{p.dtype};".encode())
            to_local = getattr(p, "to_local", None)  # a DTensor's (FSDP2): this process's shard
            part = to_local() if to_local is not None else p
            (sharded if to_local is not None else local).add_(_sums(part.detach()))
    if distributed.role_active():
        sharded = torch.tensor(distributed.sum_floats(sharded.tolist()), dtype=torch.float64)
    return {"layout": layout.hexdigest()[:16], "sums": (local + sharded).tolist(), "source": source, "parts": parts}


def _sums(x: torch.Tensor) -> torch.Tensor:
    total = torch.zeros(2, dtype=torch.float64)
    for chunk in x.reshape(-1).split(_CHUNK):
        chunk = chunk.double()
        total += torch.stack([chunk.abs().sum(), (chunk * chunk).sum()]).cpu()
    return total


def _origin(module: torch.nn.Module) -> str:
    """The directory or Hub id a model was loaded from (its config's ``_name_or_path``), or ""."""
    for m in module.modules():
        origin = str(getattr(getattr(m, "config", None), "_name_or_path", "") or "")
        if origin:
            return origin
    return ""


def fingerprint_change(saved: dict, now: dict) -> str | None:
    """Why the model fingerprinted ``now`` is not the base model of the checkpoint that recorded
    ``saved`` (one clause), or None when it is."""
    same_layout = saved.get("layout") == now.get("layout")
    old, new = saved.get("sums") or [], now.get("sums") or []
    same_values = len(old) == len(new) and all(
        abs(a - b) <= _TOLERANCE * max(abs(a), abs(b), 1e-30) for a, b in zip(old, new)
    )
    if same_layout and same_values:
        return None
    parts = _parts_change(saved.get("parts"), now.get("parts"))
    if parts:
        return parts
    what = "its weights have other values" if same_layout else "its weights have other names, shapes or dtypes"
    was, now_from = saved.get("source") or "", now.get("source") or ""
    story = (
        f"it was trained from {was!r}, and this run's model {now_from!r} is another base model"
        if was and now_from and was != now_from
        else f"this run's model{f' {now_from!r}' if now_from else ''} is not the base model it was trained from"
    )
    return f"{story} ({what}); resume with the model the run started from (its config.yaml names it) or start a new run"


def _parts_change(saved: dict | None, now: dict | None) -> str | None:
    """What differs in the trained modules themselves (None: the same, or a checkpoint from before
    ``parts`` was recorded): another set of them, or LoRA adapters on one side only."""
    if not saved or not now:
        return None
    if set(saved) != set(now):
        return (
            f"it trained {' + '.join(saved)} and this run trains {' + '.join(now)}: it was saved by another "
            "algorithm or setup (PPO trains a critic beside the policy); resume it with the config it was saved with"
        )
    for name in saved:
        if bool(saved[name].get("lora")) != bool(now[name].get("lora")):
            was, is_now = ("with", "without") if saved[name].get("lora") else ("without", "with")
            return (
                f"its {name} was trained {was} LoRA adapters and this run's {name} is {is_now} them; resume "
                "with the lora_r it was saved with (its config.yaml names it)"
            )
    return None
