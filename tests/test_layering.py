"""Dependencies point downward only (docs/architecture.md, "Layers"). Every import between rlhfkit's modules —
function-local ones included: they are import edges too, only later — goes to a lower layer of
``LAYERS``, or to the same layer without closing a circle; no modules import each other around a
circle, and neither do the table's entries (packages). And no module reaches into another's
private names (``_name``): what two modules share is public and documented."""

import ast
from pathlib import Path

import rlhfkit

PACKAGE_DIR = Path(rlhfkit.__file__).parent

# The layers, bottom to top. A module's layer is its own entry, else that of the nearest package
# above it with one (the root "rlhfkit" is its __init__ only). A module imports lower layers, or
# its own without a cycle; never a higher one.
LAYERS = {
    # 0 — pure tensor math: torch and the standard library only (tests/algorithms/test_imports.py);
    #     the package root: __version__, and the top-level names loaded lazily (importlib, no import)
    "rlhfkit.algorithms": 0,
    "rlhfkit": 0,
    # 1 — foundations: every config and job dataclass (RL, supervised, the command line's jobs), their
    #     checks and YAML files; atomic file writes; the process group
    "rlhfkit.config": 1,
    "rlhfkit.files": 1,
    "rlhfkit.distributed": 1,
    # 2 — models: sources (directories, GGUF, the Hub), loading, policy forward, scalar heads, LoRA
    "rlhfkit.models": 2,
    # 3 — what a run consumes: datasets (Hub ids through models.sources), reward sources, generation engines
    "rlhfkit.data": 3,
    "rlhfkit.rewards": 3,
    "rlhfkit.rollout": 3,
    # 4 — built on those, used by the run and the command line: the plots and HTML report of a run
    #     directory; the embedded demo tasks (data, oracle rewards, tiny models)
    "rlhfkit.report": 4,
    "rlhfkit.tasks": 4,
    "rlhfkit.tasks.calculator_demo": 7,
    #     agents: multi-turn episodes with tools and environments on a rollout engine
    "rlhfkit.agents": 4,
    #     the OpenAI-compatible endpoint on a rollout engine, recording episodes as agents' rows
    "rlhfkit.endpoint": 4,
    # 5 — the run lifecycle: directory and record, optimizer step, checkpoints, metrics, trackers;
    #     beside it, the RL loop's phases as functions (score, experience, update, evaluate), without the run
    "rlhfkit.run": 5,
    "rlhfkit.rl": 5,
    # 6 — the trainers: SFT, reward model, DPO, the one RL loop
    "rlhfkit.trainers": 6,
    # 7 — on top: the command line and its jobs, the quickstart, the toy task's ready-made RLTrainer
    "rlhfkit.cli": 7,
    "rlhfkit.commands": 7,
    "rlhfkit.trl": 7,
    "rlhfkit.__main__": 7,
    "rlhfkit.jobs": 7,
    "rlhfkit.quickstart": 7,
    "rlhfkit.tasks.toy": 7,
    "rlhfkit.serving": 7,
}


# ---------------------------------------------------------------- the checker
def package_sources(package_dir: Path) -> dict[str, tuple[str, bool]]:
    """Module name -> (source, is a package) for every .py file under ``package_dir``."""
    sources = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        sources[".".join(parts[:-1] if is_package else parts)] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def imported_modules(module: str, source: str, is_package: bool, modules) -> dict[str, int]:
    """The modules of ``modules`` that ``module`` imports -> the first line that does, from every
    import statement anywhere in it (function bodies too). ``from P import name``: the submodule
    ``P.name`` when there is one, else ``P``; a name not in ``modules``: its nearest parent that is."""
    root = module.split(".")[0]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.setdefault(name, line)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root:
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = import_base(module, is_package, node)
            if base.split(".")[0] != root:
                continue
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base, node.lineno)
    return found


def import_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from ... import`` statement of ``module`` imports from."""
    if not node.level:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))


def is_private(name: str) -> bool:
    """``_name``, but not a dunder (``__version__``)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(module: str, source: str, is_package: bool, modules) -> list[str]:
    """One line per place ``module`` reaches a private name of another module of ``modules``:
    ``from M import _name`` (``_name`` not a module), ``m._name`` where ``m`` is a module it
    imported, or a private module (``pkg._impl``) imported from outside the package that holds it
    (inside, a private module is the package's own business)."""
    root = module.split(".")[0]
    bad: list[str] = []
    bound: dict[str, str] = {}  # local name -> the module it is bound to

    def outside(target: str) -> bool:
        parts = target.split(".")
        for i, part in enumerate(parts):
            holder = ".".join(parts[:i])
            if is_private(part) and not (module == holder or module.startswith(holder + ".")):
                return True
        return False

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        inner = dotted(node.value) if isinstance(node, ast.Attribute) else None
        return f"{inner}.{node.attr}" if inner else None

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = import_base(module, is_package, node)
            if base.split(".")[0] != root:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
                if outside(full if full in modules else base) or (full not in modules and is_private(alias.name)):
                    bad.append(f"{module}:{node.lineno} imports {full}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root:
                    bound[alias.asname or root] = alias.name if alias.asname else root
                    if outside(alias.name):
                        bad.append(f"{module}:{node.lineno} imports {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = dotted(node.value)
            if owner in modules and owner != module:
                bad.append(f"{module}:{node.lineno} uses {owner}.{node.attr}")
    return bad


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """Module -> {imported module: line} for every module of ``sources``."""
    return {m: imported_modules(m, src, is_package, sources) for m, (src, is_package) in sources.items()}


def find_cycle(graph: dict[str, dict]) -> list[str] | None:
    """A circle of imports ``[a, b, ..., a]``, or None when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_entry(module: str, layers: dict) -> str | None:
    """The entry of ``layers`` that places ``module``: its own, else its nearest package's (the
    root package's entry places the root alone); None when it has none."""
    root = module.split(".")[0]
    name = module
    while name:
        if name in layers and (name == module or name != root):
            return name
        name = name.rpartition(".")[0]
    return None


def upward_imports(graph: dict[str, dict[str, int]], layers: dict) -> list[str]:
    """One line per import that points to a higher layer."""
    bad = []
    for module, targets in sorted(graph.items()):
        for target, line in sorted(targets.items()):
            here, there = layers[layer_entry(module, layers)], layers[layer_entry(target, layers)]
            if there > here:
                bad.append(f"{module}:{line} imports {target} (layer {there} above {here})")
    return bad


def entry_graph(graph: dict[str, dict[str, int]], layers: dict) -> dict[str, set[str]]:
    """The import graph between the table's entries (a package and its modules: one node)."""
    collapsed: dict[str, set[str]] = {}
    for module, targets in graph.items():
        entry = layer_entry(module, layers)
        collapsed.setdefault(entry, set()).update(layer_entry(t, layers) for t in targets)
        collapsed[entry].discard(entry)
    return collapsed


# ---------------------------------------------------------------- the package
GRAPH = import_graph(package_sources(PACKAGE_DIR))


def test_the_graph_sees_function_local_imports():
    assert set(GRAPH) >= {"rlhfkit", "rlhfkit.cli", "rlhfkit.run.directory", "rlhfkit.trainers.rl"}
    # run/directory.py imports both inside functions only
    assert {"rlhfkit.report", "rlhfkit.models.sources", "rlhfkit"} <= set(GRAPH["rlhfkit.run.directory"])


def test_every_module_has_a_layer():
    missing = [m for m in sorted(GRAPH) if layer_entry(m, LAYERS) is None]
    assert not missing, f"modules without a layer (add them to LAYERS in {__file__}): {missing}"
    unused = [entry for entry in LAYERS if entry not in GRAPH and not any(m.startswith(entry + ".") for m in GRAPH)]
    assert not unused, f"LAYERS entries that name no module: {unused}"


def test_no_import_cycle_between_modules():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages():
    cycle = find_cycle(entry_graph(GRAPH, LAYERS))
    assert cycle is None, "import cycle between LAYERS entries: " + " -> ".join(cycle)


def test_every_import_points_downward():
    bad = upward_imports(GRAPH, LAYERS)
    assert not bad, "upward imports (move the code to the right layer):\n" + "\n".join(bad)


def test_no_module_uses_another_modules_private_names():
    sources = package_sources(PACKAGE_DIR)
    bad = [
        line for m, (src, is_package) in sorted(sources.items()) for line in private_uses(m, src, is_package, sources)
    ]
    assert not bad, (
        "private names used across modules (make the name public, with a docstring, or move the code "
        "where it belongs):\n" + "\n".join(bad)
    )


PROCESS_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def process_env_reads(module: str, source: str) -> list[str]:
    """One line per place ``module`` names torchrun's process variables (``PROCESS_ENV``) — the
    process count and ranks, which ``rlhfkit.distributed`` alone reads (docs/architecture.md)."""
    return [
        f"{module}:{node.lineno} reads {node.value}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value in PROCESS_ENV
    ]


def test_only_distributed_reads_the_process_count_and_ranks():
    sources = package_sources(PACKAGE_DIR)
    bad = [
        line
        for m, (src, _) in sorted(sources.items())
        if m != "rlhfkit.distributed"
        for line in process_env_reads(m, src)
    ]
    assert not bad, "process count / rank read outside rlhfkit.distributed (ask distributed):\n" + "\n".join(bad)
    assert process_env_reads("m", 'import os\nr = int(os.environ.get("RANK", "0"))\n') == ["m:2 reads RANK"]


# ---------------------------------------------------------------- the checker itself
SYNTHETIC = {
    "pkg": ("", True),
    "pkg.low": ("import os\nfrom typing import Any\n", False),
    "pkg.sub": ("from . import leaf\n", True),
    "pkg.sub.leaf": ("from ..low import x\nfrom .. import low\n", False),
    "pkg.sub.other": (
        "def f():\n    from .leaf import y\n    import pkg.low.nothing\n    from pkg import __version__\n",
        False,
    ),
    "pkg.top": ("import pkg.sub.leaf as leaf\nfrom pkg.sub import other, missing_name\n", False),
}


def test_checker_resolves_relative_absolute_and_function_local_imports():
    graph = import_graph(SYNTHETIC)
    assert graph["pkg.low"] == {}  # the standard library is not ours
    assert graph["pkg.sub"] == {"pkg.sub.leaf": 1}
    assert graph["pkg.sub.leaf"] == {"pkg.low": 1}
    assert graph["pkg.sub.other"] == {"pkg.sub.leaf": 2, "pkg.low": 3, "pkg": 4}
    assert graph["pkg.top"] == {"pkg.sub.leaf": 1, "pkg.sub.other": 2, "pkg.sub": 2}


def test_checker_finds_cycles_and_upward_imports():
    layers = {"pkg": 0, "pkg.low": 0, "pkg.sub": 1, "pkg.top": 2}
    graph = import_graph(SYNTHETIC)
    assert find_cycle(graph) is None and upward_imports(graph, layers) == []
    assert layer_entry("pkg.sub.leaf", layers) == "pkg.sub" and layer_entry("pkg.other", layers) is None

    upward = {**SYNTHETIC, "pkg.low": ("def f():\n    from .top import z\n", False)}
    graph = import_graph(upward)
    assert upward_imports(graph, layers) == ["pkg.low:2 imports pkg.top (layer 2 above 0)"]
    assert find_cycle(graph) == ["pkg.low", "pkg.top", "pkg.sub", "pkg.sub.leaf", "pkg.low"]

    same_layer = {**SYNTHETIC, "pkg.sub.leaf": ("from .other import f\n", False)}
    graph = import_graph(same_layer)
    assert upward_imports(graph, layers) == []  # one layer: allowed, but ...
    assert find_cycle(graph) == ["pkg.sub.leaf", "pkg.sub.other", "pkg.sub.leaf"]  # ... not around a circle

    across = {
        **SYNTHETIC,
        "pkg.x": ("from .y import a\n", False),
        "pkg.y": ("", True),
        "pkg.y.b": ("from ..x import c\n", False),
    }
    graph = import_graph(across)
    assert find_cycle(graph) is None  # no module circle: pkg.x -> pkg.y, pkg.y.b -> pkg.x
    assert find_cycle(entry_graph(graph, {**layers, "pkg.x": 1, "pkg.y": 1})) == ["pkg.x", "pkg.y", "pkg.x"]


def test_checker_finds_private_names_used_across_modules():
    sources = {
        **SYNTHETIC,
        "pkg.sub._impl": ("x = 1\n", False),
        "pkg.sub.leaf": ("from ._impl import x\nfrom . import _impl\n", False),  # its package's own: fine
        "pkg.low": ("from .sub.other import _helper, public\nfrom . import __version__\n", False),
        "pkg.top": (
            "import pkg.sub.other as other\nfrom pkg.sub import _impl\nfrom .sub import leaf\n"
            "def f():\n    return other._cache, leaf._x, leaf.public, other.__name__\n",
            False,
        ),
        "pkg.sub.other": ("import pkg.low\n_cache = {}\nprint(_cache, pkg.low._secret)\n", False),
    }
    found = {m: private_uses(m, src, is_package, sources) for m, (src, is_package) in sources.items()}
    assert found["pkg.sub.leaf"] == [] and found["pkg.sub"] == []
    assert found["pkg.low"] == ["pkg.low:1 imports pkg.sub.other._helper"]
    assert found["pkg.top"] == [
        "pkg.top:2 imports pkg.sub._impl",
        "pkg.top:5 uses pkg.sub.other._cache",
        "pkg.top:5 uses pkg.sub.leaf._x",
    ]
    assert found["pkg.sub.other"] == ["pkg.sub.other:3 uses pkg.low._secret"]
