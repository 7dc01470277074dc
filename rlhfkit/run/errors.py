"""How the ``rlhfkit`` command ends on bad input or a failure it can name (a ``ValueError`` or an
``OSError``): one line on stderr, ``rlhfkit <command>: error: ...``, and exit status 2.

- ``--traceback`` (every command) or ``RLHFKIT_TRACEBACK=1`` prints the full traceback first (the
  user's exception too, when rlhfkit's one line was raised from it), then the same line.
- A reward function that raised ends the line with where, in the user's own file
  (``rewards.calling.where_user_code_raised``): ``(my_rewards.py:12 in score)``.
- Under torchrun the error is said once: raised before the processes joined (every rank raises it),
  rank 0 prints it and the other ranks wait ``RLHFKIT_ERROR_GRACE_S`` seconds for torchrun to stop
  them; raised after (possibly on one rank alone), the failing rank prints it with ``[rank N]``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

TRACEBACK_ENV = "RLHFKIT_TRACEBACK"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
ERROR_GRACE_S = float(os.environ.get("RLHFKIT_ERROR_GRACE_S", "10"))
"""How long a rank other than 0 waits before exiting on an error found before the processes joined:
rank 0, which found it too, prints it and exits, and torchrun then stops this rank. Only if this
rank is still running after that (rank 0 did not fail) does it print the error itself."""


def traceback_wanted(flag: bool) -> bool:
    """Whether a one-line error is preceded by its traceback: ``--traceback`` given, or
    ``RLHFKIT_TRACEBACK`` on; a value of it that is neither on nor off is refused."""
    value = os.environ.get(TRACEBACK_ENV, "").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(
            f"{TRACEBACK_ENV} must be 1 or 0 (also true/false, yes/no, on/off), got {os.environ[TRACEBACK_ENV]!r}"
        )
    return bool(flag) or value in _ON


def report_error(command: str, err: BaseException, show_traceback: bool) -> int:
    """Print ``err`` as the command's one line (after its traceback when ``show_traceback``), on
    the rank that should say it; the exit status, 2."""
    from .. import distributed

    line = str(err)
    if isinstance(err, OSError) and not isinstance(err, ValueError):  # its path named
        where = err.filename or ""
        line = f"{where}: {err.strerror or err}" if where else (err.strerror or str(err))
    if distributed.joined():  # raised after the processes joined: possibly on this rank alone
        _say(command, f"[rank {distributed.global_rank()}] {line}", err, show_traceback)
    elif distributed.launch_rank() == 0:  # before: every rank raised it, rank 0 says it
        _say(command, line, err, show_traceback)
    else:  # torchrun stops every rank when one exits: leave rank 0 the time to say it first
        time.sleep(ERROR_GRACE_S)
        _say(command, f"[rank {distributed.launch_rank()}] {line}", err, show_traceback)
    return 2


def _say(command: str, line: str, err: BaseException, show_traceback: bool) -> None:
    """One write, so that two ranks failing at once do not interleave their lines."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__)) if show_traceback else ""
    try:
        sys.stderr.write(f"{text}rlhfkit {command}: error: {line}\n")
        sys.stderr.flush()
    except OSError:  # stderr gone (the terminal closed, the command that read it killed)
        pass
