"""One writer of config.yaml: the trainer records its whole job — config plus model, data and
reward sources — the same way whether it was started from Python or by `rlhfkit`, so the record
repeats the run and `rlhfkit eval --model <run>/checkpoint-N` works for Python runs too."""

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rlhfkit import RLConfig, RLTrainer, SFTConfig, SFTTrainer
from rlhfkit.cli import main
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a


def test_a_python_rl_run_records_its_sources_and_the_cli_repeats_and_evaluates_it(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "py"
    args = RLConfig(
        algorithm="grpo",
        max_steps=2,
        max_new_tokens=4,
        prompts_per_step=2,
        save_steps=2,
        log_every=0,
        progress_bar=False,
        output_dir=str(run),
    )
    RLTrainer(str(tiny_model_dir), [fraction_of_a], args, train_dataset=PROMPTS).train()
    record = yaml.safe_load((run / "config.yaml").read_text())
    assert record["model"] == str(tiny_model_dir)
    assert record["reward_funcs"] == ["rlhfkit.tasks.toy:fraction_of_a"]
    assert record["train_dataset"] == str(run / "data" / "train_dataset.jsonl") and record["eval_dataset"] is None
    assert record["max_steps"] == 2 and record["algorithm"] == "grpo"

    assert main(["rl", "--config", str(run / "config.yaml"), f"output_dir={tmp_path / 'cli'}", "--quiet"]) == 0
    first, again = (load_file(str(d / "final" / "model.safetensors")) for d in (run, tmp_path / "cli"))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text())["train_dataset"] == record["train_dataset"]

    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--model",
                str(run / "checkpoint-2"),
                "--dataset",
                record["train_dataset"],
                "--reward",
                record["reward_funcs"][0],
                "--greedy",
                "--max-new-tokens",
                "4",
            ]
        )
        == 0
    )
    assert "fraction_of_a_mean" in capsys.readouterr().out


def test_lora_settings_and_reward_weights_are_recorded(tmp_path, tiny_model_dir):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj", "q_proj"], lora_dropout=0.0)
    args = RLConfig(max_steps=0, log_every=0, output_dir=str(tmp_path))
    RLTrainer(
        str(tiny_model_dir),
        ["rlhfkit.tasks.toy:fraction_of_a"],
        args,
        train_dataset=PROMPTS,
        reward_weights=[0.5],
        peft_config=lora,
    )
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (record["lora_r"], record["lora_alpha"], record["lora_target_modules"]) == (4, 8, "q_proj,v_proj")
    assert record["reward_weights"] == [0.5]


def test_a_reward_function_no_one_can_import_is_recorded_as_such_and_refused_clearly(tmp_path, tiny_model_dir, capsys):
    def local_reward(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    RLTrainer(
        str(tiny_model_dir),
        [local_reward],
        RLConfig(max_steps=0, log_every=0, output_dir=str(tmp_path / "r")),
        train_dataset=PROMPTS,
    )
    record = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert record["reward_funcs"] == [
        "<not importable: local_reward — defined inside a function, where no import path "
        "reaches; define it at the top of a module and pass 'module:local_reward'>"
    ]
    assert main(["rl", "--config", str(tmp_path / "r" / "config.yaml"), f"output_dir={tmp_path / 'again'}"]) == 2
    err = capsys.readouterr().err
    assert "cannot be imported" in err and "package.module:function" in err and len(err.strip().splitlines()) == 1


SCRIPT = """from rlhfkit import RLConfig, RLTrainer
from rlhfkit.tasks.toy import PROMPTS


def reward_len(completions, **kwargs):
    return [-abs(3 - len(c)) for c in completions]

{run}RLTrainer({model!r}, [reward_len], RLConfig(algorithm="grpo", max_steps={steps}, max_new_tokens=4,
               prompts_per_step=2, log_every=0, progress_bar=False, output_dir={out!r}), train_dataset=PROMPTS).train()
"""


def test_a_reward_function_of_the_script_being_run_is_recorded_to_repeat_the_run_or_says_why_not(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    import runpy
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "scripts").mkdir()
    guarded = tmp_path / "scripts" / "train.py"  # run as `python scripts/train.py`: its run under the __main__ guard
    guarded.write_text(
        SCRIPT.format(run='if __name__ == "__main__":\n    ', model=str(tiny_model_dir), steps=1, out="run")
    )
    runpy.run_path(str(guarded), run_name="__main__")
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["reward_funcs"] == [
        "scripts.train:reward_len"
    ]
    try:
        assert main(["rl", "--config", "run/config.yaml", "output_dir=again", "--quiet"]) == 0
    finally:
        for name in ("scripts.train", "scripts"):
            sys.modules.pop(name, None)
    first, again = (load_file(str(tmp_path / d / "final" / "model.safetensors")) for d in ("run", "again"))
    assert all(torch.equal(first[k], again[k]) for k in first)

    plain = tmp_path / "plain.py"  # TRL's quickstart style: the run at the top level, which an import would start
    plain.write_text(SCRIPT.format(run="", model=str(tiny_model_dir), steps=0, out="plain_run"))
    runpy.run_path(str(plain), run_name="__main__")
    recorded = yaml.safe_load((tmp_path / "plain_run" / "config.yaml").read_text())["reward_funcs"]
    assert recorded == [
        f"<not importable: reward_len — defined in the script {plain}, which a rerun cannot import: "
        "importing it would run its line 8 (guard the run of the script with if __name__ == "
        "\"__main__\":); move it into a module (e.g. rewards.py) and pass 'rewards:reward_len'>"
    ]
    capsys.readouterr()
    assert main(["rl", "--config", "plain_run/config.yaml", "output_dir=plain_again"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot be imported" in err and "guard the run of the script" in err and len(err.splitlines()) == 1


def test_a_python_sft_run_records_its_job_and_the_cli_repeats_it(tmp_path, tiny_model_dir):
    data = [{"prompt": "ab", "completion": "aaa"}, {"prompt": "cd", "completion": "aa"}]
    args = SFTConfig(
        learning_rate=1e-3, max_steps=2, batch_size=2, log_every=0, progress_bar=False, output_dir=str(tmp_path / "sft")
    )
    SFTTrainer(str(tiny_model_dir), args, train_dataset=data).train()
    record = yaml.safe_load((tmp_path / "sft" / "config.yaml").read_text())
    assert record["model"] == str(tiny_model_dir) and record["train_dataset"].endswith("data/train_dataset.jsonl")
    assert (
        main(["sft", "--config", str(tmp_path / "sft" / "config.yaml"), f"output_dir={tmp_path / 'again'}", "--quiet"])
        == 0
    )
    first, again = (load_file(str(tmp_path / d / "final" / "model.safetensors")) for d in ("sft", "again"))
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_a_model_object_without_a_directory_is_recorded_empty(tmp_path):
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

    tok = char_tokenizer()
    RLTrainer(
        tiny_causal_lm(tok),
        [fraction_of_a],
        RLConfig(max_steps=0, log_every=0, output_dir=str(tmp_path)),
        train_dataset=PROMPTS,
        processing_class=tok,
    )
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"] == ""
    with pytest.raises(ValueError, match="does not name the run's model"):
        from rlhfkit.jobs import checkpoint_policy

        (tmp_path / "checkpoint-0").mkdir()
        (tmp_path / "checkpoint-0" / "trainer_state.json").write_text("{}")
        (tmp_path / "checkpoint-0" / "policy.safetensors").write_text("")
        checkpoint_policy(tmp_path / "checkpoint-0")


def test_record_run_never_stops_a_run_and_keeps_what_it_can(tmp_path, tiny_model_dir):
    import numpy as np
    from peft import LoraConfig

    from rlhfkit.models import ScalarModel
    from rlhfkit.run.record import reward_source
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

    rows = [{"prompt": "ab", "answer": np.int64(3)}, {"prompt": "cd", "answer": np.float32(0.5)}]
    RLTrainer(
        str(tiny_model_dir),
        [fraction_of_a],
        RLConfig(max_steps=0, log_every=0, output_dir=str(tmp_path)),
        train_dataset=rows,
        peft_config=LoraConfig(r=2),
    )  # peft picks the target modules
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    # recorded once the model is built: the modules peft picked for the architecture, so a rerun gets them
    assert record["lora_r"] == 2 and record["lora_target_modules"] == "q_proj,v_proj"
    written = (tmp_path / "data" / "train_dataset.jsonl").read_text().splitlines()
    assert [yaml.safe_load(line)["answer"] for line in written] == [3, 0.5]

    rm = ScalarModel.from_causal_lm(tiny_causal_lm(char_tokenizer()))
    assert reward_source(rm).startswith("<not importable")  # a fresh head: no directory holds it
    rm.save_pretrained(tmp_path / "rm")
    assert reward_source(ScalarModel.from_pretrained(tmp_path / "rm")) == str(tmp_path / "rm")
    assert reward_source(ScalarModel.from_pretrained(tiny_model_dir)).startswith("<not importable")


def test_the_report_shows_what_the_preset_filled(tmp_path):
    from rlhfkit.config import save_config
    from rlhfkit.report import _config_section

    save_config(RLConfig(algorithm="rloo"), tmp_path / "config.yaml")
    page = _config_section(tmp_path)
    assert "vanilla (rloo preset)" in page and "True (rloo preset)" in page  # policy_loss, kl_in_reward
