"""Field docs, help text, YAML files and key=value overrides (rlhfkit/config/io.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import yaml

from rlhfkit.config import PRESETS, RLConfig, field_docs, format_help, load_config, save_config


# A config of another module's shape (SFTConfig / RewardModelConfig): the helpers are generic.
@dataclass(frozen=True)
class _BaseDemo:
    name: str = "demo"
    """Run name."""
    steps: int = 10
    """Steps to run."""
    undocumented: float = 0.5


@dataclass(frozen=True)
class DemoConfig(_BaseDemo):
    steps: int = 20
    """Steps, as the subclass documents them."""
    lr: float | None = None
    """Learning rate."""
    dims: tuple[int, ...] = (1, 2)
    """Any number of ints."""
    pair: tuple[str, float] = ("a", 1.0)
    """A name and a weight."""
    tags: list[str] = dataclasses.field(default_factory=list)
    """Free-form tags,
    wrapped over two lines in the source."""

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError("steps must be >= 0")


def _yaml(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


# ---- field_docs / format_help ----


def test_every_rlconfig_field_has_a_doc():
    docs = field_docs(RLConfig)
    assert list(docs) == [f.name for f in dataclasses.fields(RLConfig)]
    assert [name for name, doc in docs.items() if not doc] == []
    assert docs["kl_coef"].startswith("β of the KL penalty")
    assert docs["dtype"].startswith("Weights dtype")


def test_field_docs_generic_inherited_and_missing():
    docs = field_docs(DemoConfig)
    assert docs["name"] == "Run name."
    assert docs["steps"] == "Steps, as the subclass documents them."  # the subclass's doc wins
    assert docs["undocumented"] == ""
    assert docs["pair"] == "A name and a weight."
    assert docs["tags"] == "Free-form tags, wrapped over two lines in the source."  # one line, as --help wraps it


def test_format_help_groups_fields_by_defining_class():
    text = format_help(RLConfig)
    titles = [line[:-1] for line in text.splitlines() if line and not line.startswith(" ")][1:]
    assert titles == ["Model", "Rollout", "HF options", "VLLM options", "Agent", "Algorithm", "Teacher", "Optim", "Run"]
    assert "  kl_coef (float, default: the algorithm's preset)" in text
    assert "  clip_high (float, default: the algorithm's preset)" in text
    assert "DAPO's clip-higher uses 0.28" in text
    for name in (f.name for f in dataclasses.fields(RLConfig)):
        assert f"  {name} (" in text


@dataclass(frozen=True)
class _WrappedDemo:
    flag: bool = False
    """A doc written over several short source lines,
    as the formatter leaves them:
    one paragraph.

    A second
    paragraph."""


def test_field_docs_reflow_the_sources_lines_and_keep_paragraphs():
    assert field_docs(_WrappedDemo)["flag"] == (
        "A doc written over several short source lines, as the formatter leaves them: one paragraph.\n\n"
        "A second paragraph."
    )


def test_format_help_reflows_each_paragraph_to_its_width():
    lines = format_help(_WrappedDemo, width=40).splitlines()
    doc = lines[lines.index("  flag (bool, default False)") + 1 :]
    assert doc == [
        "      A doc written over several short",
        "      source lines, as the formatter",
        "      leaves them: one paragraph.",
        "",
        "      A second paragraph.",
    ]


def test_every_rlconfig_doc_is_reflowed_into_lines_of_at_most_100_columns():
    text = format_help(RLConfig)
    assert max(map(len, text.splitlines())) <= 100
    # a doc the source wraps over several lines fills each help line (no break where the source had one)
    lines = text.splitlines()
    first = lines.index("  rollout_precision (str | None, default None)") + 1
    doc = lines[first : next(i for i in range(first, len(lines)) if not lines[i].startswith("      "))]
    assert len(doc) > 3
    for line, after in zip(doc, doc[1:]):
        assert len(line) + 1 + len(after.split()[0]) > 100, (line, after)
    assert " ".join(" ".join(doc).split()) == field_docs(RLConfig)["rollout_precision"]


def test_format_help_of_another_config_class():
    text = format_help(DemoConfig)
    assert "_BaseDemo:" in text and "Demo:" in text
    assert "  tags (list[str], default [])" in text
    assert "  undocumented (float, default 0.5)" in text
    assert text.index("  steps (") > text.index("Demo:")  # re-declared: grouped under the subclass


# ---- load_config: values ----


def test_defaults_without_file_or_overrides():
    assert load_config(RLConfig) == RLConfig()


def test_file_then_overrides(tmp_path):
    path = _yaml(tmp_path, "algorithm: ppo\nkl_coef: 0.2\nmax_steps: 5\n")
    c = load_config(RLConfig, path, ["kl_coef=0.1", "dual_clip=null", "adaptive_kl=true", "output_dir=runs/a"])
    assert (c.algorithm, c.kl_coef, c.max_steps, c.dual_clip, c.adaptive_kl) == ("ppo", 0.1, 5, None, True)
    assert c.output_dir == "runs/a"
    assert c.use_critic is True  # the preset still fills what the file left unset


def test_override_value_may_contain_equals_and_spaces():
    c = load_config(DemoConfig, overrides=[" name = a=b "])
    assert c.name == "a=b"


def test_empty_file_gives_defaults(tmp_path):
    assert load_config(RLConfig, _yaml(tmp_path, "# nothing\n")) == RLConfig()


def test_int_accepted_and_converted_for_float(tmp_path):
    c = load_config(RLConfig, _yaml(tmp_path, "learning_rate: 1\n"), ["kl_coef=0"])
    assert c.learning_rate == 1.0 and type(c.learning_rate) is float
    assert c.kl_coef == 0.0 and type(c.kl_coef) is float


def test_float_written_without_a_dot_is_accepted(tmp_path):
    # PyYAML (YAML 1.1) reads 1e-5 as a string.
    c = load_config(RLConfig, _yaml(tmp_path, "learning_rate: 1e-5\n"))
    assert c.learning_rate == 1e-5


def test_tuples_and_lists(tmp_path):
    c = load_config(DemoConfig, _yaml(tmp_path, "dims: [3, 4, 5]\npair: [x, 2]\ntags: [u, v]\n"))
    assert c.dims == (3, 4, 5) and c.pair == ("x", 2.0) and c.tags == ["u", "v"]
    assert load_config(DemoConfig, overrides=["dims=[]"]).dims == ()


# ---- load_config: errors ----


def test_unknown_key_from_file_suggests_close_matches(tmp_path):
    message = _error(lambda: load_config(RLConfig, _yaml(tmp_path, "kl_cof: 0.1\n")))
    assert "'kl_cof'" in message and "kl_coef" in message and "c.yaml" in message


def test_unknown_key_from_command_line(tmp_path):
    message = _error(lambda: load_config(RLConfig, overrides=["kl_cof=0.1"]))
    assert "'kl_cof'" in message and "Did you mean 'kl_coef'" in message and "command line" in message
    assert len(message.split("Did you mean ")[1].split(", ")) <= 3
    message = _error(lambda: load_config(RLConfig, overrides=["zzzz=1"]))
    assert "Did you mean" not in message


def test_sections_are_not_flattened(tmp_path):
    message = _error(lambda: load_config(RLConfig, _yaml(tmp_path, "rollout:\n  max_new_tokens: 8\n")))
    assert "'rollout'" in message and "top level" in message


@pytest.mark.parametrize(
    "line, expected",
    [
        ("max_steps: abc", "int"),
        ("max_steps: true", "int"),  # bool is not an int here
        ("max_steps: 1.5", "int"),
        ("kl_coef: true", "float"),  # nor a float
        ("kl_coef: abc", "float"),
        ("learning_rate: null", "float"),
        ("adaptive_kl: 1", "bool"),
        ("algorithm: 3", "str"),
    ],
)
def test_wrong_type_names_key_type_and_value(tmp_path, line, expected):
    key, value = line.split(": ")
    message = _error(lambda: load_config(RLConfig, _yaml(tmp_path, line + "\n")))
    assert f"'{key}'" in message and f"expects {expected}, got {yaml.safe_load(value)!r} (" in message
    assert "c.yaml" in message


def test_null_for_a_preset_field_means_the_preset_and_is_refused_for_any_other(tmp_path):
    # a preset field is annotated without None (it always holds a value after construction), yet null is
    # how a file says "unset": the preset fills it, and it is recorded as the preset's
    config = load_config(RLConfig, _yaml(tmp_path, "algorithm: ppo\nkl_coef: null\n"))
    assert config.kl_coef == PRESETS["ppo"]["kl_coef"] and "kl_coef" in config.preset_filled
    message = _error(lambda: load_config(RLConfig, overrides=["vf_coef=null"]))
    assert message == "config key 'vf_coef' from the command line expects float, got None (NoneType)"


def test_wrong_type_from_command_line():
    message = _error(lambda: load_config(RLConfig, overrides=["max_steps=ten"]))
    assert message == "config key 'max_steps' from the command line expects int, got 'ten' (str)"


@pytest.mark.parametrize("value", ["[1, x]", "7", "[a, 1, 2]"])
def test_wrong_type_in_tuples(value):
    key = "dims" if value != "[a, 1, 2]" else "pair"
    message = _error(lambda: load_config(DemoConfig, overrides=[f"{key}={value}"]))
    assert f"'{key}'" in message and "expects tuple[" in message


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = _yaml(tmp_path, "algorithm: ppo\nkl_coef: 0.1\nmax_steps: [1, 2\nseed: 3\n", name="bad.yaml")
    message = _error(lambda: load_config(RLConfig, path))
    assert message.startswith(f"{path}:") and "YAML syntax error" in message
    # PyYAML notices the error on line 4; the message also names line 3, where the list opened.
    assert message.startswith(f"{path}:4:") and "on line 3" in message
    path = _yaml(tmp_path, "a: 1\n  b: 2\n", name="indent.yaml")
    assert _error(lambda: load_config(RLConfig, path)).startswith(f"{path}:2:")


def test_top_level_must_be_a_mapping(tmp_path):
    message = _error(lambda: load_config(RLConfig, _yaml(tmp_path, "- kl_coef\n- 0.1\n")))
    assert "mapping" in message and "list" in message and "c.yaml" in message


def test_missing_file_is_named(tmp_path):
    message = _error(lambda: load_config(RLConfig, tmp_path / "nope.yaml"))
    assert "nope.yaml" in message and "not found" in message


@pytest.mark.parametrize("bad", ["kl_coef", "=0.1", "kl_coef 0.1"])
def test_override_without_equals(bad):
    assert "key=value" in _error(lambda: load_config(RLConfig, overrides=[bad]))


def test_override_value_that_is_not_yaml():
    assert "does not parse" in _error(lambda: load_config(RLConfig, overrides=["dims=[1,"]))


def test_post_init_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(ValueError) as from_yaml:
        load_config(RLConfig, _yaml(tmp_path, "algorithm: grpo\ngroup_size: 1\n"))
    with pytest.raises(ValueError) as direct:
        RLConfig(algorithm="grpo", group_size=1)
    assert str(from_yaml.value) == str(direct.value)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        load_config(RLConfig, overrides=["algorithm=nope"])
    with pytest.raises(ValueError, match="steps must be >= 0"):
        load_config(DemoConfig, overrides=["steps=-1"])


# ---- save_config ----


def test_save_load_round_trip(tmp_path):
    config = RLConfig(algorithm="ppo", kl_coef=0.1)
    path = save_config(config, tmp_path / "run" / "config.yaml")
    assert path.is_file()
    loaded = load_config(RLConfig, path)
    assert loaded == config and loaded.kl_coef == 0.1
    text = path.read_text()
    # preset-filled fields are recorded unset, with their resolved value beside them
    assert "use_critic: null  # ppo preset: true" in text and 'advantage_estimator: null  # ppo preset: "gae"' in text
    assert "kl_coef: 0.1\n" in text  # a value the user set is written as such
    assert loaded.preset_filled == config.preset_filled


def test_save_load_round_trip_other_config(tmp_path):
    config = DemoConfig(name="x: y", lr=1e-6, dims=(7,), pair=("p", 0.25), tags=["t"])
    assert load_config(DemoConfig, save_config(config, tmp_path / "c.yaml")) == config
