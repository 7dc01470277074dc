"""Run directories: nothing is written until the model, data and rewards have loaded (a failed
start never blocks the corrected rerun), and --overwrite removes exactly what an earlier rlhfkit
run wrote — checkpoints and final/ included — and never a file it did not write."""

import hashlib

import pytest

from rlhfkit.cli import main
from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import RLTrainer, SFTConfig, SFTTrainer

ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat"]]


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", ["sft", "rl", *(pytest.param(c, marks=pytest.mark.slow) for c in ("rm", "dpo"))])
def test_a_run_that_fails_to_load_writes_nothing_and_the_rerun_needs_no_overwrite(
    tmp_path, monkeypatch, capsys, command
):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/shift"]) == 0
    data = {"sft": "data/shift/sft.jsonl", "rl": "data/shift/prompts.jsonl"}.get(command, "data/shift/pairs.jsonl")
    extra = ["reward_funcs=[shift_oracle]", "max_new_tokens=4", "prompts_per_step=2"] if command == "rl" else []
    base = [command, f"train_dataset={data}", "max_steps=1", "output_dir=run", "--quiet", *extra]
    assert main([*base, "model=data/shift/no-such-model"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    if command == "rl":  # a reward that cannot be resolved is found after the model loads: still nothing written
        assert (
            main(
                [
                    *base[:-3],
                    "model=data/shift/model",
                    "reward_funcs=[no_such_reward]",
                    "max_new_tokens=4",
                    "prompts_per_step=2",
                ]
            )
            == 2
        )
        assert not (tmp_path / "run").exists()
    assert main([*base, "model=data/shift/model"]) == 0, capsys.readouterr().err


def test_overwrite_removes_exactly_what_the_earlier_run_wrote(tmp_path):
    tok = char_tokenizer()
    run = tmp_path / "run"

    def train(**overrides):
        args = dict(learning_rate=1e-3, batch_size=2, max_steps=2, log_every=0, output_dir=str(run), save_steps=1)
        args.update(overrides)
        SFTTrainer(tiny_causal_lm(tok, hidden_size=32), SFTConfig(**args), ROWS, processing_class=tok).train()

    train(max_steps=3)
    assert {
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
        "final",
        "plots",
        "metrics.jsonl",
        "config.yaml",
        "data",
    } <= {p.name for p in run.iterdir()}
    mine = {
        run / "notes.txt": b"mine",
        run / "plots" / "my-figure.png": b"png",
        run / "data" / "extra.csv": b"a,b",
        run / "checkpoint-old" / "readme.txt": b"not a checkpoint",
    }
    for path, content in mine.items():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content)
    before = {path: digest(path) for path in mine}
    with pytest.raises(ValueError, match="already exists and is not empty"):
        train()
    train(overwrite=True, save_steps=0)  # the second run writes no checkpoint
    names = {p.name for p in run.iterdir()}
    assert not any(n.startswith("checkpoint-") and n != "checkpoint-old" for n in names)  # the old run's are gone
    assert {digest(path) for path in mine} == set(before.values())  # every user file untouched
    assert {p.name for p in (run / "plots").iterdir()} >= {"my-figure.png"}
    assert (run / "final" / "config.json").exists()
    import json

    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the new run's rows only


def test_rl_writes_its_run_directory_only_after_everything_loaded(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(ValueError):
        RLTrainer(
            tiny_causal_lm(tok, hidden_size=32),
            ["no_such_reward"],
            RLConfig(max_steps=1, output_dir=str(tmp_path / "run"), log_every=0),
            train_dataset=[{"prompt": "ab"}],
            processing_class=tok,
        )
    assert not (tmp_path / "run").exists()


def test_a_key_given_twice_in_a_recipe_is_one_line(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 2\nlearning_rate: 0.1\nmax_steps: 5\n")
    assert main(["sft", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"rlhfkit sft: error: {recipe}:3: YAML syntax error: key 'max_steps' appears twice (first on line 1)\n"
    )
