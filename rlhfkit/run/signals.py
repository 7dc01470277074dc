"""The signal state of the ``rlhfkit`` command: the first SIGINT or SIGTERM received, whether one now raises
``Interrupted`` at once, is held to the end of a ``deferred()`` block, or is ignored (``quiet``, once the run's
line is being printed). ``interrupts.handlers()`` installs ``handler`` for the time the command runs; modules
below it (``checkpoint``) mark their uncuttable calls with ``deferred()`` without importing the reporter above."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STATE: dict = {"signum": None, "quiet": False, "deferred": False}


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM received by the ``rlhfkit`` command (``signum``)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def handler(signum, frame) -> None:
    if STATE["signum"] is None:
        STATE["signum"] = signum
    if not (STATE["quiet"] or STATE["deferred"]):
        raise Interrupted(STATE["signum"])


@contextmanager
def deferred():
    """A signal arriving inside is held and raised as ``Interrupted`` on leaving (after a body that ended
    normally; a body's own exception goes on as it is): for a call that must not be cut in the middle.
    DCP writes every tensor with ``torch.save``; cut there, the zip writer left in the traceback writes
    its end record into the closed shard file when it is freed, and the process aborts ("terminate
    called after throwing an instance of 'pybind11::error_already_set'", or a fatal error when that is
    at exit). Outside the command (a trainer called from Python) SIGINT is held the same way and then
    given to the handler it found: Python's ``KeyboardInterrupt``, a notebook's."""
    if signal.getsignal(signal.SIGINT) is not handler:
        with _held_sigint():
            yield
        return
    previous = STATE["deferred"]
    STATE["deferred"] = True
    try:
        yield
    finally:
        STATE["deferred"] = previous
    if not previous and STATE["signum"] is not None and not STATE["quiet"]:
        raise Interrupted(STATE["signum"])


@contextmanager
def _held_sigint():
    """SIGINT recorded while inside, then raised again (``signal.raise_signal``) for the handler found on
    entry, once it is back. Nothing off the main thread (only it gets signals) or when the handler found
    was not set from Python (it could not be put back)."""
    held: list[int] = []
    found = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not None:
        found = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        if found is not None:
            signal.signal(signal.SIGINT, found)
    if held:
        signal.raise_signal(signal.SIGINT)


def received() -> int | None:
    """The first signal received inside ``handlers()``, or None."""
    return STATE["signum"]


def exit_status() -> int:
    return 128 + int(STATE["signum"])


def quiet() -> None:
    """Signals are ignored from now on (the run's line is being printed, or it has ended)."""
    while True:  # a signal arriving in between raises again: retry until set
        try:
            STATE["quiet"] = True
            return
        except Interrupted:
            continue
