"""A TRL script run twice into the same ``output_dir`` runs twice, as with TRL (which writes into an
existing ``output_dir``): the drop-in replaces rlhfkit's own files of the earlier run (checkpoints,
logs, the final model), says so in one line, and never touches another file there."""

import hashlib

import pytest

from rlhfkit.run.directory import MARKER
from rlhfkit.tasks.tiny import save_tiny_model
from rlhfkit.trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none", logging_steps=1)
PROMPTS = [{"prompt": p} for p in ["abc", "hello", "xyz", "qq"]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def reward_len(completions, **kwargs):
    return [-abs(8 - len(completion)) for completion in completions]


def grpo_script(model_dir, output_dir, max_steps=2):
    """A TRL GRPO script: train, then save the model into output_dir itself (TRL's scripts do)."""
    args = GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=max_steps,
        save_steps=1,
        **CPU,
    )
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_len, args=args, train_dataset=PROMPTS)
    trainer.train()
    trainer.save_model()
    return trainer


def user_files(root):
    """The user's own files in a run directory: notes beside the run, and a folder of their data."""
    (root / "notes.md").write_text("lr 1e-6 looked best\n")
    (root / "my_data").mkdir(exist_ok=True)
    (root / "my_data" / "prompts.json").write_text('["abc"]\n')
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (root / "notes.md", root / "my_data/prompts.json")}


def unchanged(files):
    return all(p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() == h for p, h in files.items())


def warnings_about(output_dir, capsys) -> list[str]:
    """The lines on stderr that speak of ``output_dir``."""
    return [line for line in capsys.readouterr().err.splitlines() if "output_dir" in line and str(output_dir) in line]


def test_a_rerun_into_the_same_output_dir_replaces_only_rlhfkits_files(model_dir, tmp_path, capsys):
    out = tmp_path / "Qwen2-0.5B-GRPO"
    grpo_script(model_dir, out, max_steps=2)
    assert (out / "checkpoint-2").is_dir() and (out / "config.json").is_file()
    mine = user_files(out)
    capsys.readouterr()
    trainer = grpo_script(model_dir, out, max_steps=1)  # was: "already exists ... set overwrite=true"
    said = warnings_about(out, capsys)
    assert len(said) == 1, said
    assert (
        said[0].startswith(f"warning: GRPOTrainer: output_dir {str(out)!r} holds an earlier run")
        and "checkpoint-2/" in said[0]
    )
    assert "metrics.jsonl" in said[0] and "notes.md" not in said[0] and "kept" in said[0]
    assert unchanged(mine)  # the user's files: untouched
    assert not (out / "checkpoint-2").exists() and (out / "checkpoint-1").is_dir()  # the earlier run's: replaced
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 == trainer.state.global_step  # only the new run's step, not the old run's two
    assert (out / "config.json").is_file()  # save_model() wrote the new model into output_dir again


def test_a_directory_of_the_users_own_files_is_written_beside_them(model_dir, tmp_path, capsys):
    out = tmp_path / "experiments"
    out.mkdir()
    mine = user_files(out)
    capsys.readouterr()
    grpo_script(model_dir, out, max_steps=1)  # was: "holds files but no .rlhfkit-run marker"
    said = warnings_about(out, capsys)
    assert len(said) == 1 and "writes beside them" in said[0] and "removes none" in said[0], said
    assert unchanged(mine) and (out / MARKER).is_file() and (out / "checkpoint-1").is_dir()


def test_files_named_like_rlhfkits_in_an_unmarked_directory_are_not_replaced(model_dir, tmp_path):
    out = tmp_path / "trl-run"  # what TRL itself left: a checkpoint, and the user's own metrics file
    (out / "checkpoint-500").mkdir(parents=True)
    (out / "checkpoint-500" / "config.json").write_text("{}\n")
    (out / "metrics.jsonl").write_text('{"step": 1, "mine": 1}\n')
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ValueError) as e:
        grpo_script(model_dir, out, max_steps=1)
    line = str(e.value)
    assert "\n" not in line and line.startswith(
        f"GRPOTrainer: output_dir {str(out)!r} holds checkpoint-500/, metrics.jsonl"
    ), line
    assert f"no {MARKER} marker" in line and "choose another output_dir" in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before and not (out / MARKER).exists()


def test_an_sft_rerun_replaces_its_run_too(model_dir, tmp_path, capsys):
    out = tmp_path / "sft"
    rows = [{"prompt": "ab", "completion": "cd"}, {"prompt": "x", "completion": "yz"}]
    args = SFTConfig(output_dir=str(out), per_device_train_batch_size=2, max_steps=1, save_steps=1, **CPU)
    SFTTrainer(model=model_dir, args=args, train_dataset=rows).train()
    mine = user_files(out)
    capsys.readouterr()
    SFTTrainer(model=model_dir, args=args, train_dataset=rows).train()
    (said,) = warnings_about(out, capsys)
    assert said.startswith("warning: SFTTrainer: output_dir") and "holds an earlier run: its checkpoint-1/" in said
    assert unchanged(mine) and len((out / "metrics.jsonl").read_text().splitlines()) == 1
