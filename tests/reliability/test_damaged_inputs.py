"""Every kind of damaged model directory or checkpoint is one line on stderr naming the file (exit
status 2, no traceback) from every training command, and the damaged files are left as they were."""

import hashlib
import json
import shutil

import pytest

from rlhfkit.cli import main


def checksums(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def damage(model, kind):
    """Damage a copy of a saved tiny model; returns (directory, the text the error must name)."""
    weights, config = model / "model.safetensors", model / "config.json"
    if kind == "config-not-json":
        config.write_text("{not json")
        return "config.json"
    if kind == "weights-empty":
        weights.write_bytes(b"")
        return "model.safetensors"
    if kind == "weights-truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return "model.safetensors"
    if kind == "weights-missing":
        weights.unlink()
        return str(model)
    if kind == "shape-mismatch":
        data = json.loads(config.read_text())
        data["intermediate_size"] = data["intermediate_size"] * 2
        config.write_text(json.dumps(data))
        return str(model)
    if kind == "tokenizer-not-json":
        (model / "tokenizer.json").write_text("[[[")
        return "tokenizer.json"
    raise AssertionError(kind)


KINDS = [
    "config-not-json",
    "weights-empty",
    "weights-truncated",
    "weights-missing",
    "shape-mismatch",
    "tokenizer-not-json",
]


@pytest.fixture
def shift_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("shift")
    assert main(["data", str(root / "data")]) == 0
    return root / "data"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["sft", *(pytest.param(c, marks=pytest.mark.slow) for c in ("rm", "dpo", "rl"))])
def test_a_damaged_model_is_one_line_naming_it(tmp_path, shift_dir, capsys, command, kind):
    model = tmp_path / "model"
    shutil.copytree(shift_dir / "model", model)
    named = damage(model, kind)
    before = checksums(model)
    data = {"sft": "sft.jsonl", "rl": "prompts.jsonl"}.get(command, "pairs.jsonl")
    extra = ["reward_funcs=[shift_oracle]", "max_new_tokens=4", "prompts_per_step=2"] if command == "rl" else []
    capsys.readouterr()
    code = main(
        [
            command,
            f"model={model}",
            f"train_dataset={shift_dir / data}",
            "max_steps=1",
            f"output_dir={tmp_path / 'run'}",
            "--quiet",
            *extra,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert named in err, err
    assert checksums(model) == before  # nothing of the user's changed
    assert not (tmp_path / "run").exists()  # and nothing was written


def test_a_damaged_reward_model_head_is_one_line(tmp_path, shift_dir, capsys):
    assert (
        main(
            [
                "rm",
                f"model={shift_dir / 'model'}",
                f"train_dataset={shift_dir / 'pairs.jsonl'}",
                "max_steps=1",
                f"output_dir={tmp_path / 'rm'}",
                "--quiet",
            ]
        )
        == 0
    )
    final = tmp_path / "rm" / "final"
    (final / "model.safetensors").write_bytes(b"\x00" * 4)
    capsys.readouterr()
    code = main(
        [
            "rl",
            f"model={shift_dir / 'model'}",
            f"train_dataset={shift_dir / 'prompts.jsonl'}",
            f"reward_funcs=[{final}]",
            "max_steps=1",
            "max_new_tokens=4",
            "prompts_per_step=2",
            f"output_dir={tmp_path / 'run'}",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "model.safetensors" in err, err


@pytest.mark.parametrize(
    "file,content",
    [
        ("trainer_state.json", "{oops"),
        ("trainer_state.json", "[1, 2]"),
        ("training_state.json", ""),
        ("rng-0.json", "null"),
    ],
)
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path, shift_dir, capsys, file, content):
    args = [
        "sft",
        f"model={shift_dir / 'model'}",
        f"train_dataset={shift_dir / 'sft.jsonl'}",
        "max_steps=2",
        "save_steps=1",
        "--quiet",
    ]
    assert main([*args, f"output_dir={tmp_path / 'a'}"]) == 0
    checkpoint = tmp_path / "a" / "checkpoint-1"
    (checkpoint / file).write_text(content)
    before = checksums(checkpoint)
    capsys.readouterr()
    code = main([*args, f"output_dir={tmp_path / 'b'}", f"resume_from={checkpoint}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and file in err and "damaged" in err, err
    assert checksums(checkpoint) == before
