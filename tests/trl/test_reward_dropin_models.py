"""The reward drop-in's model and data as TRL's RewardTrainer takes them (rlhfkit/trl/reward.py,
reward_models.py): ``trainer.model`` is the sequence classifier TRL trains (an object, a peft model
of one, or one built from a directory), ``peft_config`` trains what peft makes trainable,
tokenised rows (and TRL's deprecated column names), and chat rows with tool calls, ``tools`` and
``chat_template_kwargs`` tokenised as TRL tokenises them."""

import json
import warnings

import datasets
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from rlhfkit.trl import RewardConfig, RewardTrainer

from .test_supervised_dropin import BOT, CPU, USER
from .test_supervised_evaluation import TEXT_PREFS

pytestmark = pytest.mark.usefixtures("one_thread")

peft = pytest.importorskip("peft")


def args(tmp_path, **fields):
    fields = {"per_device_train_batch_size": 2, "max_steps": 2, "learning_rate": 1e-2, **CPU, **fields}
    return RewardConfig(output_dir=str(tmp_path / "out"), **fields)


def train_and_diff(trainer) -> set[str]:
    """Train; the names of the parameters of ``trainer.model`` that changed."""
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    return {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}


def hf_score(model, trainer, text: str) -> float:
    ids = torch.tensor([trainer.processing_class(text)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, 0].item()


def test_a_sequence_classifier_object_is_what_trains(models, tmp_path):
    seq = AutoModelForSequenceClassification.from_pretrained(models["plain"], num_labels=1)
    trainer = RewardTrainer(seq, args=args(tmp_path), train_dataset=TEXT_PREFS)
    assert trainer.model is seq
    changed = train_and_diff(trainer)
    assert "score.weight" in changed and any(n.startswith("model.layers.") for n in changed)
    # the loop scores with the classifier's own modules: its logits are the trained scores
    text = "abcd" + trainer.processing_class.eos_token
    ids = torch.tensor([trainer.processing_class(text)["input_ids"]])
    with torch.no_grad():
        ours = trainer.scalar_model.score(ids, torch.ones_like(ids)).item()
    assert hf_score(seq, trainer, text) == pytest.approx(ours, abs=1e-5)


def test_a_classifier_with_more_than_one_label_is_refused_with_trls_message(models, tmp_path):
    seq = AutoModelForSequenceClassification.from_pretrained(models["plain"], num_labels=2)
    with pytest.raises(ValueError, match=r"The model has `num_labels=2`, but reward models require `num_labels=1`"):
        RewardTrainer(seq, args=args(tmp_path), train_dataset=TEXT_PREFS)


@pytest.mark.parametrize("save_head", [False, True])
def test_peft_config_trains_what_peft_makes_trainable_as_in_trl(save_head, models, tmp_path):
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["score"] if save_head else None)
    trainer = RewardTrainer(models["plain"], args=args(tmp_path), train_dataset=TEXT_PREFS, peft_config=lora)
    assert isinstance(trainer.model, peft.PeftModel) and {"trl", "reward-trainer"} <= set(trainer.model.model_tags)
    changed = train_and_diff(trainer)
    assert changed and all("lora_" in n or "modules_to_save" in n for n in changed)
    assert any("lora_B" in n for n in changed)
    assert ("base_model.model.score.modules_to_save.default.weight" in changed) == save_head
    assert "base_model.model.score.weight" not in changed  # the base head stays (TRL: unless modules_to_save)
    # saved merged: transformers loads a classifier that scores as the trained model does
    trainer.save_model(tmp_path / "saved")
    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved")
    text = "xyz" + trainer.processing_class.eos_token
    assert hf_score(saved, trainer, text) == pytest.approx(hf_score(trainer.model, trainer, text), abs=1e-4)


def test_a_peft_model_object_trains_its_adapter_and_refuses_a_second_config(models, tmp_path):
    seq = AutoModelForSequenceClassification.from_pretrained(models["plain"], num_labels=1)
    model = peft.get_peft_model(seq, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(ValueError, match="You passed a `PeftModel` instance together with a `peft_config`"):
        RewardTrainer(model, args=args(tmp_path), train_dataset=TEXT_PREFS, peft_config=peft.LoraConfig())
    trainer = RewardTrainer(model, args=args(tmp_path), train_dataset=TEXT_PREFS)
    assert trainer.model is model
    changed = train_and_diff(trainer)
    assert changed and all("lora_" in n for n in changed)


def test_tokenised_rows_are_used_as_they_are_and_trls_old_names_warn(models, tmp_path):
    rows = [{"chosen_ids": [5, 6, 7], "rejected_ids": [5, 8]}, {"chosen_ids": [9, 10], "rejected_ids": [11]}]
    rows.append({"chosen_ids": list(range(3, 40)), "rejected_ids": [3]})  # longer than max_length: dropped
    trainer = RewardTrainer(models["plain"], args=args(tmp_path, max_length=16), train_dataset=rows)
    assert trainer.train_dataset[:]["chosen_ids"] == [[5, 6, 7], [9, 10]]
    old = datasets.Dataset.from_list(
        [{"chosen_input_ids": r["chosen_ids"], "rejected_input_ids": r["rejected_ids"]} for r in rows[:2]]
    )
    with pytest.warns(FutureWarning, match="will not be supported in v1"):
        trainer = RewardTrainer(models["plain"], args=args(tmp_path / "old"), train_dataset=old)
    assert trainer.train_dataset.column_names == ["chosen_ids", "rejected_ids"]
    assert trainer.train_dataset[:]["rejected_ids"] == [[5, 8], [11]]
    trainer.train()


# A template that renders tool calls, the tools and a keyword of its own (``shout``)
TEMPLATE = (
    "{%- if tools %}<|im_start|>tools:{% for t in tools %}{{ t.function.name }}{% endfor %}<|im_end|>{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role | upper if shout else m.role }}:"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }}{% endfor %}{% endif %}"
    "{%- if m.content %}{{ m.content }}{% endif %}<|im_end|>{% endfor %}"
)
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"type": "function", "function": {"name": "clock", "arguments": {}}}],
}
TOOLS = [{"type": "function", "function": {"name": "clock", "description": "now", "parameters": {"type": "object"}}}]


def test_chat_rows_with_tool_calls_tools_and_template_keywords_are_tokenised_as_trl_does(models, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["chat"])
    tok.chat_template = TEMPLATE
    rows = [
        {
            "prompt": [USER("time?")],
            "chosen": [CALL, {"role": "tool", "content": "9"}, BOT("it is 9")],
            "rejected": [CALL, {"role": "tool", "content": "9"}, BOT("no")],
            "tools": json.dumps(TOOLS) if i == 0 else TOOLS,  # a JSON string (TRL's datasets) or the list
            "chat_template_kwargs": {"shout": i == 1},
        }
        for i in range(2)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no row is dropped or cut
        trainer = RewardTrainer(models["chat"], args=args(tmp_path), train_dataset=rows, processing_class=tok)
    for i, row in enumerate(rows):
        expected = tok.apply_chat_template(
            row["prompt"] + row["chosen"], tools=TOOLS, tokenize=True, return_dict=True, shout=i == 1
        )["input_ids"]
        assert trainer.train_dataset[i]["chosen_ids"] == list(expected)
    text = tok.decode(trainer.train_dataset[1]["chosen_ids"])
    assert "tools:clock" in text and "ASSISTANT:call clock" in text and "TOOL:9" in text
    trainer.train()
