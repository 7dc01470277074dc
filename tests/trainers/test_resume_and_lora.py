"""Checkpoints, resume and LoRA in the SFT and reward-model trainers (the DPO trainer's are in
test_dpo.py): a resumed run ends with exactly the weights of the uninterrupted one (dropout on,
warmup + cosine, an epoch boundary crossed), checkpoints are pruned to save_total_limit, and LoRA
trains adapters only and saves merged or as an adapter."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.models import ScalarModel
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers.reward_model import RewardModelConfig, RewardModelTrainer
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

from .test_reward_model import oracle_pairs
from .test_sft import PAIRS

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def with_dropout(model, p=0.1):
    """Attention dropout on, so the RNG state a checkpoint restores decides the result."""
    for module in model.modules():
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = p
    return model


def sft(out, peft=None, **overrides):
    tok = char_tokenizer()
    args = dict(
        learning_rate=3e-3,
        batch_size=4,
        grad_accumulation=2,
        max_steps=6,
        warmup_steps=2,
        lr_scheduler="cosine",
        log_every=0,
        output_dir=str(out),
    )  # 16 rows, 8 a step: 2 epochs
    args.update(overrides)
    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(**LORA)
    return SFTTrainer(
        with_dropout(tiny_causal_lm(tok, hidden_size=32, seed=0)),
        SFTConfig(**args),
        PAIRS,
        processing_class=tok,
        peft_config=peft_config,
    )


def rm(out, peft=None, **overrides):
    tok = char_tokenizer()
    args = dict(learning_rate=1e-3, batch_size=8, max_steps=5, warmup_steps=1, log_every=0, output_dir=str(out))
    args.update(overrides)  # 20 pairs, 8 a step: 3 steps an epoch
    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(**LORA)
    return RewardModelTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        RewardModelConfig(**args),
        oracle_pairs(20, 0),
        processing_class=tok,
        peft_config=peft_config,
    )


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_equal_states(a, b):
    assert set(a) == set(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_resumed_sft_run_ends_with_the_uninterrupted_weights(tmp_path, lora):
    plain = sft(tmp_path / "plain", lora)
    plain.train()
    saving = sft(tmp_path / "a", lora, save_steps=3)
    saving.train()
    assert_equal_states(state(plain.model), state(saving.model))  # saving changes nothing
    resumed = sft(tmp_path / "b", lora, resume_from=str(tmp_path / "a" / "checkpoint-3"))
    assert (resumed.step, resumed.epoch) == (3, 1)
    resumed.train()
    assert_equal_states(state(saving.model), state(resumed.model))
    assert metrics(tmp_path / "b") == [r for r in metrics(tmp_path / "a") if r["step"] > 3]
    if lora:  # the checkpoint holds the adapter only
        from rlhfkit.run.checkpoint import read_dcp_metadata

        saved = read_dcp_metadata(tmp_path / "a" / "checkpoint-3" / "dcp").state_dict_metadata
        assert all("lora_" in k for k in saved if not k.startswith("optimizer."))


def test_a_resumed_reward_model_ends_with_the_uninterrupted_weights_and_offset(tmp_path):
    full = rm(tmp_path / "a", save_steps=2)
    full.train()
    for checkpoint in ("checkpoint-2", "checkpoint-4"):
        resumed = rm(tmp_path / checkpoint, resume_from=str(tmp_path / "a" / checkpoint))
        resumed.train()
        assert_equal_states(state(full.model), state(resumed.model))
        assert float(resumed.model.offset) == float(full.model.offset) != 0.0
    # the last checkpoint (after centring): nothing left to train, final/ keeps the offset
    (tmp_path / "a" / "checkpoint-5").exists() or full.save_checkpoint(tmp_path / "a" / "checkpoint-5")
    last = rm(tmp_path / "last", resume_from=str(tmp_path / "a" / "checkpoint-5"))
    last.train()
    saved = [ScalarModel.from_pretrained(tmp_path / name / "final") for name in ("a", "last")]
    assert float(saved[1].offset) == float(saved[0].offset)
    assert_equal_states(saved[0].state_dict(), saved[1].state_dict())


def test_save_total_limit_keeps_the_newest_checkpoints_and_nothing_else_is_touched(tmp_path):
    (tmp_path / "run").mkdir()
    t = sft(tmp_path / "run", save_steps=1, save_total_limit=2, max_steps=4, overwrite=True)
    (tmp_path / "run" / "notes.txt").write_text("mine")
    t.train()
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert [n for n in names if n.startswith("checkpoint-")] == ["checkpoint-3", "checkpoint-4"]
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_resuming_inside_the_run_directory_continues_it(tmp_path):
    sft(tmp_path / "run", save_steps=3).train()
    first = metrics(tmp_path / "run")
    sft(tmp_path / "run", resume_from=str(tmp_path / "run" / "checkpoint-3")).train()  # no "already exists"
    assert metrics(tmp_path / "run") == first  # rows after step 3 were dropped, then written again, the same
    sft(tmp_path / "run", resume_from="latest", save_steps=3).train()  # checkpoint-6: nothing left to do
    assert metrics(tmp_path / "run") == first
    with pytest.raises(ValueError, match="resume_from='latest': no complete checkpoint"):
        sft(tmp_path / "empty", resume_from="latest")
    assert (tmp_path / "run" / "config-resume-checkpoint-3.yaml").exists()
    with pytest.raises(ValueError, match="is not a checkpoint directory"):
        sft(tmp_path / "other", resume_from=str(tmp_path / "run" / "final"))


def test_lora_sft_trains_adapters_and_saves_merged_or_as_an_adapter(tmp_path):
    from peft import PeftModel

    merged = sft(tmp_path / "merged", peft=True)
    assert all("lora_" in n for n, p in merged.model.named_parameters() if p.requires_grad)
    merged.train()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    merged.model.eval()
    with torch.no_grad():
        expected = merged.model(input_ids=ids).logits
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "final")
    assert not list((tmp_path / "merged" / "final").glob("adapter_*"))
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)
    base = tiny_causal_lm(char_tokenizer(), hidden_size=32, seed=0)
    assert any(not torch.equal(v, base.state_dict()[k]) for k, v in loaded.state_dict().items())

    adapter = sft(tmp_path / "adapter", peft=True, save_adapter=True)
    adapter.train()
    final = tmp_path / "adapter" / "final"
    assert (final / "adapter_config.json").exists() and (final / "adapter_model.safetensors").exists()
    assert not (final / "model.safetensors").exists()
    reloaded = PeftModel.from_pretrained(tiny_causal_lm(char_tokenizer(), hidden_size=32, seed=0), final).eval()
    adapter.model.eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, adapter.model(input_ids=ids).logits, atol=1e-6)


def test_lora_reward_model_trains_adapters_and_head_and_saves_merged(tmp_path):
    t = rm(tmp_path / "run", peft=True)
    base = {k: v for k, v in state(t.model.backbone.get_base_model()).items() if "lora_" not in k}
    head = state(t.model.head)
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert "head.weight" in trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
    t.train()
    assert_equal_states(base, {k: v for k, v in state(t.model.backbone.get_base_model()).items() if k in base})
    assert not torch.equal(head["weight"], t.model.head.weight)
    saved = ScalarModel.from_pretrained(tmp_path / "run" / "final")
    ids, mask = torch.tensor([[5, 6, 7, 2]]), torch.ones(1, 4, dtype=torch.long)
    t.model.eval()
    with torch.no_grad():
        assert torch.allclose(saved.score(ids, mask), t.model.score(ids, mask), atol=1e-5)


def test_a_lora_reward_model_saves_its_adapter_and_head_when_asked(tmp_path, tiny_model_dir):
    from peft import LoraConfig

    t = RewardModelTrainer(
        tiny_model_dir,
        RewardModelConfig(
            learning_rate=1e-3,
            batch_size=8,
            max_steps=3,
            log_every=0,
            output_dir=str(tmp_path / "run"),
            save_adapter=True,
        ),
        oracle_pairs(16, 0),
        peft_config=LoraConfig(**LORA),
    )
    t.train()
    final = tmp_path / "run" / "final"
    assert (final / "adapter_model.safetensors").exists() and not (final / "model.safetensors").exists()
    loaded = ScalarModel.from_pretrained(final)  # the base named in adapter_config.json, adapter and head on it
    ids, mask = torch.tensor([[5, 6, 7, 2]]), torch.ones(1, 4, dtype=torch.long)
    t.model.eval()
    with torch.no_grad():
        assert torch.allclose(loaded.score(ids, mask), t.model.score(ids, mask), atol=1e-5)
    assert float(loaded.offset) == pytest.approx(float(t.model.offset))


def test_the_cli_trains_lora_and_records_it(tmp_path, monkeypatch):
    import yaml

    from rlhfkit.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/shift"]) == 0
    assert (
        main(
            [
                "sft",
                "model=data/shift/model",
                "train_dataset=data/shift/sft.jsonl",
                "max_steps=2",
                "lora_r=4",
                "lora_target_modules=q_proj,v_proj",
                "output_dir=run",
                "--quiet",
            ]
        )
        == 0
    )
    recorded = yaml.safe_load(open("run/config.yaml"))
    assert recorded["lora_r"] == 4 and recorded["lora_target_modules"] == "q_proj,v_proj"
    AutoModelForCausalLM.from_pretrained("run/final")  # merged


@pytest.mark.parametrize("command", ["sft", *(pytest.param(c, marks=pytest.mark.slow) for c in ("dpo", "rm"))])
def test_eval_takes_a_checkpoint_of_each_trainer(tmp_path, monkeypatch, capsys, command):
    from rlhfkit.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/shift"]) == 0
    data = "data/shift/sft.jsonl" if command == "sft" else "data/shift/pairs.jsonl"
    assert (
        main(
            [
                command,
                "model=data/shift/model",
                f"train_dataset={data}",
                "max_steps=2",
                "save_steps=2",
                "lora_r=4",
                "output_dir=run",
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        [
            "eval",
            "--model",
            "run/checkpoint-2",
            "--dataset",
            "data/shift/eval_prompts.jsonl",
            "--reward",
            "shift_oracle",
        ]
    )
    err = capsys.readouterr().err
    if command == "rm":
        assert code == 2 and "holds no policy" in err and err.count("\n") == 1
    else:
        assert code == 0, err


def test_a_learning_rate_changed_on_resume_takes_effect(tmp_path):
    sft(tmp_path / "a", save_steps=3, lr_scheduler="constant", warmup_steps=0, weight_decay=0.0).train()
    resumed = sft(
        tmp_path / "b",
        resume_from=str(tmp_path / "a" / "checkpoint-3"),
        lr_scheduler="constant",
        warmup_steps=0,
        learning_rate=1e-4,
        weight_decay=0.01,
    )
    group = resumed.run.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(1e-4) and group["initial_lr"] == pytest.approx(1e-4)
    assert group["weight_decay"] == 0.01 and resumed.run.scheduler.get_last_lr()[0] == pytest.approx(1e-4)
    history = resumed.train()
    assert [r["sft/lr"] for r in history] == pytest.approx([1e-4] * 3)


def test_a_seed_changed_on_resume_is_refused_in_one_line(tmp_path):
    sft(tmp_path / "a", save_steps=3).train()
    with pytest.raises(ValueError) as err:
        sft(tmp_path / "b", resume_from=str(tmp_path / "a" / "checkpoint-3"), seed=1)
    assert "the checkpoint was saved with seed=0 (now 1)" in str(err.value) and "\n" not in str(err.value)


def test_a_fixed_kl_coef_changed_on_resume_takes_effect(tmp_path):
    from rlhfkit.config import RLConfig
    from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
    from rlhfkit.trainers import RLTrainer

    def rl(**overrides):
        tok = char_tokenizer()
        args = dict(algorithm="grpo", max_steps=2, max_new_tokens=4, prompts_per_step=2, log_every=0, save_steps=1)
        args.update(overrides)
        return RLTrainer(
            tiny_causal_lm(tok, hidden_size=32),
            [fraction_of_a],
            RLConfig(**args),
            train_dataset=PROMPTS,
            processing_class=tok,
        )

    rl(output_dir=str(tmp_path / "a"), kl_coef=0.04).train()
    resumed = rl(output_dir=str(tmp_path / "b"), kl_coef=0.2, resume_from=str(tmp_path / "a" / "checkpoint-1"))
    assert resumed.kl_ctl.value == 0.2
