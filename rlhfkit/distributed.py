"""The only place that knows how many processes there are (docs/architecture.md, "Scale-out").

Every process is an SPMD peer launched by ``torchrun``, which describes the job in the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``). ``setup`` joins that
process group once — NCCL and ``cuda:LOCAL_RANK`` on GPUs, gloo on CPUs — with a timeout on every
collective (``RLHFKIT_DIST_TIMEOUT`` seconds, default 600), so a rank that dies never leaves the
others waiting for ever. Without torchrun nothing is initialised and every helper here is the
identity: single-process code pays nothing.

Models are sharded with FSDP2 (``torch.distributed.fsdp.fully_shard`` on each transformer block,
then on the whole model) or wrapped in DDP (``shard``). Only this module (and the rollout transport
of ``rollout/remote.py``) calls ``torch.distributed``; the algorithm core receives already-reduced
numbers through ``reduce_sum``.

Roles (``rollout_workers: K``): the last K ranks generate and the others train. Each process then
lives in its role's group, and what acts on the role says so by name: ``role_size``,
``role_rank``, ``role_active``, ``role_barrier``; the reductions (``reduce_sum``, ``global_mean``,
...), ``shard`` and the checkpoints (``dcp_options``) also run over the role's processes only,
as their docstrings say. Without ``rollout_workers`` the role is every process. What spans the
whole job is named for it: ``global_rank``, ``is_main`` (global rank 0, a trainer: the one that
writes the run), ``joined``, ``finished`` (waits for every process). ``sync_group`` (global rank 0
and the generators) carries the weights and the start.
"""

from __future__ import annotations

import atexit
import datetime
import os
from contextlib import contextmanager
from typing import cast

import torch
import torch.distributed as dist

TIMEOUT_ENV = "RLHFKIT_DIST_TIMEOUT"
_DEVICE = [torch.device("cpu")]  # this process's device, set by setup: where collectives run
# With rollout_workers: this process's role group (trainers or generators), and rank 0 + generators.
_GROUPS: dict = {"role": None, "sync": None, "objects": None, "workers": 0}
_FINISHED: list = []  # the end-of-run all-reduce's tensor, kept to exit (see finished)


def launched() -> bool:
    """Whether torchrun started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def role_active() -> bool:
    """More than one process shares this process's role (its collectives are not the identity)."""
    return _initialized() and dist.get_world_size(_GROUPS["role"]) > 1


def role_size() -> int:
    """Processes of this process's role: the trainers or the generator ranks with
    ``rollout_workers``, every process without (then the job's world size)."""
    return dist.get_world_size(_GROUPS["role"]) if role_active() else 1


def role_rank() -> int:
    """This process's rank among its role's processes (its global rank without ``rollout_workers``)."""
    return dist.get_rank(_GROUPS["role"]) if role_active() else 0


def joined() -> bool:
    """This process has joined a process group of several processes (whatever its role's size)."""
    return _initialized() and dist.get_world_size() > 1


def global_rank() -> int:
    """This process's rank among every process of the job (its ``RANK``), whatever its role."""
    return dist.get_rank() if _initialized() else 0


def group():
    """The process group of this process's role (None: every process, torch's default group)."""
    return _GROUPS["role"]


def is_main() -> bool:
    """Global rank 0: the process that writes the run (a trainer)."""
    return global_rank() == 0


def rollout_workers() -> int:
    """Generator ranks of this job (0: every process trains and generates its share)."""
    return _GROUPS["workers"]


def is_generator() -> bool:
    """Whether this process is one of the job's ``rollout_workers`` generator ranks (the last ones)."""
    return _GROUPS["workers"] > 0 and dist.get_rank() >= dist.get_world_size() - _GROUPS["workers"]


def sync_group():
    """The group of global rank 0 and the generator ranks (weights and the start go through it)."""
    return _GROUPS["sync"]


def object_group():
    """A gloo group of every process: the pickled objects trainers and generators exchange."""
    return _GROUPS["objects"]


def trainer_ranks() -> list[int]:
    """The global ranks that train (all of them without ``rollout_workers``)."""
    return list(range(dist.get_world_size() - _GROUPS["workers"])) if _initialized() else [0]


def generator_ranks() -> list[int]:
    """The global ranks that generate (none without ``rollout_workers``)."""
    n = dist.get_world_size() if _initialized() else 1
    return list(range(n - _GROUPS["workers"], n))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV, "600"))


def no_sync(*modules):
    """Inside: DDP wrappers among ``modules`` skip their gradient all-reduce (gradient accumulation
    over micro-batches syncs on the last one only). Other modules: nothing."""
    from contextlib import ExitStack

    stack = ExitStack()
    for m in modules:
        if m is not None and hasattr(m, "no_sync"):
            stack.enter_context(m.no_sync())
    return stack


def check_device(device: str, field: str = "device") -> None:
    """Refuse, in one line naming the config ``field``, a device this machine does not have:
    'cuda' where torch sees no CUDA GPU, 'cuda:N' past the GPUs there are, 'mps' / 'xpu' without
    them. Trainers call it before loading anything (``setup`` calls it again)."""
    if device == "auto":
        return
    kind, colon, index = str(device).partition(":")
    if colon and not index.isdigit():
        raise ValueError(
            f"config field {field!r} must be 'auto', 'cpu' or a device such as 'cuda' or 'cuda:0', got {device!r}"
        )
    backend = {"mps": getattr(torch.backends, "mps", None), "xpu": getattr(torch, "xpu", None)}.get(kind)
    have = {
        "cuda": torch.cuda.is_available(),
        "mps": bool(backend and backend.is_available()),
        "xpu": bool(backend and backend.is_available()),
    }.get(kind, True)
    if not have:
        why = " (this torch is built without CUDA)" if kind == "cuda" and torch.version.cuda is None else ""
        raise ValueError(
            f"config field {field!r} is {device!r} but torch sees no {kind} device on this machine{why}; "
            "use device=auto (the GPU when there is one, else the CPU) or device=cpu"
        )
    if kind == "cuda" and colon and int(index) >= torch.cuda.device_count():
        raise ValueError(
            f"config field {field!r} is {device!r} but this machine has {torch.cuda.device_count()} "
            f"CUDA device(s), numbered from 0"
        )


def setup(device: str = "auto", rollout_workers: int = 0) -> torch.device:
    """This process's device ('auto': the GPU of its local rank when torch sees one, else the CPU);
    under torchrun also the process group, once (NCCL on GPUs, gloo on CPUs), and with
    ``rollout_workers = K`` the role groups: the last K ranks generate, the others train."""
    check_device(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if not launched():
        return dev
    if dev.type == "cuda":  # GPU only: one device per local rank
        dev = torch.device("cuda", local_rank()) if dev.index is None else dev
        torch.cuda.set_device(dev)
    _DEVICE[0] = dev
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()))
        atexit.register(_teardown)
        if rollout_workers:
            _split_roles(rollout_workers)
    return dev


def _split_roles(k: int) -> None:
    """Every process creates the three groups, in the same order (``new_group`` is collective)."""
    n = dist.get_world_size()
    if not 0 < k < n:
        raise ValueError(f"rollout_workers={k} must leave at least one of the {n} processes to train")
    timeout = datetime.timedelta(seconds=timeout_s())
    trainers = dist.new_group(list(range(n - k)), timeout=timeout)
    generators = dist.new_group(list(range(n - k, n)), timeout=timeout)
    sync = dist.new_group([0, *range(n - k, n)], timeout=timeout)
    objects = dist.new_group(list(range(n)), timeout=timeout, backend="gloo")  # CPU objects, even beside NCCL
    _GROUPS.update(workers=k, sync=sync, objects=objects, role=generators if dist.get_rank() >= n - k else trainers)


def _teardown() -> None:
    """Destroy the process group at exit (as torch asks): a gloo group still alive at interpreter
    shutdown can abort the process ("terminate called without an active exception", seen once
    after a run had finished and saved). Local: it waits on no other process."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # exiting anyway; an error here must not mask the run's own exit status
            pass


def launch_rank() -> int:
    """This process's global rank as torchrun set it (``RANK``; 0 without torchrun): known before
    the process group joins (``global_rank`` asks the group)."""
    return int(os.environ.get("RANK", "0"))


def under_torchrun() -> bool:
    """Whether torchrun started this process (``WORLD_SIZE`` is set, also to 1)."""
    return "WORLD_SIZE" in os.environ


def planned_world() -> int:
    """The number of processes torchrun started (known before the process group exists)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over every process of this role (a new tensor; ``x`` itself alone). The
    algorithm core takes this as its ``reduce`` argument for batch statistics."""
    return _all_reduce(x, "sum")


def global_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` and over the rows of every process of this role (0 where nothing is masked in)."""
    mask = mask.bool()
    part = torch.stack([torch.where(mask, x.float(), 0.0).sum(), mask.sum().float()])
    total = reduce_sum(part)
    return total[0] / total[1].clamp(min=1)


def global_nanmean(x: torch.Tensor) -> torch.Tensor:
    """``torch.nanmean`` over the rows of every process of this role (NaN where nothing is a number)."""
    ok = ~torch.isnan(x)
    total = reduce_sum(torch.stack([torch.where(ok, x, 0.0).sum(), ok.sum().float()]))
    return total[0] / total[1] if bool(total[1] > 0) else torch.tensor(float("nan"))


def reduce_tensor_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of ``x`` over every process of this role."""
    return _all_reduce(x, "max")


def sum_floats(values: list[float]) -> list[float]:
    """Python numbers summed over every process of this role (in float64)."""
    if not role_active():
        return list(values)
    return reduce_sum(torch.tensor(values, dtype=torch.float64)).tolist()


def _all_reduce(x: torch.Tensor, op: str) -> torch.Tensor:
    """A reduced copy of ``x``; the collective runs on this process's device (NCCL reduces GPU
    tensors only), the result comes back where ``x`` was."""
    if not role_active():
        return x
    out = x.detach().to(_DEVICE[0]).clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=_GROUPS["role"])
    return out.to(x.device)


def reduce_max(value: int) -> int:
    """The largest ``value`` over every process of this role."""
    return int(_all_reduce(torch.tensor([value], dtype=torch.long), "max").item()) if role_active() else value


def dcp_options() -> dict:
    """The keyword arguments that keep a ``torch.distributed.checkpoint`` save or load within this
    process's role (a lone trainer beside generator ranks reads and writes alone)."""
    if role_active():
        return {"process_group": _GROUPS["role"]}
    return {"no_dist": True} if _initialized() else {}


def role_barrier() -> None:
    """Every process of this process's role has got here."""
    if role_active():
        dist.barrier(group=_GROUPS["role"])


def finished() -> None:
    """Every process has reached the end of its run (all of them, whatever their role; nothing without
    torchrun): called after the final save, so none tears its group down while rank 0 still writes. An
    all-reduce on a tensor kept to exit, not gloo's barrier: the barrier held the last all-gathers until a
    gloo thread freed them, once while the interpreter finalized, which aborted the process ("terminate
    called without an active exception"). A failed process never gets here; torchrun ends the others."""
    if joined():
        _FINISHED.append(torch.ones(1, device=_DEVICE[0]))  # alive to exit: no gloo thread frees its Python object
        dist.all_reduce(_FINISHED[-1])
        _FINISHED[-1].item()  # on a GPU the read waits on the host, as a barrier does


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model: its ``_no_split_modules`` classes."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model: torch.nn.Module, parallelism: str = "fsdp", mixed_precision: str | None = None):
    """``model`` ready for data-parallel training on every process of this role: FSDP2 (each transformer block,
    then the whole model, sharded in place; parameters become DTensors) or DDP (a wrapper whose
    ``module`` is ``model``). Returns the module to call for training forward passes. A single
    process gets ``model`` back unchanged.

    ``mixed_precision`` ('bfloat16'): FSDP2 computes in it while parameters, gradients and
    optimizer states stay in their own dtype (the GPU default).
    """
    if not role_active():
        return model
    if parallelism not in ("fsdp", "ddp"):  # the configs refuse any other value first (config.PARALLELISMS)
        raise ValueError(f"parallelism must be 'fsdp' or 'ddp', got {parallelism!r}")
    if parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if not any(p.requires_grad for p in model.parameters()):
            return model  # frozen: every rank holds the same copy, nothing to synchronise
        dev = next(model.parameters()).device
        # broadcast_buffers=False: forward passes must not be collectives (ranks generate
        # completions of different lengths, so they run different numbers of forward passes).
        return DistributedDataParallel(
            model,
            device_ids=[dev] if dev.type == "cuda" else None,
            broadcast_buffers=False,
            process_group=_GROUPS["role"],
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = None  # fully_shard's default: every process
    if _GROUPS["role"] is not None:  # FSDP2 over this role's processes only
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(_GROUPS["role"], _DEVICE[0].type)
    policy = MixedPrecisionPolicy()  # fully_shard's default: compute in the parameters' dtype
    if mixed_precision is not None:
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, mixed_precision), reduce_dtype=torch.float32)
    for block in _blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (FSDP2 shards in place: the model itself)."""
    return getattr(model, "module", model)


@contextmanager
def gathered(model: torch.nn.Module):
    """Every FSDP2 module of ``model`` holds its full parameters for the duration, and forward
    passes are no collectives: generation runs a number of forward passes that differs from rank
    to rank (completions end at different lengths). Nothing happens for unsharded models."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)] if role_active() else []
    for m in sharded:
        m.unshard()
        m.set_reshard_after_forward(False)
    try:
        yield model
    finally:
        for m in sharded:
            m.reshard()
            m.set_reshard_after_forward(True)


def reshard(model: torch.nn.Module) -> None:
    """Every FSDP2 module of ``model`` frees the full parameters it gathered (a forward pass leaves the
    root's gathered: its backward would need them). Nothing happens for unsharded models."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on the CPU — gathered on every process of this role (a collective)."""
    if not role_active():
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(unwrap(model), options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], state)  # typed as any state value; full and offloaded: plain tensors
