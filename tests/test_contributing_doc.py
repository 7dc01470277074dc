"""The contributing guide names real files: every path it writes in backticks (``rlhfkit/...``, ``tests/...``,
``benchmarks/...``, ``docs/...``, optionally ``:Name`` after a Python file) exists, and the name after the colon is
defined in that file. A guide that lists a file the code no longer has (or a trainer section that lists four files
when a trainer touches nine, issue 53) is caught here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "contributing.md"
PATH = re.compile(r"`((?:rlhfkit|tests|benchmarks|docs|recipes|tools)/[\w./-]+)(?::(\w+))?`")


def references(text: str) -> list[tuple[str, str | None]]:
    """``(path, name or None)`` for each backticked repository path of ``text``."""
    return [(m[1], m[2]) for m in PATH.finditer(text)]


def test_the_guide_names_many_files():
    assert len(references(GUIDE.read_text())) >= 20


def test_every_file_the_contributing_guide_names_exists_with_the_name_it_gives():
    missing = []
    for path, name in references(GUIDE.read_text()):
        target = ROOT / path.rstrip("/")
        if not target.exists():
            missing.append(path)
        elif name and not re.search(rf"^\s*(class|def)\s+{name}\b|^{name}\s*[:=]", target.read_text(), re.M):
            missing.append(f"{path}:{name}")
    assert not missing, f"docs/guides/contributing.md names what does not exist: {missing}"
