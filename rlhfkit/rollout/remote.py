"""The transport between trainer ranks and generator ranks (``rollout_workers``; ``rl/pipeline.py``
runs the protocol over it).

- **Weights**, trainer rank 0 → every generator: ``send_weights`` / ``receive_weights``, one
  ``broadcast`` per bucket over ``distributed.sync_group()`` (rank 0 and the generators), the
  tensors of a bucket flattened into one buffer of one dtype. Both sides cut the buckets from the
  same manifest (names, shapes, dtypes: ``manifest``, sent once at the start), so every process of
  the group enters the same broadcasts in the same order — there is no order in which two of them
  wait on each other. The sync group is gloo on CPUs, NCCL on GPUs (the buckets then travel on the
  device).
- **Objects** (the start, and each step's rollout, scores and metrics), generator → trainer:
  ``send_object`` pickles into a byte tensor and posts it with ``isend`` — it returns at once and
  gloo's transport thread delivers it while the generator goes on generating — and
  ``receive_object`` is the blocking ``recv``. They run on ``distributed.object_group()``, gloo over every
  process whatever the device (objects stay on the CPU).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from .. import distributed

BUCKET_BYTES = 256 << 20  # the most bytes one broadcast carries (a larger tensor goes alone)


def send_object(obj, dst: int) -> list:
    """Post ``obj`` to global rank ``dst`` without waiting: the returned works (wait on them before
    the process exits) hold the buffers until delivered."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.long)
    group = distributed.object_group()
    return [dist.isend(size, dst, group=group), dist.isend(data, dst, group=group), (size, data)]


def wait_all(works: list) -> None:
    for work in works:
        if hasattr(work, "wait"):
            work.wait()


def receive_object(src: int):
    """The next object global rank ``src`` sent this process (blocks until it arrives)."""
    group = distributed.object_group()
    size = torch.empty(1, dtype=torch.long)
    dist.recv(size, src, group=group)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(data, src, group=group)
    return pickle.loads(data.numpy().tobytes())


def manifest(weights: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, tuple, str]]:
    """``(name, shape, dtype)`` of each weight, in the order they are sent."""
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in weights]


def buckets(entries: list[tuple[str, tuple, str]], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """The manifest's indices cut into buckets: consecutive weights of one dtype, at most ``limit``
    bytes together (a weight larger than that is a bucket of its own)."""
    out: list[list[int]] = []
    size, dtype = 0, None
    for i, (_, shape, name) in enumerate(entries):
        nbytes = _numel(shape) * torch.empty((), dtype=getattr(torch, name)).element_size()
        if not out or name != dtype or size + nbytes > limit:
            out.append([])
            size, dtype = 0, name
        out[-1].append(i)
        size += nbytes
    return out


def send_weights(weights: list[tuple[str, torch.Tensor]], device: torch.device) -> None:
    """Broadcast ``weights`` (their ``manifest`` was sent before) from global rank 0 to the generators."""
    entries = manifest(weights)
    for bucket in buckets(entries):
        flat = torch.cat([weights[i][1].detach().reshape(-1) for i in bucket]).to(device)
        dist.broadcast(flat, group_src=0, group=distributed.sync_group())


def receive_weights(entries: list[tuple[str, tuple, str]], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """On a generator: the weights of the next ``send_weights``, ``(name, tensor)`` in manifest order.
    Consume the iterator to the end (each bucket is a broadcast every member must enter)."""
    for bucket in buckets(entries):
        sizes = [_numel(entries[i][1]) for i in bucket]
        flat = torch.empty(sum(sizes), dtype=getattr(torch, entries[bucket[0]][2]), device=device)
        dist.broadcast(flat, group_src=0, group=distributed.sync_group())
        for i, part in zip(bucket, flat.split(sizes)):
            yield entries[i][0], part.view(entries[i][1])


def broadcast_start(obj=None):
    """Global rank 0's ``obj`` on every generator (over the sync group)."""
    box = [obj]
    dist.broadcast_object_list(box, group_src=0, group=distributed.sync_group())
    return box[0]


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
