"""The command line: help, overrides, one-line errors before any model is loaded, eval, quickstart."""

import json

import pytest
import torch

from rlhfkit.cli import main
from rlhfkit.quickstart import run_quickstart


@pytest.fixture()
def shift_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/shift"]) == 0
    return tmp_path / "data" / "shift"


@pytest.mark.parametrize(
    "command,job", [("sft", "SFTJob"), ("rm", "RMJob"), ("dpo", "DPOJob"), ("kto", "KTOJob"), ("rl", "RLJob")]
)
def test_help_lists_every_key_with_its_doc(command, job, capsys):
    import dataclasses

    import rlhfkit.jobs
    from rlhfkit.config import field_docs

    cls = getattr(rlhfkit.jobs, job)
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    keys = [f.name for f in dataclasses.fields(cls) if f.init]
    assert sorted(listed) == sorted(keys)  # every key, once, and nothing else
    flat = "".join(out.split())  # the docs are wrapped (and hyphenated words split) at 100 columns
    docs = field_docs(cls)
    assert not [k for k in keys if not docs[k] or "".join(docs[k].split()) not in flat]


@pytest.mark.parametrize("command", ["sft", "rm", "dpo", "kto", "rl"])
def test_help_has_no_line_over_the_formatters_120_columns(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 120, max(out.splitlines(), key=len)


def test_unknown_key_suggests_close_matches(capsys):
    assert main(["rl", "kl_cof=0.1"]) == 2
    err = capsys.readouterr().err
    assert "kl_cof" in err and "kl_coef" in err and len(err.strip().splitlines()) == 1


def test_wrong_type_names_the_key(capsys):
    assert main(["sft", "max_steps=ten"]) == 2
    assert "max_steps" in capsys.readouterr().err


def test_yaml_that_does_not_parse(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\nmax_steps: 3\n")
    assert main(["sft", "--config", str(bad)]) == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_missing_config_file(capsys):
    assert main(["rm", "--config", "/no/such.yaml"]) == 2
    assert "/no/such.yaml" in capsys.readouterr().err


def test_required_keys(capsys):
    assert main(["rl", "algorithm=grpo"]) == 2
    assert "'model'" in capsys.readouterr().err


def test_bad_data_is_reported_before_the_model_is_loaded(shift_files, capsys):
    data = shift_files / "broken.jsonl"
    data.write_text('{"prompt": "ab=", "completion": "bc"}\n{"prompt": "cd=", "completion": ""}\n')
    assert main(["sft", "model=/no/such/model", f"train_dataset={data}", "output_dir=runs/x"]) == 2
    err = capsys.readouterr().err
    assert "broken.jsonl" in err and "line 2" in err and "completion" in err


def test_chosen_equal_to_rejected_is_refused(shift_files, capsys):
    data = shift_files / "pairs_bad.jsonl"
    data.write_text('{"prompt": "ab=", "chosen": "bc", "rejected": "bc"}\n')
    assert main(["rm", "model=/no/such/model", f"train_dataset={data}"]) == 2
    err = capsys.readouterr().err
    assert "pairs_bad.jsonl" in err and "line 1" in err


def test_missing_model_path_is_one_line(shift_files, capsys):
    assert (
        main(
            [
                "rl",
                "model=/no/such/model",
                f"train_dataset={shift_files / 'prompts.jsonl'}",
                "reward_funcs=[shift_oracle]",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "/no/such/model" in err and len(err.splitlines()) == 1


def test_eval_scores_a_policy(shift_files, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            "--model",
            str(shift_files / "model"),
            "--dataset",
            str(shift_files / "eval_prompts.jsonl"),
            "--reward",
            "shift_oracle",
            "--reference",
            str(shift_files / "model"),
            "--max-new-tokens",
            "6",
            "--output",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert 0.0 <= result["metrics"]["eval/shift_oracle_mean"] <= 1.0
    assert abs(result["metrics"]["eval/kl_to_reference"]) < 1e-4  # the policy is its own reference
    assert len(result["samples"]) == 128 and "eval/shift_oracle_mean" in capsys.readouterr().out


def test_eval_needs_a_reward(shift_files, capsys):
    assert (
        main(["eval", "--model", str(shift_files / "model"), "--dataset", str(shift_files / "eval_prompts.jsonl")]) == 2
    )


def test_short_quickstart_runs_every_stage(tmp_path, capsys):
    out = run_quickstart(str(tmp_path / "qs"), scale=0.05, compare_grpo=True, quiet=True, compare_dpo=True)
    assert set(out["results"]) == {"SFT", "PPO", "GRPO", "DPO"}
    for stage in ("sft", "rm", "ppo", "grpo", "dpo"):
        assert (tmp_path / "qs" / stage / "final").is_dir(), stage
    table = capsys.readouterr().out
    assert "oracle score" in table and "wall time" in table


def test_a_run_records_its_whole_job_and_its_config_repeats_it(shift_files, capsys):
    """config.yaml holds the sources too (model, data, rewards), so `--config <run>/config.yaml`
    repeats the run; the repeat trains the same policy."""
    import yaml
    from safetensors.torch import load_file

    args = [
        "rl",
        f"model={shift_files / 'model'}",
        f"train_dataset={shift_files / 'prompts.jsonl'}",
        "reward_funcs=[shift_oracle]",
        "algorithm=grpo",
        "max_steps=2",
        "max_new_tokens=4",
        "prompts_per_step=2",
        "output_dir=runs/first",
        "--quiet",
    ]
    assert main(args) == 0, capsys.readouterr().err
    recorded = yaml.safe_load(open("runs/first/config.yaml"))
    assert recorded["model"] == str(shift_files / "model") and recorded["reward_funcs"] == ["shift_oracle"]
    assert recorded["algorithm"] == "grpo" and recorded["max_steps"] == 2
    assert main(["rl", "--config", "runs/first/config.yaml", "output_dir=runs/again", "--quiet"]) == 0
    first, again = (load_file(f"runs/{name}/final/model.safetensors") for name in ("first", "again"))
    assert all(torch.equal(first[k], again[k]) for k in first)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_eval_accepts_an_rl_checkpoint_directory(shift_files, capsys, lora):
    """`rlhfkit eval --model <run>/checkpoint-N` rebuilds the policy from the run's config (base model,
    LoRA settings) and the checkpoint's weights: at the last step it scores exactly like final/."""
    extra = ["lora_r=4"] if lora else []
    assert (
        main(
            [
                "rl",
                f"model={shift_files / 'model'}",
                f"train_dataset={shift_files / 'prompts.jsonl'}",
                "reward_funcs=[shift_oracle]",
                "algorithm=grpo",
                "max_steps=2",
                "save_steps=2",
                "max_new_tokens=4",
                "prompts_per_step=2",
                "learning_rate=0.01",
                "output_dir=runs/r",
                *extra,
                "--quiet",
            ]
        )
        == 0
    )
    scores = {}
    for name in ("checkpoint-2", "final"):
        assert (
            main(
                [
                    "eval",
                    "--model",
                    f"runs/r/{name}",
                    "--dataset",
                    str(shift_files / "eval_prompts.jsonl"),
                    "--reward",
                    "shift_oracle",
                    "--greedy",
                    "--max-new-tokens",
                    "4",
                    "--output",
                    f"{name}.json",
                    "--reference",
                    str(shift_files / "model"),
                ]
            )
            == 0
        )
        scores[name] = json.load(open(f"{name}.json"))
    assert abs(scores["final"]["metrics"]["eval/kl_to_reference"]) > 1e-4  # trained away from the base model
    assert scores["checkpoint-2"]["metrics"] == pytest.approx(scores["final"]["metrics"])
    assert [s["completion"] for s in scores["checkpoint-2"]["samples"]] == [
        s["completion"] for s in scores["final"]["samples"]
    ]


def test_eval_of_a_checkpoint_without_a_recorded_model_is_one_line(tmp_path, shift_files, capsys):
    ckpt = tmp_path / "run" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    (ckpt / "policy.safetensors").write_bytes(b"")
    (tmp_path / "run" / "config.yaml").write_text("algorithm: grpo\n")
    assert (
        main(
            [
                "eval",
                "--model",
                str(ckpt),
                "--dataset",
                str(shift_files / "eval_prompts.jsonl"),
                "--reward",
                "shift_oracle",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "checkpoint-1" in err and "model" in err and len(err.splitlines()) == 1


def test_kto_trains_on_the_shift_pairs_split_in_two(shift_files, capsys):
    """``rlhfkit kto`` on the embedded task's preference pairs (each pair two unpaired rows): a run
    directory with a final model, a checkpoint that ``rlhfkit eval`` reads as a KTO run's policy,
    and the KL estimate in metrics.jsonl."""
    from rlhfkit.jobs import checkpoint_policy

    args = [
        "kto",
        f"model={shift_files / 'model'}",
        f"train_dataset={shift_files / 'pairs.jsonl'}",
        "max_steps=2",
        "batch_size=4",
        "save_steps=2",
        "learning_rate=1e-3",
        "output_dir=runs/kto",
        "--quiet",
    ]
    assert main(args) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in open("runs/kto/metrics.jsonl")]
    assert "kl" in rows[-1] and "kto/loss" in rows[-1]
    assert (shift_files.parent.parent / "runs" / "kto" / "final").is_dir()
    assert checkpoint_policy("runs/kto/checkpoint-2") is not None
