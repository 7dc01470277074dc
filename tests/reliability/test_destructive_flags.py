"""The flags and keys that write, move or delete (issue 30, part 3; docs/guides/reliability.md): what the
audit changed. ``eval --output`` never replaces a file that is not an earlier eval result (nor an
input) without ``--overwrite``, and writes whole or not at all; ``report`` never replaces a
``report.html`` it did not write; ``save_total_limit`` never follows a symbolic link and never
deletes the checkpoint just written to keep one of an abandoned continuation."""

import json

import pytest

from rlhfkit.cli import main
from rlhfkit.report import write_report
from rlhfkit.run.checkpoint import complete_checkpoints, prune_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["abc", "hello", "xyz"]))
    return path


def _eval(model, prompts, output, *extra):
    return [
        "eval",
        "--model",
        str(model),
        "--dataset",
        str(prompts),
        "--reward",
        "rlhfkit.tasks.toy:fraction_of_a",
        "--max-new-tokens",
        "2",
        "--output",
        str(output),
        *extra,
    ]


def test_eval_output_never_replaces_an_input_or_a_foreign_file_without_overwrite(
    tmp_path, prompts, tiny_model_dir, capsys
):
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": true}')
    before = prompts.read_bytes()
    for output, extra in ((prompts, ()), (prompts, ("--overwrite",)), (mine, ()), (tmp_path, ())):
        assert main(_eval("no/such/model", prompts, output, *extra)) == 2  # refused before any model loads
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--output" in err, err
    assert prompts.read_bytes() == before and mine.read_text() == '{"mine": true}'
    result = tmp_path / "result.json"
    assert main(_eval(tiny_model_dir, prompts, result)) == 0
    first = json.loads(result.read_text())
    assert main(_eval(tiny_model_dir, prompts, result)) == 0  # an earlier eval result is replaced
    assert main(_eval(tiny_model_dir, prompts, mine, "--overwrite")) == 0  # and anything with --overwrite
    assert json.loads(mine.read_text())["metrics"].keys() == first["metrics"].keys()
    assert not list(tmp_path.glob("*.tmp*"))


def test_report_never_replaces_a_report_html_it_did_not_write(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    (tmp_path / "report.html").write_text("<html>my own notes</html>")
    with pytest.raises(ValueError, match="is not a report rlhfkit wrote"):
        write_report(tmp_path)
    assert (tmp_path / "report.html").read_text() == "<html>my own notes</html>"
    (tmp_path / "report.html").unlink()
    write_report(tmp_path)
    write_report(tmp_path)  # its own: regenerated
    assert "rlhfkit run</title>" in (tmp_path / "report.html").read_text()


def _checkpoint(path, step):
    (path / "dcp").mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": step}))


def test_pruning_keeps_the_checkpoint_just_written_and_never_follows_a_link(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "kept-by-the-user"
    for step in (2, 3, 4):  # 4: of a continuation abandoned by resuming from checkpoint-2
        _checkpoint(run / f"checkpoint-{step}", step)
    _checkpoint(elsewhere, 1)
    (run / "checkpoint-1").symlink_to(elsewhere, target_is_directory=True)
    removed = prune_checkpoints(run, keep=1, newest_step=3)  # the resumed run has just saved checkpoint-3
    assert [p.name for p in removed] == ["checkpoint-2"]
    assert [p.name for p in complete_checkpoints(run)] == ["checkpoint-1", "checkpoint-3", "checkpoint-4"]
    assert (elsewhere / "trainer_state.json").is_file() and (run / "checkpoint-1").is_symlink()
