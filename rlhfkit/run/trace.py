"""The step timeline: every process of a run records its phases as Chrome trace events, and the run
directory gets one ``trace.json`` that Perfetto (https://ui.perfetto.dev) and ``chrome://tracing`` open.

**What is recorded.** Each ``run.training.timer(timings, name)`` block — the phases whose seconds
the RL loop logs as ``perf/time_<name>`` (``generate``, ``reward``, ``logprobs``, ``update``,
``weight_sync``, ``wait``) — is also one complete event (``"ph": "X"``) named ``name``; ``span``
records a block that has no ``perf/time_*`` metric (``step``, ``evaluate``, ``checkpoint``,
``optimizer_step``, ``save_final``, a generator's ``wait_weights`` and ``send``). One mechanism:
``timer`` is ``span`` plus the seconds. A few events per step, never one per token.

**The format.** ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; ``ts`` and ``dur`` in
microseconds of the wall clock (``time.time()``: processes on one host line up); ``pid``: the
global rank; ``tid``: 0, the process's loop (its spans nest: a step holds its phases); metadata
events name each process ``trainer rank <r>`` or ``generator rank <r>``. A step's ``args`` carry
its number.

**Where.** Each process appends its events to ``<output_dir>/trace/rank-<r>.jsonl`` (one JSON
event per line) after every step, and at exit: a run that crashes keeps what it recorded up to its
last step. At the end of a run rank 0 merges every rank's file (and a ``trace.json`` already there:
a resumed run continues the timeline) into ``<output_dir>/trace.json`` and removes ``trace/``; a run
that never got there is merged by ``rlhfkit report`` or ``python -m rlhfkit.run.trace <run_dir>``
(which keep ``trace/``: merging twice, or while the run goes on, counts each event once). A run
without ``output_dir`` records nothing.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ..files import write_text_atomic

TRACE_FILE, RANK_DIR = "trace.json", "trace"
MAX_BUFFERED = 100_000  # events held while the run directory is not there yet (another node's rank)


class Trace:
    """The events of one process of one run, written to ``<output_dir>/trace/rank-<rank>.jsonl``
    (``flush``); ``role``: ``trainer`` or ``generator``."""

    def __init__(self, output_dir, rank: int, role: str):
        self.run_dir, self.rank = Path(output_dir), rank
        self.file = self.run_dir / RANK_DIR / f"rank-{rank}.jsonl"
        self.offset = time.time() - time.perf_counter()  # perf_counter seconds -> wall-clock seconds
        name = f"{role} rank {rank}"
        self.events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"{role} loop"}},
        ]
        self.timed = False  # whether ``events`` holds a timed event

    def add(self, name: str, start: float, end: float, args: dict | None = None) -> None:
        """One complete event from ``time.perf_counter()`` readings ``start`` .. ``end``."""
        if len(self.events) < MAX_BUFFERED:
            event = {
                "name": name,
                "ph": "X",
                "pid": self.rank,
                "tid": 0,
                "ts": round((start + self.offset) * 1e6, 1),
                "dur": round((end - start) * 1e6, 1),
            }
            if args:
                event["args"] = args
            self.events.append(event)
            self.timed = True

    def flush(self) -> None:
        """Append the buffered events to this process's file. Kept in memory while the run directory
        does not exist yet (rank 0 creates it); a failed write is one line on stderr, never the run's end."""
        if not self.timed or not self.run_dir.is_dir():  # the process names alone: a trainer never trained
            return
        lines = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in self.events)
        try:
            self.file.parent.mkdir(exist_ok=True)
            with open(self.file, "a", encoding="utf-8") as f:
                f.write(lines)
        except OSError as e:
            print(f"warning: the step timeline could not be written to {self.file}: {e}", file=sys.stderr)
        self.events, self.timed = [], False


_active: list[Trace] = []  # this process's trace (at most one: the newest run's)


def start(output_dir, rank: int, role: str) -> Trace | None:
    """Record this process's timeline of the run writing to ``output_dir`` (None: record nothing);
    the previous run's trace in this process, if any, is flushed and replaced."""
    stop()
    if not output_dir:
        return None
    trace = Trace(output_dir, rank, role)
    _active.append(trace)
    return trace


def stop() -> None:
    """Flush and stop recording."""
    while _active:
        _active.pop().flush()


def flush() -> None:
    """Write what this process recorded so far (after each step)."""
    if _active:
        _active[0].flush()


def record(name: str, start: float, end: float, args: dict | None = None) -> None:
    """One event of ``perf_counter`` readings ``start`` .. ``end`` (nothing when not recording)."""
    if _active:
        _active[0].add(name, start, end, args)


@contextmanager
def span(name: str, **args):
    """The block as one event ``name`` (``args``: shown in the viewer, e.g. ``step=3``)."""
    if not _active:
        yield
        return
    begin = time.perf_counter()
    try:
        yield
    finally:
        record(name, begin, time.perf_counter(), args or None)


def _read_events(path: Path) -> list[dict]:
    """The events of a rank's file; a line cut short by a crash is skipped."""
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def merge(run_dir, remove: bool = True) -> Path | None:
    """Join ``run_dir/trace/rank-*.jsonl`` and the ``trace.json`` already there (an event in both
    counts once) into ``run_dir/trace.json``, sorted by time; ``remove``: then delete ``trace/``
    (the run's end: every process has written all it will). Returns ``trace.json``, or None when
    the run recorded no timeline."""
    run_dir = Path(run_dir)
    target, parts = run_dir / TRACE_FILE, sorted((run_dir / RANK_DIR).glob("rank-*.jsonl"))
    if not parts:
        return target if target.is_file() else None
    events = []
    if target.is_file():
        try:
            events = list(json.loads(target.read_text(encoding="utf-8")).get("traceEvents", []))
        except (ValueError, AttributeError):
            events = []  # damaged: the ranks' files still hold this segment
    for part in parts:
        events += _read_events(part)
    meta = {(e.get("pid"), e.get("name")): e for e in events if e.get("ph") == "M"}  # once per process
    unique = {json.dumps(e, sort_keys=True): e for e in events if e.get("ph") != "M"}  # once each
    timed = sorted(unique.values(), key=lambda e: (e.get("ts", 0), -e.get("dur", 0)))
    write_text_atomic(
        target,
        json.dumps({"traceEvents": [*meta.values(), *timed], "displayTimeUnit": "ms"}, separators=(",", ":")) + "\n",
    )
    if remove:
        shutil.rmtree(run_dir / RANK_DIR, ignore_errors=True)
    return target


atexit.register(stop)  # a run that raises still leaves the events of its steps so far


def main(argv: list[str] | None = None) -> int:
    """``python -m rlhfkit.run.trace RUN_DIR``: merge a run's per-rank timelines into ``trace.json``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m rlhfkit.run.trace RUN_DIR", file=sys.stderr)
        return 2
    path = merge(args[0], remove=False)
    print(path if path else f"{args[0]}: no step timeline recorded", file=sys.stderr if path is None else sys.stdout)
    return 0 if path else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Trace", "TRACE_FILE", "RANK_DIR", "start", "stop", "flush", "record", "span", "merge"]
