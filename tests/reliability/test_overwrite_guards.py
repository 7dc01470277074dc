"""--overwrite never loses what the user has: it refuses to clear a directory that holds one of the
run's own inputs, and it clears only directories rlhfkit marked as its run directories (a
``.rlhfkit-run`` file), never a look-alike ``config.yaml`` / ``metrics.jsonl`` of the user's."""

import hashlib

import pytest

from rlhfkit.cli import main
from rlhfkit.run.directory import MARKER
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat"]]
PAIRS = [{"prompt": p, "chosen": "aaaa", "rejected": "bbbb"} for p in ["abc", "hello", "xyz", "go"]]
RL = [
    "rl",
    "train_dataset=d/prompts.jsonl",
    "reward_funcs=[shift_oracle]",
    "max_new_tokens=4",
    "prompts_per_step=2",
    "max_steps=1",
    "--quiet",
]


def checksums(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_overwrite_refuses_to_delete_the_model_it_trains(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "d"]) == 0
    assert main(["sft", "model=d/model", "train_dataset=d/sft.jsonl", "max_steps=1", "output_dir=X", "--quiet"]) == 0
    before = checksums(tmp_path / "X")
    capsys.readouterr()
    assert main([*RL, "model=X/final", "output_dir=X", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "rlhfkit rl: error: model='X/final' lies inside output_dir 'X', which overwrite=true would clear: "
        "choose another output_dir, or move it out first\n"
    )
    assert checksums(tmp_path / "X") == before  # the model and the earlier run are all there
    assert main([*RL, "model=X/final", "output_dir=Y"]) == 0  # it trains fine elsewhere


def test_overwrite_refuses_to_delete_recorded_data_or_a_reference(tmp_path):
    tok = char_tokenizer()
    run = tmp_path / "run"
    SFTTrainer(
        tiny_causal_lm(tok, hidden_size=32),
        SFTConfig(max_steps=1, batch_size=2, log_every=0, output_dir=str(run)),
        ROWS,
        processing_class=tok,
    ).train()
    recorded = run / "data" / "train_dataset.jsonl"  # the in-memory rows, recorded by the first run
    before = checksums(run)
    with pytest.raises(ValueError, match=f"^train_dataset={str(recorded)!r} lies inside output_dir"):
        SFTTrainer(
            tiny_causal_lm(tok, hidden_size=32),
            SFTConfig(max_steps=1, batch_size=2, log_every=0, output_dir=str(run), overwrite=True),
            str(recorded),
            processing_class=tok,
        )
    with pytest.raises(ValueError, match=f"^ref_model={str(run / 'final')!r} lies inside output_dir"):
        DPOTrainer(
            tiny_causal_lm(tok, hidden_size=32),
            DPOConfig(max_steps=1, batch_size=2, log_every=0, output_dir=str(run), overwrite=True),
            PAIRS,
            processing_class=tok,
            ref_model=str(run / "final"),
        )
    assert checksums(run) == before


def test_overwrite_clears_only_a_directory_rlhfkit_marked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "d"]) == 0
    mine = tmp_path / "mine"  # the user's own experiment notes, named like rlhfkit's files
    mine.mkdir()
    (mine / "config.yaml").write_text("learning_rate: 0.5  # my notes\n")
    (mine / "metrics.jsonl").write_text('{"step": 1, "my/metric": 3.0}\n')
    old = tmp_path / "old"  # a run directory of a version before the marker
    assert main(["sft", "model=d/model", "train_dataset=d/sft.jsonl", "max_steps=1", "output_dir=old", "--quiet"]) == 0
    assert (old / MARKER).is_file()
    (old / MARKER).unlink()
    before = {**checksums(mine), **checksums(old)}
    capsys.readouterr()
    for directory in ("mine", "old"):
        assert (
            main(
                [
                    "sft",
                    "model=d/model",
                    "train_dataset=d/sft.jsonl",
                    "max_steps=1",
                    f"output_dir={directory}",
                    "--quiet",
                    "--overwrite",
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(
            f"rlhfkit sft: error: output_dir '{directory}' holds files but no {MARKER} marker"
        ), err
    assert {**checksums(mine), **checksums(old)} == before  # nothing touched
