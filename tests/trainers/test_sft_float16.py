"""SFT of a float16 model (``models/master_weights.py``): the trained weights are float32 masters
during the run and float16 again at its end (``trainer.model`` and ``final/``); every update counts,
where float16 AdamW loses them and, at a high learning rate, ends in non-finite numbers."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.tasks.tiny import char_tokenizer, save_tiny_model
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["cat", "dog", "sun", "pen", "box", "cup", "hat", "map", "owl", "fig", "jam", "kit"]
PAIRS = [{"prompt": f"{w}=", "completion": w[::-1] * 3} for w in WORDS]


@pytest.mark.parametrize("autocast", [None, "bfloat16"])
def test_a_float16_model_trains_on_float32_masters_and_leaves_in_float16(autocast, tmp_path):
    path = save_tiny_model(tmp_path / "tiny", tokenizer=char_tokenizer(), seed=0)
    args = SFTConfig(
        dtype="float16",
        autocast=autocast,
        learning_rate=0.1,
        batch_size=4,
        max_steps=8,
        log_every=0,
        lr_scheduler="constant",
        output_dir=str(tmp_path / "out"),
        device="cpu",
    )
    trainer = SFTTrainer(path, args, PAIRS)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert {p.dtype for p in trainer.run.optimizer.param_groups[0]["params"]} == {torch.float32}
    history = trainer.train()
    assert all(r["perf/skipped_steps"] == 0 for r in history)
    for name, param in trainer.model.named_parameters():
        assert param.dtype == torch.float16 and torch.isfinite(param).all(), name
        assert not torch.equal(param, before[name]), f"{name} did not move"
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final", dtype="auto")
    assert {p.dtype for p in final.parameters()} == {torch.float16}
    assert all(torch.equal(p, trainer.model.get_parameter(n)) for n, p in final.named_parameters())
