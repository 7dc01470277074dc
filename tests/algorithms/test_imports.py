"""The algorithm core imports torch, the standard library and itself only (docs/architecture.md, "Layers": "pure tensor
math; imports torch and the standard library only")."""

import ast
import sys
from pathlib import Path

import pytest

import rlhfkit.algorithms

ALGORITHMS_DIR = Path(rlhfkit.algorithms.__file__).parent
FILES = sorted(ALGORITHMS_DIR.glob("*.py"))
ALLOWED_THIRD_PARTY = {"torch"}


def _imported_top_levels(tree):
    """(top-level module, line) for every absolute import; relative imports are skipped."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module.split(".")[0], node.lineno
            elif node.level > 1:
                # ``from .. import x`` would reach outside the algorithms package
                yield "<relative import above rlhfkit.algorithms>", node.lineno


def test_there_are_files_to_check():
    names = {f.name for f in FILES}
    assert {"advantages.py", "kl.py", "losses.py", "logprobs.py", "shaping.py", "registry.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_imports_are_torch_stdlib_or_relative(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = [
        f"{path.name}:{line}: {mod}"
        for mod, line in _imported_top_levels(tree)
        if mod not in ALLOWED_THIRD_PARTY and mod not in sys.stdlib_module_names
    ]
    assert not bad, "algorithms/ may import only torch, the standard library and itself: " + ", ".join(bad)


def test_checker_catches_forbidden_imports():
    tree = ast.parse(
        "import numpy as np\nfrom rlhfkit.models import x\nfrom ..models import y\nimport os.path\nfrom . import kl\n"
    )
    mods = [m for m, _ in _imported_top_levels(tree)]
    assert mods == ["numpy", "rlhfkit", "<relative import above rlhfkit.algorithms>", "os"]
    assert [m for m in mods if m not in ALLOWED_THIRD_PARTY and m not in sys.stdlib_module_names] == mods[:3]
