"""No option of any ``rlhfkit`` command is taken from a prefix (argparse's ``allow_abbrev`` is off
everywhere): a misspelt or shortened flag is one line naming it, with the real one ("did you
mean"), exit status 2, before anything is read or written. Issue 30: ``rl --overwrit``, ``--over``
and ``--o`` used to be taken as ``--overwrite`` and cleared the run directory."""

import json

import pytest

from rlhfkit.cli import main
from rlhfkit.run.directory import MARKER, run_outputs

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = [  # (arguments, the flag refused, what it suggests)
    (["quickstart", "--over"], "--over", "--overwrite"),
    (["quickstart", "--output", "x"], "--output", "--output-dir"),
    (["sft", "--overwrit", "max_steps=1"], "--overwrit", "--overwrite"),
    (["rm", "--conf", "x.yaml"], "--conf", "--config"),
    (["dpo", "--qiet"], "--qiet", "--quiet"),
    (["rl", "--o", "output_dir=runA"], "--o", "--overwrite"),
    (["rl", "--nproc", "2"], "--nproc", "--nproc-per-node"),
    (["eval", "--model", "m", "--datset", "d.jsonl"], "--datset", "--dataset"),
    (["eval", "--model", "m", "--dataset", "d.jsonl", "--out", "r.json"], "--out", "--output"),
    (["report", "--hel"], "--hel", "--help"),
    (["data", "out", "--overwrit"], "--overwrit", "--overwrite"),
    (["data", "out", "--n-trian", "5"], "--n-trian", "--n-train"),
    (["demo", "--step", "3"], "--step", "--steps"),
    (["--hel"], "--hel", "--help"),
]


@pytest.mark.parametrize("argv,flag,meant", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_shortened_or_misspelt_option_is_one_line_with_a_suggestion(argv, flag, meant, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and not captured.out, captured
    assert f"unrecognized option {flag} (did you mean {meant}?)" in lines[0]
    assert lines[0].startswith("rlhfkit" + (f" {argv[0]}" if not argv[0].startswith("-") else "") + ": error: ")
    assert not list(tmp_path.iterdir())  # nothing written (`data out`, `quickstart` would create directories)


def test_several_unknown_options_are_named_in_one_line(capsys):
    assert main(["rl", "--ove", "--q"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "rlhfkit rl: error: unrecognized options --ove (did you mean --overwrite?), --q (did you mean --quiet?)\n"
    )


def test_an_option_with_an_equals_sign_is_an_option_not_an_override(capsys):
    assert main(["rl", "--overwrit=true", "output_dir=runA"]) == 2
    assert "unrecognized option --overwrit (did you mean --overwrite?)" in capsys.readouterr().err
    assert main(["rl", "--quite", "kl_coef=-1"]) == 2  # a negative value is a value
    assert capsys.readouterr().err.count("unrecognized option --quite") == 1


def _fake_run(path):
    """A marked run directory with two checkpoints (what an earlier `rlhfkit rl` leaves)."""
    path.mkdir()
    (path / MARKER).write_text(json.dumps({"rlhfkit": "0"}) + "\n")
    (path / "config.yaml").write_text("model: m\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4)))
    for step in (2, 4):
        ckpt = path / f"checkpoint-{step}"
        (ckpt / "dcp").mkdir(parents=True)
        (ckpt / "dcp" / "__0_0.distcp").write_bytes(bytes(range(256)) * step)
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
    (path / "notes.txt").write_text("mine")


def _snapshot(path):
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
    }


@pytest.mark.parametrize("flags", [["--overwrit"], ["--over"], ["--o"], ["--overwrit=true"], ["--ove", "--q"]])
def test_a_prefix_of_overwrite_leaves_a_run_directory_byte_for_byte(
    flags, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    _fake_run(tmp_path / "runA")
    assert {p.name for p in run_outputs(tmp_path / "runA") if p.exists()} >= {"checkpoint-2", "checkpoint-4"}
    before = _snapshot(tmp_path / "runA")
    recipe = tmp_path / "grpo.yaml"  # a command that runs: taken as --overwrite, it would clear runA and train
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "abc"}\n{"prompt": "xyz"}\n')
    recipe.write_text(
        f"model: {tiny_model_dir}\ntrain_dataset: prompts.jsonl\nmax_steps: 1\nprompts_per_step: 2\n"
        "reward_funcs: ['rlhfkit.tasks.toy:fraction_of_a']\nmax_new_tokens: 2\n"
    )
    assert main(["rl", "--config", str(recipe), *flags, "output_dir=runA"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert _snapshot(tmp_path / "runA") == before


@pytest.mark.parametrize(
    "argv,says",
    [
        (["eval", "--model", "m"], "the following arguments are required: --dataset"),
        (["eval", "--model", "m", "--dataset", "d", "--samples", "abc"], "invalid int value: 'abc'"),
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["rl", "--config"], "argument --config: expected one argument"),
    ],
)
def test_a_command_line_argparse_refuses_is_one_line_without_the_usage_block(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err and "usage:" not in err, err
