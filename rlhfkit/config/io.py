"""Config files and help text, generic over any frozen dataclass config: the docstring under each
field as ``--help`` text, YAML files plus ``key=value`` overrides with one-line errors (unknown keys
with close matches, or rlhfkit's name for a TRL field name: ``trl_names.py``; wrong types, YAML
syntax with file and line), and the resolved config saved back as YAML."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import yaml


def field_docs(cls) -> dict[str, str]:
    """Field name -> the docstring right under the field, read from the source of every dataclass in
    ``cls.__mro__`` (a subclass's docstring wins), or for a field a part takes from ``RLConfig``
    (``parts.takes``) the config's, from ``field.metadata["doc"]``; ``""`` for an undocumented field.
    The source's line breaks are undone: a doc is paragraphs (split by blank lines) of one line each."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass):
            docs.update(_class_field_docs(klass))
    return {f.name: docs.get(f.name) or f.metadata.get("doc", "") for f in dataclasses.fields(cls)}


def _reflow(doc: str) -> str:
    """``doc`` with the line breaks inside each paragraph (blank-line separated) turned into spaces."""
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", doc.strip()))
    return "\n\n".join(p for p in paragraphs if p)


@functools.cache
def _module_classes(filename: str, mtime_ns: int) -> dict[str, ast.ClassDef]:
    """The top-level class statements of a source file, parsed once per version of the file."""
    tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _class_node(klass) -> ast.ClassDef | None:
    """The class statement of ``klass``: a module-level class from its file, parsed once for all its
    classes (``inspect.getsource`` parses the file again for each class), any other through
    ``inspect.getsource``; None without source (built in a REPL, or from a .pyc only)."""
    try:
        if "." not in klass.__qualname__:
            filename = inspect.getsourcefile(klass)
            if filename and Path(filename).is_file():
                node = _module_classes(filename, Path(filename).stat().st_mtime_ns).get(klass.__name__)
                if node is not None:
                    return node
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return None
    return next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))


def _class_field_docs(klass) -> dict[str, str]:
    node = _class_node(klass)
    if node is None:
        return {}
    docs = {}
    for stmt, nxt in zip(node.body, node.body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = _reflow(inspect.cleandoc(nxt.value.value))
    return docs


def _defining_class(cls, name: str):
    return next(k for k in cls.__mro__ if name in inspect.get_annotations(k))


_WRAP: dict[str, Any] = dict(break_on_hyphens=False)  # never 'seq-mean-token-sum-' / 'norm': a value's name stays whole


def help_title(klass) -> str:
    """The ``--help`` heading of the fields a class declares: its name without ``Config`` or ``Base``
    (``OptimBase`` and ``OptimConfig`` are one group, "Optim"); an engine's ``...Options`` group reads
    "VLLM options"."""
    name = klass.__name__
    if name.endswith("Options") and name != "Options":
        return name.removesuffix("Options") + " options"
    return name.removesuffix("Config").removesuffix("Base") or name


def format_help(cls, width: int = 100) -> str:
    """Every field with its type, default and docstring, grouped by the class that defines it; each
    paragraph of a doc is re-flowed to ``width`` columns (indent included). A field the TRL drop-in
    renames ends with its TRL names (``trl_names.py``)."""
    from .trl_names import trl_names_of

    docs = field_docs(cls)
    trl = trl_names_of({f.name for f in dataclasses.fields(cls) if f.init})
    groups: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        title = help_title(_defining_class(cls, f.name))
        if f.metadata.get("preset"):
            default = "default: the algorithm's preset"
        elif f.default is not dataclasses.MISSING:
            default = f"default {f.default!r}"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"default {f.default_factory()!r}"
        else:
            default = "required"
        lines = [f"  {f.name} ({f.type}, {default})"]
        for i, paragraph in enumerate(docs[f.name].split("\n\n") if docs[f.name] else ()):
            lines += [""] if i else []
            lines += textwrap.wrap(paragraph, width, initial_indent=" " * 6, subsequent_indent=" " * 6, **_WRAP)
        if f.name in trl:  # the drop-in's renames (trl_names.py): what a TRL user knows the setting as
            names = f"TRL's name{'s' if len(trl[f.name]) > 1 else ''}: {', '.join(trl[f.name])}."
            lines += textwrap.wrap(names, width, initial_indent=" " * 6, subsequent_indent=" " * 8, **_WRAP)
        groups.setdefault(title, []).extend(lines)
    header = f"{cls.__name__} fields: set them in a YAML file or as key=value overrides."
    return "\n\n".join([header] + [f"{title}:\n" + "\n".join(lines) for title, lines in groups.items()])


def load_config(cls, path=None, overrides=()):
    """``cls`` built from a YAML file (a mapping of field names to values), then ``key=value``
    overrides (values parsed as YAML: ``kl_coef=0.1``, ``dual_clip=null``, ``adaptive_kl=true``).
    Every mistake is a one-line ``ValueError``; the config's own validation runs last, unchanged."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    sources = []
    if path is not None:
        sources.append((f"file {path}", _read_yaml_mapping(Path(path))))
    sources.append(("the command line", _parse_overrides(overrides)))
    values = {}
    for source, mapping in sources:
        for key, value in mapping.items():
            if key not in fields:
                raise ValueError(_unknown_key_message(key, value, fields, source))
            preset_unset = value is None and fields[key].metadata.get("preset")  # null: the preset's value
            values[key] = value if preset_unset else _check_type(key, value, fields[key].type, source)
    return cls(**values)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: a recipe's first value would be ignored without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def _read_yaml_mapping(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # a SafeLoader: plain data only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
            problem += f" ({' '.join(context.split())} on line {context_mark.line + 1})"
        raise ValueError(f"{where}: YAML syntax error: {problem}") from None
    if data is None:  # an empty file: all defaults
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of field names to values, got {type(data).__name__}")
    return data


def _parse_overrides(overrides) -> dict:
    if isinstance(overrides, str):  # a lone "k=v" would otherwise be iterated character by character
        overrides = [overrides]
    parsed = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} must be key=value (e.g. kl_coef=0.1)")
        try:
            parsed[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ValueError(f"override {item!r}: the value does not parse as YAML") from None
    return parsed


def _unknown_key_message(key, value, fields, source: str) -> str:
    from ..algorithms.registry import did_you_mean  # torch is loaded on this error's path only
    from .trl_names import trl_name_hint

    sections = " (sections are not supported: write fields at the top level)" if isinstance(value, dict) else ""
    # a TRL field name gets rlhfkit's name for it (the drop-in's table), not a look-alike field
    hint = trl_name_hint(key, fields) or did_you_mean(key, fields)
    return f"unknown config key {key!r} from {source}{sections}.{hint}"


def _check_type(key: str, value, annotation, source: str):
    """``value`` converted to the field's annotation (a string under postponed annotations)."""
    ok, converted = _convert(value, str(annotation).replace(" ", ""))
    if not ok:
        raise ValueError(
            f"config key {key!r} from {source} expects {annotation}, got {value!r} ({type(value).__name__})"
        )
    return converted


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _to_float(value) -> tuple[bool, object]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True, float(value)
    # PyYAML reads 1e-5 (no dot) as a string, following YAML 1.1; accept what float() reads.
    try:
        return isinstance(value, str), float(value)
    except (TypeError, ValueError):
        return False, value


# How a value of each plain annotation is checked (and converted): (whether it is one, the value).
_SCALARS = {
    "bool": lambda v: (isinstance(v, bool), v),
    "int": lambda v: (isinstance(v, int) and not isinstance(v, bool), v),
    "float": _to_float,
    "str": lambda v: (isinstance(v, str), v),
    "None": lambda v: (v is None, v),
}


def _convert(value, ann: str) -> tuple[bool, object]:
    if ann.startswith("Optional[") and ann.endswith("]"):
        ann = ann[len("Optional[") : -1] + "|None"
    options = _split_top(ann, "|")
    if len(options) > 1:
        return _convert_union(value, options)
    if ann in _SCALARS:
        return _SCALARS[ann](value)
    if ann == "dict" or ann.startswith("dict["):
        return isinstance(value, dict), value
    for kind, make in (("tuple", tuple), ("list", list)):
        if ann.startswith(kind + "[") and ann.endswith("]"):
            return _convert_sequence(value, _split_top(ann[len(kind) + 1 : -1], ","), make)
    return True, value  # an annotation this reader does not know: the config's validation decides


def _convert_union(value, options: list[str]) -> tuple[bool, object]:
    """``value`` as the first of a union's ``options`` it is (None only where the union admits it)."""
    if value is None and "None" in options:
        return True, None
    for option in options:
        if option != "None":
            ok, converted = _convert(value, option)
            if ok:
                return True, converted
    return False, value


def _convert_sequence(value, items: list[str], make) -> tuple[bool, object]:
    if not isinstance(value, (list, tuple)):
        return False, value
    if len(items) == 2 and items[1] == "...":
        items = [items[0]] * len(value)
    elif len(items) == 1 and make is list:
        items = items * len(value)
    if len(items) != len(value):
        return False, value
    out = []
    for v, item in zip(value, items):
        ok, converted = _convert(v, item)
        if not ok:
            return False, value
        out.append(converted)
    return True, make(out)


def config_values(config) -> dict:
    """The config's init fields as plain values, as a user would write them: a field its preset
    filled (``config.preset_filled``, see ``RLConfig``) is ``None`` — unset, so the preset rule
    applies again when the values are loaded, also under another ``algorithm``."""
    filled: frozenset[str] = getattr(config, "preset_filled", frozenset())
    return {f.name: None if f.name in filled else getattr(config, f.name) for f in dataclasses.fields(config) if f.init}


def save_config(config, path) -> Path:
    """The config as YAML; ``load_config(type(config), path)`` returns an equal config. Fields a
    preset filled are written as ``null`` with the value they resolved to in a comment
    (``kl_coef: null  # grpo preset: 0.04``), so loading with ``algorithm=...`` changed follows the
    preset rule exactly as ``RLConfig.replace`` does."""

    def plain(v):
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {k: plain(v) for k, v in config_values(config).items()}
    lines = yaml.safe_dump(values, sort_keys=False, allow_unicode=True).splitlines()
    for i, line in enumerate(lines):
        key = line.split(":", 1)[0]
        if key in getattr(config, "preset_filled", ()) and line == f"{key}: null":
            lines[i] = f"{line}  # {config.algorithm} preset: {json.dumps(getattr(config, key))}"
    path.write_text("\n".join(lines) + "\n")
    return path
