"""docs/architecture.md tells the truth about the code: its layer table is ``tests/test_layering.py``'s
``LAYERS`` (same entries, same layers) and names every package and top-level module of rlhfkit; every
``path/file.py`` it names exists, and every ``path/file.py:name`` names a function, class, method or
constant defined there — on this page and on every other page of docs/."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import rlhfkit

PACKAGE_DIR = Path(rlhfkit.__file__).parent
ROOT = PACKAGE_DIR.parent
DOC = ROOT / "docs" / "architecture.md"


def layering_table() -> dict[str, int]:
    """``LAYERS`` of tests/test_layering.py (the import rule's table)."""
    spec = importlib.util.spec_from_file_location("layering", Path(__file__).parent / "test_layering.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LAYERS


def doc_layers(text: str) -> dict[str, int]:
    """The ``## Layers`` table of the architecture doc: every dotted ``rlhfkit...`` name of the
    entries column -> the row's layer."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        for name in re.findall(r"`(rlhfkit(?:\.[A-Za-z_]+)*)`", cells[1]):
            if name in layers:
                raise AssertionError(f"docs/architecture.md: {name} is in two rows of the layer table")
            layers[name] = int(cells[0])
    return layers


def test_the_layer_table_is_the_layering_tests_table():
    doc, code = doc_layers(DOC.read_text(encoding="utf-8")), layering_table()
    missing = sorted(set(code) - set(doc))
    extra = sorted(set(doc) - set(code))
    moved = sorted(f"{n}: doc {doc[n]}, LAYERS {code[n]}" for n in set(doc) & set(code) if doc[n] != code[n])
    assert not (missing or extra or moved), (
        f"layer table of docs/architecture.md: missing {missing}, not in LAYERS {extra}, other layer {moved}"
    )


def test_the_layer_table_names_every_package_and_top_level_module():
    doc = doc_layers(DOC.read_text(encoding="utf-8"))
    units = {f"rlhfkit.{p.name}" for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").exists()}
    units |= {f"rlhfkit.{p.stem}" for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__"}
    assert sorted(units - set(doc)) == [], "packages / modules missing from docs/architecture.md's layer table"
    for name in doc:  # and every entry exists
        path = ROOT / name.replace(".", "/")
        assert name == "rlhfkit" or path.is_dir() or path.with_suffix(".py").exists(), f"{name} does not exist"


def defined_names(path: Path) -> set[str]:
    """Top-level functions, classes and assigned names of a module, and ``Class.method`` for methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {
                    f"{node.name}.{m.name}" for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
                names |= {
                    f"{node.name}.{t.id}"
                    for m in node.body
                    if isinstance(m, ast.AnnAssign)
                    for t in [m.target]
                    if isinstance(t, ast.Name)
                }
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def file_references(text: str) -> list[tuple[str, str]]:
    """Every ``dir/file.py`` or ``dir/file.py:name`` in backticks: (path, name or "")."""
    return re.findall(r"`((?:[A-Za-z0-9_]+/)+[A-Za-z0-9_]+\.py)(?::([A-Za-z_][A-Za-z0-9_.]*))?`", text)


DOCS = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_and_name_the_doc_points_at_exists(doc):
    problems = []
    for rel, name in sorted(set(file_references((ROOT / "docs" / doc).read_text(encoding="utf-8")))):
        path = next((p for p in (PACKAGE_DIR / rel, ROOT / rel) if p.exists()), None)
        if path is None:
            problems.append(f"{rel}: no such file")
        elif name and name not in defined_names(path):
            problems.append(f"{rel}:{name}: not defined there")
    assert not problems, f"docs/{doc} points at what does not exist:\n" + "\n".join(problems)


def test_the_checks_catch_what_they_claim():
    """The parsers see a table row, a missing name and a stale reference."""
    table = "## Layers\n\n| layer | entries | what |\n|---|---|---|\n| 3 | `rlhfkit.rollout`, `rlhfkit.x` | y |\n"
    assert doc_layers(table) == {"rlhfkit.rollout": 3, "rlhfkit.x": 3}
    assert file_references("see `rl/update.py:update` and `agents/tools.py`") == [
        ("rl/update.py", "update"),
        ("agents/tools.py", ""),
    ]
    assert "loss" in defined_names(PACKAGE_DIR / "rl" / "update.py") or "update" in defined_names(
        PACKAGE_DIR / "rl" / "update.py"
    )


def test_every_package_has_an_api_reference_page_in_the_site():
    """docs/api/<package>.md exists, renders the package or its modules (``::: rlhfkit.<package>[.module]``)
    and is in mkdocs.yml's nav."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    problems = []
    for package in sorted(p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").exists()):
        page = ROOT / "docs" / "api" / f"{package}.md"
        if not page.exists() or not re.search(
            rf"^::: rlhfkit\.{package}(\.|$)", page.read_text(encoding="utf-8"), re.M
        ):
            problems.append(f"docs/api/{package}.md: missing, or does not render rlhfkit.{package}")
        elif f"api/{package}.md" not in nav:
            problems.append(f"mkdocs.yml: api/{package}.md is not in the nav")
    assert not problems, "\n".join(problems)
