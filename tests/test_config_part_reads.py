"""A phase reads only the fields its part takes, checked statically: for the type checker a part is the whole
``RLConfig`` (``config/parts.py``: ``ConfigFields``), so a field a part forgot to take would otherwise fail only at
run time, on the first test that reaches the line. Every ``args.<name>`` read of a parameter annotated with a part
(``def update(models, args: MinibatchUpdate, ...)``), and every ``self.<attr>.<name>`` read of an attribute a
constructor set from one (``self.args = args``), must name a field of that part, or one of its methods or
properties."""

import ast
import dataclasses

from .test_config_parts import PACKAGE_DIR, PARTS, module_name


def _annotation_name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "MinibatchUpdate" (postponed)
        return node.value.rpartition(".")[2]
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # update.MinibatchUpdate
        return node.attr
    return None


def _reads(body: ast.AST, name: str) -> set[str]:
    """The attributes read of the variable ``name`` anywhere in ``body``."""
    return {
        node.attr
        for node in ast.walk(body)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name
    }


def _self_reads(cls: ast.ClassDef, attribute: str) -> set[str]:
    """The attributes read of ``self.<attribute>`` in the methods of ``cls``."""
    return {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == attribute
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }


def part_reads(source: str, parts: dict[str, type]) -> list[tuple[str, type, set[str]]]:
    """``(where, part, attributes read)`` for every parameter of a function annotated with one of ``parts``
    (simple name -> class), and every ``self.<attr>`` a constructor sets from such a parameter."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for arg in node.args.args + node.args.kwonlyargs:
            cls = parts.get(_annotation_name(arg.annotation) or "")
            if cls is not None:
                found.append((f"{node.name}({arg.arg})", cls, _reads(node, arg.arg)))
    for klass in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for init in (n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
            typed = {a.arg: parts[n] for a in init.args.args if (n := _annotation_name(a.annotation)) in parts}
            for stmt in ast.walk(init):
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id in typed:
                    for target in stmt.targets:
                        if isinstance(target, ast.Attribute) and getattr(target.value, "id", None) == "self":
                            cls = typed[stmt.value.id]
                            found.append((f"{klass.name}.self.{target.attr}", cls, _self_reads(klass, target.attr)))
    return found


def unknown_reads(cls: type, attributes: set[str]) -> list[str]:
    """The attributes of ``attributes`` that are neither a field of the part ``cls`` nor one of its methods."""
    fields = {f.name for f in dataclasses.fields(cls)}
    return sorted(a for a in attributes if a not in fields and not hasattr(cls, a))


def _by_name() -> dict[str, type]:
    return {cls.__name__: cls for cls in PARTS.values()}


def test_every_read_of_a_part_names_a_field_it_takes():
    parts, problems, checked = _by_name(), [], 0
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for where, cls, attributes in part_reads(path.read_text(encoding="utf-8"), parts):
            checked += len(attributes)
            for name in unknown_reads(cls, attributes):
                problems.append(f"{module_name(path)}:{where} reads {name!r}, which {cls.__name__} does not take")
    assert checked > 50  # the phases' reads are seen (update, experience, the sampler, the engines, ...)
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_read_the_part_does_not_take():
    parts = _by_name()
    source = (
        "def step(models, args: 'MinibatchUpdate'):\n"
        "    return args.num_iterations + args.vllm_sleep\n\n"
        "class Holder:\n"
        "    def __init__(self, args: ModelSetup):\n"
        "        self.args = args\n\n"
        "    def mode(self):\n"
        "        return self.args.lm_head, self.args.rollout_engine\n"
    )
    found = {where: unknown_reads(cls, attributes) for where, cls, attributes in part_reads(source, parts)}
    assert found == {"step(args)": ["vllm_sleep"], "__init__(args)": [], "Holder.self.args": ["rollout_engine"]}
