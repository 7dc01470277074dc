"""Smoke run of every recipe (2 steps each), through the command line, on the embedded task's files."""

from pathlib import Path


from rlhfkit.cli import main

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
ORDER = ["shift-sft.yaml", "shift-rm.yaml", "shift-ppo.yaml", "shift-grpo-rlvr.yaml"]


def test_every_recipe_is_in_the_smoke_run():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(ORDER)


def test_recipes_run_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/shift"]) == 0
    for name in ORDER:
        code = main(["sft" if "sft" in name else "rm" if "-rm" in name else "rl", "--config", str(RECIPES / name),
                     "max_steps=2", "--quiet"])
        assert code == 0, (name, capsys.readouterr().err)
    for run in ["shift-sft", "shift-rm", "shift-ppo", "shift-grpo-rlvr"]:
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
