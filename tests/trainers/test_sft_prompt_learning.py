"""SFT with peft's prompt-learning adapters (prompt tuning, P-tuning, prefix tuning:
``rlhfkit/models/prompt_learning.py``): the loss is the model's own on the real tokens (the virtual
tokens' positions left out), only the adapter trains, ``final/`` is the adapter, and what cannot
work is refused in one line."""

import pytest
import torch
from peft import PeftModel, PrefixTuningConfig, PromptEncoderConfig, PromptTuningConfig, TaskType

from rlhfkit.data.sft import collate
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["cat", "dog", "sun", "pen", "box", "cup", "hat", "map"]
PAIRS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in WORDS]
ADAPTERS = {
    "prompt_tuning": lambda: PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4),
    "p_tuning": lambda: PromptEncoderConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4, encoder_hidden_size=32),
    "prefix_tuning": lambda: PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4),
}


def make(kind, tmp_path, **config):
    tok = char_tokenizer()
    fields = dict(learning_rate=1e-2, batch_size=4, log_every=0, max_steps=2, output_dir=str(tmp_path / kind))
    args = SFTConfig(**{**fields, **config})
    return SFTTrainer(tiny_causal_lm(tok), args, PAIRS, processing_class=tok, peft_config=ADAPTERS[kind]())


@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_the_loss_is_the_models_own_on_the_real_tokens(kind, tmp_path):
    trainer = make(kind, tmp_path)
    examples = trainer.units[:4]
    batch = collate([u[0] for u in examples], trainer.tokenizer.pad_token_id)
    with torch.no_grad():
        loss_sum, n = trainer.loss_sum(batch)
        # peft's own forward with labels: its virtual positions get label -100, the model shifts and averages
        labels = batch["labels"].masked_fill(batch["attention_mask"] == 0, -100)
        own = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
    assert n == int((labels[:, 1:] != -100).sum())
    assert (loss_sum / n).item() == pytest.approx(own.item(), rel=1e-5)


@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_only_the_adapter_trains_and_final_is_the_adapter(kind, tmp_path):
    trainer = make(kind, tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    for name, param in trainer.model.named_parameters():
        assert torch.equal(param, before[name]) != param.requires_grad, name
    final = tmp_path / kind / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    loaded = PeftModel.from_pretrained(tiny_causal_lm(char_tokenizer()), final).eval()
    ids = torch.tensor([trainer.units[0][0].input_ids])
    with torch.no_grad():  # the saved adapter computes what the trained one does (P-tuning saves its prompt table)
        assert torch.allclose(loaded(input_ids=ids).logits, trainer.model.eval()(input_ids=ids).logits, atol=1e-5)


@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_packing_is_refused_in_one_line(kind, tmp_path):
    with pytest.raises(ValueError, match=r"^packing=True is not supported with a prompt-learning adapter"):
        make(kind, tmp_path, packing=True)


def test_prefix_tuning_runs_without_activation_checkpointing(tmp_path):
    with pytest.raises(ValueError, match=r"^gradient_checkpointing is not supported with prefix tuning"):
        make("prefix_tuning", tmp_path, gradient_checkpointing="on")
    assert make("prefix_tuning", tmp_path, gradient_checkpointing="auto").args.gradient_checkpointing == "off"
    assert make("prompt_tuning", tmp_path, gradient_checkpointing="on").args.gradient_checkpointing == "on"
