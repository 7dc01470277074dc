"""The typed parts of ``RLConfig`` that the phases take (``rlhfkit.config.part``): every part names
``RLConfig`` fields only — a part's fields are the user-facing names, so a renamed field fails here
in each part that reads it — and ``part`` copies their values, from the config or from a larger part.
Each field is declared once: in one of ``RLConfig``'s concerns; a part takes it by name
(``config.takes``) with the config's type, default and doc."""

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.agents import AgentOptions
from rlhfkit.config import PRESETS, HFOptions, RLConfig, VLLMOptions, field_docs, part, takes
from rlhfkit.rollout import SamplingParams

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


# ---- declared once: a part names the fields it takes; their type, default and doc are the config's ----

# The parts not built by ``part`` (the engines' sampling parameters, the agent's options) take fields too.
TAKERS = {
    **PARTS,
    "rlhfkit.rollout.base.SamplingParams": SamplingParams,
    "rlhfkit.agents.episode.AgentOptions": AgentOptions,
}
DECLARED = {f.name: f for f in dataclasses.fields(RLConfig)}
DOCS = field_docs(RLConfig)


@pytest.mark.parametrize("name", sorted(TAKERS))
def test_a_parts_fields_have_the_configs_type_default_and_doc(name):
    cls = TAKERS[name]
    docs = field_docs(cls)
    taken = [f for f in dataclasses.fields(cls) if f.name in DECLARED]
    assert taken, name
    for f in taken:
        config = DECLARED[f.name]
        assert f.metadata.get("config_field"), f"{name}.{f.name} is declared in the part, not taken from RLConfig"
        assert (f.type, f.default, f.default_factory) == (config.type, config.default, config.default_factory), f.name
        assert docs[f.name] == DOCS[f.name] != "", f.name


def test_every_rlconfig_field_is_declared_in_exactly_one_of_its_concerns():
    concerns = [k for k in RLConfig.__mro__ if dataclasses.is_dataclass(k) and k is not RLConfig]
    for f in dataclasses.fields(RLConfig):
        owners = [k.__name__ for k in concerns if f.name in inspect.get_annotations(k)]
        assert len(owners) == 1, f"{f.name} is declared in {owners}"
    assert not inspect.get_annotations(RLConfig), "RLConfig joins its concerns and declares no field itself"


def test_no_class_of_the_phases_declares_a_config_field_itself():
    """The layers that take parts (rl/, rollout/, models/, agents/) annotate no RLConfig field in any
    class body: a field they read is named in ``takes(...)``, so it is declared once, in config/."""
    offenders = []
    for layer in ("rl", "rollout", "models", "agents"):
        for path in sorted((PACKAGE_DIR / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    offenders += [
                        f"{module_name(path)}.{node.name}.{s.target.id}"
                        for s in node.body
                        if isinstance(s, ast.AnnAssign) and getattr(s.target, "id", None) in DECLARED
                    ]
    assert not offenders, f"re-declared RLConfig fields (name them in takes(...)): {offenders}"


def test_an_engine_group_stands_for_its_fields_and_stays_flat_in_rlconfig():
    """HF's options are a group of EngineConfig; vLLM's are its registry entry's options (the engine
    reads them, EngineConfig does not); both stay flat, TRL-style fields of RLConfig."""
    from rlhfkit.config.engines import engine_entry, engine_options
    from rlhfkit.rollout.engines import EngineConfig

    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    hf = [f.name for f in dataclasses.fields(HFOptions)]
    assert set(hf) <= engine_fields and set(hf) <= set(DECLARED)
    vllm = [f.name for f in dataclasses.fields(VLLMOptions)]
    assert set(vllm) == {n for n in DECLARED if n.startswith("vllm_")} and not set(vllm) & engine_fields
    assert engine_entry("vllm").options == tuple(vllm)
    config = RLConfig(vllm_sleep=True, vllm_gpu_memory_utilization=0.5)  # the user's flat, TRL-style names
    options = engine_options("vllm", config)
    assert options["vllm_sleep"] is True and options["vllm_gpu_memory_utilization"] == 0.5


def test_takes_refuses_an_unknown_a_repeated_and_a_redeclared_field():
    with pytest.raises(TypeError, match=r"Broken: takes\('kl_cof'\) names no RLConfig field.*kl_coef"):
        takes("kl_cof")(type("Broken", (), {}))
    with pytest.raises(TypeError, match=r"takes\('seed'\) twice"):
        takes("seed", "seed")(type("Twice", (), {}))
    base = takes("seed")(type("Base", (), {}))
    with pytest.raises(TypeError, match=r"takes\('seed'\) twice \(or a base part already holds it\)"):
        takes("seed")(type("Again", (base,), {}))
    with pytest.raises(TypeError, match=r"Redeclared re-declares RLConfig fields \['kl_coef'\]"):
        takes("seed")(type("Redeclared", (), {"__annotations__": {"kl_coef": "float"}}))


def test_a_part_may_add_fields_of_its_own_after_the_configs():
    made = takes("top_k")(type("Sampling", (), {"__annotations__": {"greedy": "bool"}, "greedy": False}))
    assert [f.name for f in dataclasses.fields(made)] == ["top_k", "greedy"]
    assert made.__dataclass_params__.frozen
    assert part(made, RLConfig(top_k=5)) == made(top_k=5, greedy=False)
