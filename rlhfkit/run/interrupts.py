"""Ctrl-C (SIGINT) and SIGTERM in the ``rlhfkit`` command: one line on stderr, exit status 128 + the
signal's number (130, 143), and the way back to the work done.

Nothing here is installed by importing rlhfkit or by a trainer called from Python (there Ctrl-C is
Python's ``KeyboardInterrupt``, as ever): ``cli.main`` alone installs ``handlers()`` for the time it
runs, in the process that runs it.

- The first signal raises ``Interrupted`` (a ``KeyboardInterrupt`` carrying the signal) in the main
  thread, wherever it is: a step, a save, a collective; only inside ``deferred()`` (DCP's shard writes)
  it waits for the end of the block. So does any later one until ``report`` starts (a signal
  swallowed by some library still ends the run); from then on they are ignored.
- ``report(...)``: ``main`` calls it for ``Interrupted`` and, once a signal has arrived, for any
  other exception as well (a gloo collective failing because a peer already exited, a save that
  failed because it was interrupted), so an interrupted run never ends in a traceback. It prints
  one line — for a training command the newest complete checkpoint of this run and the exact
  command that resumes from it, else what rerunning does — and returns the exit status::

    rlhfkit rl: interrupted (SIGINT); newest complete checkpoint: runA/checkpoint-4; resume with:
        rlhfkit rl --config grpo.yaml output_dir=runA resume_from=runA/checkpoint-4

  (one line, wrapped here).

- A checkpoint being written when the signal arrives is completed or left recognisably partial:
  ``checkpoint.save_checkpoint`` writes into ``checkpoint-N.partial`` and renames it once
  ``trainer_state.json`` is in; a checkpoint replaced or pruned loses its ``trainer_state.json``
  first. ``resume_from=latest`` and this line only ever name a complete ``checkpoint-N``.
- Under torchrun every rank gets the signal from torchrun's agent; rank 0 (``RANK``) prints the
  line, the others exit silently with the same status. The command that started torchrun
  (``--nproc-per-node N``) runs it through ``supervise``: torchrun in its own process group, so a
  terminal's Ctrl-C (or a scheduler's signal to the command) reaches it once, forwarded by the
  command, which then waits for it and prints nothing itself. torchrun's agent answers a signal
  with warnings and a traceback of its own (``SignalException``): after a forwarded signal only
  the lines that rlhfkit's ranks print (``rlhfkit ...``) are passed on, so the whole stderr after
  Ctrl-C is rank 0's one line.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager

from .signals import (  # noqa: F401  (Interrupted, deferred, received, exit_status: read through this module too)
    SIGNALS,
    STATE,
    Interrupted,
    deferred,
    exit_status,
    handler,
    quiet,
    received,
)

ARGV_ENV = "RLHFKIT_COMMAND_ARGV"  # the command as typed (--nproc-per-node N too), for torchrun's ranks


@contextmanager
def handlers():
    """SIGINT and SIGTERM raise ``Interrupted`` while inside (main thread only; elsewhere nothing is
    installed); the previous handlers and a fresh state afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from .checkpoint import NEWEST

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    STATE.update(signum=None, quiet=False, deferred=False)
    NEWEST.clear()
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def report(command: str, argv: list[str], job=None) -> int:
    """After an interrupt: one line on stderr (rank 0 only) and the exit status (128 + signal).
    ``argv``: the arguments after ``rlhfkit`` (``command`` first); ``job``: the training job's config, when it
    had loaded (its ``output_dir``, ``overwrite``, ``resume_from`` and ``save_steps``)."""
    quiet()
    name = signal.Signals(STATE["signum"]).name
    argv = shlex.split(os.environ[ARGV_ENV]) if ARGV_ENV in os.environ else argv
    from .. import distributed

    if distributed.launch_rank() == 0:
        line = f"rlhfkit {command}: interrupted ({name})"
        if job is not None:
            line += "; " + _way_back(command, argv, job)
        try:
            print(line, file=sys.stderr, flush=True)
        except OSError:  # stderr gone (the terminal closed, the command that read it killed)
            pass
    return exit_status()


def _way_back(command: str, argv: list[str], job) -> str:
    from .checkpoint import NEWEST, STATE_FILE
    from .directory import check_run_dir

    out = getattr(job, "output_dir", None)
    if not out:
        return "no output_dir, so no checkpoint: rerunning the same command starts over"
    newest = NEWEST[0] if NEWEST else None  # this run's: a later checkpoint-N may be of an abandoned continuation
    if newest is not None and (newest / STATE_FILE).is_file():
        kept = [a for a in argv if a != "--overwrite" and not a.startswith(("resume_from=", "overwrite="))]
        resume = [*kept, f"resume_from={newest}"]
        if not _accepted(check_run_dir, out, False, str(newest)):
            resume.append("--overwrite")  # resumed from outside output_dir, which now holds this run's steps
        return f"newest complete checkpoint: {newest}; resume with: {shlex.join(['rlhfkit', *resume])}"
    if getattr(job, "resume_from", None):
        return f"it had not resumed yet: rerunning the same command resumes from {job.resume_from}"
    none = "no complete checkpoint yet" + (" (save_steps=0 saves none)" if not getattr(job, "save_steps", 1) else "")
    if _accepted(check_run_dir, out, getattr(job, "overwrite", False), getattr(job, "resume_from", None)):
        return f"{none}: rerunning the same command starts over"
    return f"{none}; start over with: {shlex.join(['rlhfkit', *argv, '--overwrite'])}"


def _accepted(check, output_dir, overwrite, resume_from) -> bool:
    try:
        check(output_dir, overwrite, resume_from)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- the command that starts torchrun
def supervise(command: list[str], argv: list[str]) -> int:
    """Run ``command`` (torchrun) in its own process group, stdout inherited and stderr passed
    through; on SIGINT/SIGTERM forward the signal to it once, wait for it, pass on only the lines
    rlhfkit's ranks print after that, and return 128 + the signal (torchrun's own status when it
    had already succeeded). Prints nothing itself. ``argv``: the command as typed, which rank 0's
    line repeats."""
    env = {**os.environ, ARGV_ENV: shlex.join(argv)}
    if sys.stderr.isatty():  # the progress bar of rank 0 sizes itself from these behind the pipe
        size = os.get_terminal_size(sys.stderr.fileno())
        env.setdefault("COLUMNS", str(size.columns))
        env.setdefault("LINES", str(size.lines))
    STATE["deferred"] = True  # a signal during the start is forwarded once the process exists
    try:
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, env=env, preexec_fn=_own_group())
    finally:
        STATE["deferred"] = False
    filtering = threading.Event()
    passed: list[bytes] = []
    pump = threading.Thread(target=_pump, args=(proc.stderr, filtering, passed), daemon=True)
    pump.start()
    forwarded = None
    while True:
        try:
            if STATE["signum"] is not None and forwarded is None:
                raise Interrupted(STATE["signum"])
            proc.wait()
            break
        except Interrupted as err:
            if forwarded is None:
                forwarded = err.signum
                filtering.set()
                quiet()
                proc.send_signal(forwarded)
    pump.join()
    if forwarded is None or proc.returncode == 0:
        return proc.returncode
    if not passed:  # rank 0 had not installed its handlers yet (still starting): say it here
        _write(None, f"rlhfkit {argv[0]}: interrupted ({signal.Signals(forwarded).name})\n".encode())
    return 128 + forwarded


def _pump(stream, filtering: threading.Event, passed: list[bytes]) -> None:
    """torchrun's stderr to ours: as it comes (progress bars redraw without newlines) until
    ``filtering``, then only whole lines that rlhfkit prints (``rlhfkit <command>: ...``), each
    also appended to ``passed``."""
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    fd, pending = stream.fileno(), b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if not filtering.is_set():
            _write(out, chunk)
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"rlhfkit "):
                _write(out, line + b"\n")
                passed.append(line)
    stream.close()


def _write(out, data: bytes) -> None:
    try:
        if out is not None:
            out.write(data)
            out.flush()
        else:
            sys.stderr.write(data.decode(errors="replace"))
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _own_group():
    """In the child before it runs torchrun: its own process group (``process_group=0`` needs Python
    3.11), and on Linux SIGTERM when this command dies, even by SIGKILL (its own group no longer
    shares the command's fate), so that torchrun stops its workers."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def setup():
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG

    return setup


__all__ = ["Interrupted", "handlers", "received", "report", "supervise"]
