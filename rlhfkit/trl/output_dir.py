"""The drop-in trainers write into an existing ``output_dir``, as TRL 1.16 does (transformers 5 has no
``overwrite_output_dir``; TRL's ``Trainer`` writes its checkpoints, logs and model into the
directory whatever it holds), within rlhfkit's rule that nothing but its own run files is replaced
(``run/directory.py``: ``run_outputs``, the ``MARKER``):

- a directory an rlhfkit run wrote (it carries the marker): the earlier run's checkpoints, logs,
  plots and final model are replaced (``overwrite``), every other file is kept — one warning line
  names the directory and what is replaced;
- a directory of the user's own files holding none of rlhfkit's run files: the run writes beside
  them and removes none (it is marked as a run directory first) — one warning line;
- a directory without the marker holding files an rlhfkit run writes (a TRL run's
  ``checkpoint-500/``, the user's ``metrics.jsonl``): refused in one line, nothing touched — they
  are not rlhfkit's, and the run would replace them;
- ``resume_from_checkpoint``: rlhfkit's rules (a checkpoint inside ``output_dir`` continues its run).
"""

from __future__ import annotations

from pathlib import Path

from .. import distributed
from ..data.encode import warn_once
from ..run.directory import MARKER, mark_run_dir, run_outputs


def claim_output_dir(trainer: str, output_dir, resume_from) -> None:
    """Make ``output_dir`` ready for a drop-in run (the module docstring); ``trainer``: the class
    name its lines start with. Only the process of rank 0 writes or warns (one line on stderr)."""
    path = Path(output_dir) if output_dir else None
    if path is None or resume_from or not path.is_dir() or not any(path.iterdir()):
        return
    found = _names(path, [p for p in run_outputs(path) if p.exists() or p.is_symlink()])
    if (path / MARKER).is_file():
        if found:
            warn_once(
                f"{trainer}: output_dir {str(path)!r} holds an earlier run: its {found} are replaced, as "
                "TRL writes into an existing output_dir; its other files are kept"
            )
        return
    if found:
        raise ValueError(
            f"{trainer}: output_dir {str(path)!r} holds {found}, which an rlhfkit run writes, but no "
            f"{MARKER} marker: rlhfkit did not write them and will not replace them; choose another "
            "output_dir, or move them out"
        )
    if distributed.launch_rank() == 0:  # the process that writes the run directory
        mark_run_dir(path)
    warn_once(
        f"{trainer}: output_dir {str(path)!r} holds files rlhfkit did not write: the run writes beside them, "
        "as TRL does, and removes none"
    )


def _names(root: Path, paths: list[Path], most: int = 8) -> str:
    """The top-level entries of ``root`` that ``paths`` lie in, as ``checkpoint-2/, metrics.jsonl``."""
    tops = sorted(
        {p.relative_to(root).parts[0] + ("/" if (root / p.relative_to(root).parts[0]).is_dir() else "") for p in paths}
    )
    more = f" and {len(tops) - most} more" if len(tops) > most else ""
    return ", ".join(tops[:most]) + more
