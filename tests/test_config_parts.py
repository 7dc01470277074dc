"""The typed parts of ``RLConfig`` that the phases take (``rlhfkit.config.part``): every part names
``RLConfig`` fields only — a part's fields are the user-facing names, so a renamed field fails here
in each part that reads it — and ``part`` copies their values, from the config or from a larger part."""

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.config import PRESETS, RLConfig, part

PACKAGE_DIR = Path(rlhfkit.__file__).parent
RL_FIELDS = {f.name for f in dataclasses.fields(RLConfig)}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_classes(package_dir: Path = PACKAGE_DIR) -> dict[str, type]:
    """Every class some module under ``package_dir`` hands to ``part(...)`` (by name or attribute,
    function-local imports too), and every dataclass it derives from: qualified name -> class."""
    sources = {module_name(p): p.read_text(encoding="utf-8") for p in sorted(package_dir.rglob("*.py"))}
    defined = {
        node.name: m
        for m, src in sources.items()
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.ClassDef)
    }
    found: dict[str, type] = {}
    for module, src in sources.items():
        for call in ast.walk(ast.parse(src)):
            if not (
                isinstance(call, ast.Call)
                and call.args
                and (getattr(call.func, "id", None) == "part" or getattr(call.func, "attr", None) == "part")
            ):
                continue
            expr = ast.unparse(call.args[0])
            try:
                cls = eval(expr, vars(importlib.import_module(module)))  # a name or attribute of the module
            except NameError:  # imported inside a function: the class of that name
                name = expr.rpartition(".")[2]
                cls = getattr(importlib.import_module(defined[name]), name)
            for klass in cls.__mro__:
                if dataclasses.is_dataclass(klass):
                    found[f"{klass.__module__}.{klass.__qualname__}"] = klass
    return found


PARTS = part_classes()


def test_the_phases_parts_are_found():
    """Through a name (``part(ModelLoading, args)``), an attribute (``part(update.MinibatchUpdate, ...)``)
    and the parts those derive from."""
    names = {cls.__name__ for cls in PARTS.values()}
    assert {
        "ExperienceMaking",
        "AdvantageEstimation",
        "RolloutCorrection",
        "UpdatePasses",
        "MinibatchUpdate",
        "UpdateLoss",
        "ModelLoading",
        "ModelSetup",
    } <= names, sorted(names)


@pytest.mark.parametrize("name", sorted(PARTS))
def test_every_part_is_a_frozen_dataclass_of_rlconfig_fields(name):
    cls = PARTS[name]
    assert cls.__dataclass_params__.frozen, f"{name} must be frozen: a config does not change at run time"
    unknown = sorted({f.name for f in dataclasses.fields(cls)} - RL_FIELDS)
    assert not unknown, f"{name} names fields RLConfig does not have: {unknown}"


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_part_copies_the_values_of_the_fields_it_names(algorithm):
    config = RLConfig(algorithm=algorithm, seed=7, micro_batch_size=2)
    for name, cls in PARTS.items():
        got = part(cls, config)
        assert all(getattr(got, f.name) == getattr(config, f.name) for f in dataclasses.fields(cls)), name
        # a part built from a larger part that derives from it: the same values
        for larger in PARTS.values():
            if larger is not cls and issubclass(larger, cls):
                assert part(cls, part(larger, config)) == got, (name, larger.__name__)
    passes = part(PARTS["rlhfkit.rl.experience.UpdatePasses"], config)
    assert passes.batch_size == config.batch_size


# The phases and everything below them read parts; only the config itself, the trainers, the command
# line, the TRL drop-ins and the ready-made tasks name RLConfig (they own a run's whole config).
WHOLE_CONFIG_READERS = (
    "rlhfkit.config",
    "rlhfkit.trainers",
    "rlhfkit.cli",
    "rlhfkit.trl",
    "rlhfkit.tasks",
    "rlhfkit.quickstart",
    "rlhfkit.jobs",
    "rlhfkit.run.callbacks",
    "rlhfkit.rl.build",  # the assembler of phases 1-3: it cuts the parts the Sampler, engine and agent take
)


def test_no_phase_takes_the_whole_rl_config():
    """A module of the loop's phases (rl/, rollout/, agents/, models/, rewards/, data/, run/) that
    imports RLConfig would be reading the whole config: refused, so phases keep taking parts."""
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = module_name(path)
        if module == "rlhfkit" or any(
            module == owner or module.startswith(owner + ".") for owner in WHOLE_CONFIG_READERS
        ):
            continue  # the package root's lazy names, and the owners of a run's whole config
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            if "RLConfig" in names:
                offenders.append(f"{module}:{node.lineno}")
    assert not offenders, f"import RLConfig (take a part instead): {offenders}"
