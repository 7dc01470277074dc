"""Asynchronous rollouts: generator ranks beside trainer ranks (``rollout_workers: K``), with a
staleness bound (``max_staleness: S``).

Under torchrun the last K ranks generate and the others train. A generator runs phases 1–3 of the
loop exactly as a synchronous process does — ``run_generator`` drives its ``rl.sampler.Sampler``:
prompts, its own engine (HF or vLLM), its own reward functions, reward models and environments,
dynamic sampling among the generators; a trainer runs phases 4–7 (make experience, update, log,
evaluate, checkpoint) on the batches its ``RemoteSampler`` receives — the same ``batch`` method
the synchronous loop calls. The transport is ``rollout/remote.py``; the weights a generator
receives go into its policy (``rollout.weight_sync.load_weights``), from which its engine is made
ready as in a synchronous process (``rollout.engines.engine_ready``).

**The schedule** (prime-rl's ``async_level``, verl's one-step-off generalised to S steps): the
batch of step ``s`` is generated with the policy version ``max(start, s - S)`` — version ``v``
being the weights after ``v`` updates, ``start`` the step the run starts (or resumes) at. So:

- S = 0 is the synchronous algorithm: step ``s`` waits for the weights of update ``s - 1``; with the
  same seed the run is the single-process run (the sampling seeds depend on (seed, step, round,
  prompt), not on which process samples), which ``tests/distributed/test_async.py`` checks weight
  for weight — for any number of generators.
- S ≥ 1 lets a generator produce the next S batches while the trainers update on the current one.
  A sample is never more than S versions old *by construction*: a generator does not start batch
  ``s`` before it holds version ``s - S`` (it blocks on the next broadcast — ``perf/generator_wait_s``),
  so nothing stale is ever generated and nothing needs dropping; the trainer still checks each
  batch's version and refuses one past the bound (a protocol error, never a silent use). Logged:
  ``rollout/staleness_mean`` / ``_max`` (steps between the weights that sampled and those that
  train), ``perf/trainer_wait_s`` (the trainer blocked on the batch).

**The off-policy correction**: a generator's engine reports the log-probs it sampled with (μ, the
behaviour policy; the HF engine returns them on a generator rank). The trainer computes the
log-probs of the current weights before the update — the *proximal* policy π_prox, its usual "old"
log-probs —, weights each token's loss by the rollout correction ``rollout_is`` of π_prox/μ
(truncated or masked, ``algorithms/rollout_is.py``) and clips the ratio π/π_prox around π_prox.
This is the decoupled PPO objective (Hilton et al. 2021, "Batch size-invariance for policy
optimization", arXiv:2110.00431, eq. 3; AReaL, Fu et al. 2025, arXiv:2505.24298, §5.2) with the
behaviour weight truncated as in TIS: the clip bounds how far one update moves from π_prox,
whatever the age of the sample, and the weight corrects for the sample's age.

**Deadlock freedom**: weights go trainer rank 0 → generators by broadcasts in one order on every
member; batches go generator → trainers by posted sends (``isend``) the receiver takes in step
order. A generator never waits on a send before it has received the weights the trainer broadcast
first, so neither side can wait on the other in a circle. A process that fails ends the job:
torchrun stops the others (and every collective has ``RLHFKIT_DIST_TIMEOUT``).

**Checkpoints**: trainers save as without generators; the batches in flight (generated, not yet
trained on) are not saved — a resumed run starts its generators at the checkpoint's step with its
weights (so with S = 0 a resumed run is the uninterrupted one).
"""

from __future__ import annotations

import math
import time

import torch

from .. import distributed
from ..rollout import concat_rollouts
from ..rollout.remote import (
    broadcast_start,
    manifest,
    receive_object,
    receive_weights,
    send_object,
    send_weights,
    wait_all,
)
from ..rollout.weight_sync import hf_weights, load_weights
from ..run import trace
from ..run.training import timer
from .sampler import Batch, Sampler


def version_for(step: int, start: int, staleness: int) -> int:
    """The policy version (updates done) that generates the batch of ``step``."""
    return max(start, step - staleness)


def last_version(max_steps: int, staleness: int) -> int:
    """The newest version any batch of a run of ``max_steps`` steps is generated with."""
    return max_steps - 1 - staleness


class RemoteSampler(Sampler):
    """A trainer rank's sampler under ``rollout_workers``: ``batch`` receives this trainer's share of
    the batch the generator ranks made; ``start`` (rank 0 tells the generators where the run starts
    and sends the first weights) and ``publish`` (the weights of a new version, when a batch still
    to come uses it) keep them fed. Its own engine (HF generate on the policy) and reward sources
    serve ``evaluate``. ``max_staleness``: the config's bound."""

    def __init__(self, *args, max_staleness: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_staleness, self.start_step = max_staleness, 0

    def start(self, counters: dict) -> None:
        """Every trainer calls this before its first step (under FSDP2 gathering the weights is
        collective); ``counters``: the trainer's step and data position (resumed or fresh)."""
        self.start_step = counters["step"]
        with trace.span("weight_sync"), torch.no_grad(), distributed.gathered(self.models.policy):
            if distributed.is_main():
                weights = list(hf_weights(self.models.policy))
                broadcast_start({"counters": counters, "manifest": manifest(weights)})
                send_weights(weights, self.models.device)

    def publish(self, version: int, timings: dict) -> None:
        """After an update: send the weights of ``version`` if a batch still to be generated uses it
        (timed as ``timings["weight_sync"]``)."""
        if version > last_version(self.config.max_steps, self.max_staleness):
            return
        with timer(timings, "weight_sync"), torch.no_grad(), distributed.gathered(self.models.policy):
            if distributed.is_main():
                send_weights(list(hf_weights(self.models.policy)), self.models.device)

    def batch(self, step: int, version: int, timings: dict | None = None) -> Batch:
        """The batch of ``step`` from every generator — this trainer's share — with the generators'
        ``rollout/staleness_*`` and ``perf/generator_*`` metrics; the data position moves to the
        generators' (what a checkpoint saves). ``version`` (the trainer's) is not needed: each
        batch says which version made it, checked against ``max_staleness``."""
        timings = {} if timings is None else timings
        with timer(timings, "wait"):  # blocked on the generators' batch
            parts = [receive_object(src) for src in distributed.generator_ranks()]
        wait = timings["wait"]
        S = self.max_staleness
        for part in parts:
            if part["step"] != step:
                raise RuntimeError(f"generator sent the batch of step {part['step']} where step {step} was due")
            if step - part["version"] > S:
                raise RuntimeError(
                    f"the batch of step {step} comes from version {part['version']}, more than max_staleness={S} behind"
                )
        rows, rollout, scores, valid = self._share(parts)
        staleness = torch.tensor([float(step - p["version"]) for p in parts])
        metrics = {
            **parts[0]["metrics"],
            "rollout/staleness_mean": float(staleness.mean()),
            "rollout/staleness_max": float(staleness.max()),
            "perf/trainer_wait_s": wait,
            "perf/generator_wait_s": max(p["wait_s"] for p in parts),
            **{f"perf/generator_time_{k}": v for k, v in parts[0]["timings"].items()},
        }
        self.restore(parts[0]["position"])
        self.steps_done = step + 1  # what an evaluation's reward functions are told (trainer_state)
        return Batch(rows, rollout, scores, valid, metrics, parts[0]["samples"])

    def _share(self, parts: list[dict]) -> tuple:
        """This trainer's groups of the generators' batches (in generator order): the groups are
        split evenly over the trainers, topped up with invalid copies of the first group when they
        do not divide (dynamic sampling that ran out of rounds)."""
        G, T, me = self.config.group_size, distributed.role_size(), distributed.role_rank()
        rollout = concat_rollouts([p["rollout"] for p in parts], self.pad_id)
        scores = torch.cat([p["scores"] for p in parts])
        valid = torch.cat([p["valid"] for p in parts])
        rows = [r for p in parts for r in p["rows"]]
        n = len(rows)
        per = math.ceil(n / T)
        groups = list(range(n)) + [0] * (per * T - n)
        mine = groups[me * per : (me + 1) * per]
        index = torch.tensor([g * G + j for g in mine for j in range(G)])
        filler = torch.tensor([me * per + i >= n for i in range(per) for _ in range(G)])
        return ([rows[g] for g in mine], rollout.select(index), scores[index], valid[index] & ~filler)


class GeneratorRank:
    """All a generator rank (``rollout_workers``) holds of a run: its ``sampler`` (phases 1–3 on the
    weights the trainers send) and the staleness bound — no optimizer, no loop state, no update
    side. ``train`` runs it to the end (``run_generator``), as ``RLTrainer.train`` on a trainer."""

    def __init__(self, sampler: Sampler, max_staleness: int):
        self.sampler, self.max_staleness = sampler, max_staleness

    def train(self) -> list[dict]:
        """Generate every step's batch for the trainers, close the episode source, write this
        rank's timeline, then wait for every process (``distributed.finished``); logs no rows."""
        run_generator(self.sampler, self.max_staleness)
        if self.sampler.agent is not None:
            self.sampler.agent.close()
        trace.stop()  # its timeline written before the barrier, after which rank 0 merges
        distributed.finished()
        return []


def run_generator(sampler: Sampler, max_staleness: int) -> None:
    """A generator rank's loop: for each step from the run's start, hold the version the schedule
    asks for (receiving broadcasts into ``sampler``'s policy), make the step's batch
    (``sampler.batch``, with the step's seeds as in the synchronous run), post it to every trainer."""
    models = sampler.models
    start = broadcast_start()
    counters, entries = start["counters"], start["manifest"]
    sampler.restore((counters["data_epoch"], counters["data_pos"]))
    have = counters["step"]
    with trace.span("wait_weights", version=have):
        load_weights(models.policy, receive_weights(entries, models.device))
    works: list[list] = []
    for step in range(counters["step"], sampler.config.max_steps):
        begin = time.perf_counter()
        timings: dict[str, float] = {}
        waited: dict[str, float] = {}
        with timer(waited, "wait_weights"):  # blocked on the version this step needs (and receiving it)
            while have < version_for(step, counters["step"], max_staleness):
                have += 1
                load_weights(models.policy, receive_weights(entries, models.device))
        wait = waited["wait_weights"]
        batch = sampler.batch(step, have, timings)
        if have == step and not sampler.engine.needs_sync:
            # HF generate on the very weights the trainers hold: the sampler *is* π_old, as in the
            # synchronous run, whose HF engine reports no log-probs (ρ = 1 exactly, not 1 ± rounding).
            batch.rollout.logprobs = None
        message = {
            "step": step,
            "version": have,
            "rows": batch.rows,
            "rollout": batch.rollout.to("cpu"),
            "scores": batch.scores.cpu(),
            "valid": batch.valid.cpu(),
            "metrics": {k: float(v) for k, v in batch.metrics.items()},
            "position": sampler.position(),
            "wait_s": wait,
            "timings": timings,
            "samples": batch.samples,
        }
        with trace.span("send"):
            works.append([w for dst in distributed.trainer_ranks() for w in send_object(message, dst)])
            if len(works) > max_staleness + 1:  # received by now (the trainers took the weights after it)
                wait_all(works.pop(0))
        trace.record("step", begin, time.perf_counter(), {"step": step + 1, "version": have})
        trace.flush()
    with trace.span("send"):
        for w in works:
            wait_all(w)
