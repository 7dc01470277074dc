"""The SFT drop-in's TRL forms beyond test_supervised_dropin.py: TRL's loss types, the dataset forms
TRL's SFTTrainer takes (tokenised rows, ``conversations`` of from/value messages, conversational
completions of several messages), packing strategies, TRL's refusals, and a float16 model."""

import pytest

from rlhfkit.trl import SFTConfig

from .test_supervised_dropin import CPU, STORIES

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_trls_loss_types_are_rlhfkits(loss_type, tmp_path):
    assert SFTConfig(output_dir=str(tmp_path), loss_type=loss_type, **CPU).to_rlhfkit(8).loss_type == loss_type


def _sft(models, tmp_path, rows, processing_class=None, **fields):
    from rlhfkit.trl import SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "out"), **{"max_steps": 1, "learning_rate": 1e-3, **CPU, **fields})
    model = models["plain" if processing_class is None else "chat"]
    return SFTTrainer(model, args=args, train_dataset=rows, processing_class=processing_class)


def _trained(trainer) -> list[list[int]]:
    from rlhfkit.data.sft import IGNORE_INDEX, example_labels

    return [[int(label != IGNORE_INDEX) for label in example_labels(u[0])] for u in trainer.units]


@pytest.mark.parametrize("completion_only_loss, expected", [(None, [0, 1, 1, 1]), (True, [0, 0, 1, 1])])
def test_tokenised_rows_train_as_trls(completion_only_loss, expected, models, tmp_path):
    # TRL's completion_only_loss=None is True for prompt-completion rows only: a tokenised row's mask is then unused
    row = {"input_ids": [5, 6, 7, 8], "completion_mask": [0, 0, 1, 1]}
    trainer = _sft(models, tmp_path, [row, row], completion_only_loss=completion_only_loss)
    assert _trained(trainer) == [expected, expected]
    trainer.train()


def test_tokenised_rows_left_untrained_by_max_length_are_dropped_as_trl_does(models, tmp_path):
    rows = [
        {"input_ids": [1, 2, 3, 4, 5], "assistant_masks": [0, 0, 0, 1, 1]},
        {"input_ids": [6, 7, 8], "assistant_masks": [1, 1, 1]},
    ]
    with pytest.warns(UserWarning, match="dropped 1 of 2 rows"):
        trainer = _sft(models, tmp_path, rows, max_length=3)
    assert [u[0].input_ids for u in trainer.units] == [[6, 7, 8]]


def test_token_ids_outside_the_models_vocabulary_are_one_line(models, tmp_path):
    with pytest.raises(ValueError, match=r"^train_dataset: example 0 \(0-based\) holds token id 999999, outside"):
        _sft(models, tmp_path, [{"input_ids": [1, 999999]}])


def test_a_float16_model_trains_as_trls_test_trains_it(models, tmp_path):
    # TRL's test_train_model_dtype: float16 weights, learning_rate=0.1; TRL 1.16 itself ends with every weight NaN
    import torch

    trainer = _sft(
        models,
        tmp_path,
        [{"text": "once upon a time"}] * 8,
        max_steps=3,
        learning_rate=0.1,
        model_init_kwargs={"dtype": torch.float16},
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    for name, param in trainer.model.named_parameters():
        assert param.dtype == torch.float16 and torch.isfinite(param).all() and not torch.equal(param, before[name])


def test_conversations_of_from_value_messages_train_as_messages_rows(models, tmp_path):
    from rlhfkit.tasks.tiny import chatml_tokenizer

    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    tok = chatml_tokenizer()
    rows = [{"conversations": [{"from": m["role"], "value": m["content"]} for m in chat["messages"]]}]
    as_messages = _sft(models, tmp_path, [chat] * 2, processing_class=tok)
    as_conversations = _sft(models, tmp_path, rows * 2, processing_class=tok)
    assert [u[0] for u in as_conversations.units] == [u[0] for u in as_messages.units]


def test_trls_padding_free_check(models, tmp_path):
    with pytest.raises(ValueError, match=r"^When `padding_free=True` without packing, `max_length` is not enforced"):
        _sft(models, tmp_path, STORIES, padding_free=True)
    assert _sft(models, tmp_path, STORIES, padding_free=True, max_length=None).units


def test_a_dataset_with_a_transform_is_refused_with_trls_message(models, tmp_path):
    from datasets import Dataset

    dataset = Dataset.from_list(STORIES).with_transform(lambda batch: batch)
    with pytest.raises(ValueError, match=r"Dataset\.with_transform\(\).*skip_prepare_dataset.*trainer-ready"):
        _sft(models, tmp_path, dataset)


def test_skip_prepare_dataset_takes_trainer_ready_rows_as_they_are(models, tmp_path):
    ready = [{"input_ids": [5, 6, 7, 8, 9], "labels": [-100, -100, 7, 8, 9]}] * 2
    trainer = _sft(models, tmp_path, ready, max_length=3, dataset_kwargs={"skip_prepare_dataset": True})
    assert [u[0].input_ids for u in trainer.units] == [[5, 6, 7, 8, 9]] * 2  # neither truncated nor filtered
    assert _trained(trainer) == [[0, 0, 1, 1, 1]] * 2
    masks_only = [{"input_ids": [1, 2, 3], "assistant_masks": [0, 1, 1]}] * 2
    with pytest.raises(ValueError, match=r"^The train dataset has mask columns but no 'labels'.*Add a 'labels' column"):
        _sft(models, tmp_path, masks_only, dataset_kwargs={"skip_prepare_dataset": True})
    with pytest.raises(ValueError, match=r"^train dataset row index 0 \(0-based\) has no 'input_ids'"):
        _sft(models, tmp_path, STORIES, dataset_kwargs={"skip_prepare_dataset": True})


def test_a_mixture_of_experts_model_needs_router_aux_loss_coef_zero(tmp_path):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from rlhfkit.tasks.tiny import char_tokenizer
    from rlhfkit.trl import SFTTrainer

    tok = char_tokenizer()
    config = Qwen2MoeConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=16,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=2,
        num_experts_per_tok=1,
        router_aux_loss_coef=0.01,
    )
    moe = Qwen2MoeForCausalLM(config)

    def build(**fields):
        args = SFTConfig(output_dir=str(tmp_path / "o"), max_steps=1, **{**CPU, **fields})
        return SFTTrainer(moe, args=args, train_dataset=STORIES, processing_class=tok)

    with pytest.raises(ValueError, match=r"^SFTConfig field 'router_aux_loss_coef'=0.01 is not supported by rlhfkit"):
        build()
    assert build(router_aux_loss_coef=0.0).aux_loss_enabled is False


def test_a_router_coefficient_for_a_dense_model_is_trls_error(models, tmp_path):
    with pytest.raises(ValueError, match=r"^`router_aux_loss_coef` is set to 0.5 but LlamaForCausalLM is not a"):
        _sft(models, tmp_path, STORIES, router_aux_loss_coef=0.5)
    assert _sft(models, tmp_path, STORIES).aux_loss_enabled is False


def test_wrapped_packing_is_rlhfkits_wrapped_packing(models, tmp_path):
    trainer = _sft(models, tmp_path, STORIES, packing=True, packing_strategy="wrapped", max_length=10)
    assert trainer.args.packing_strategy == "wrapped"
    lengths = [len(u[0].input_ids) for u in trainer.units]
    assert all(n == 10 for n in lengths[:-1]) and sum(lengths) > 10 * len(STORIES) // 2  # whole, cut into rows
    assert SFTConfig(output_dir=str(tmp_path), packing=True, **CPU).to_rlhfkit(8).packing_strategy == "next_fit"


def test_the_prepared_datasets_are_trls_input_ids_and_labels(models, tmp_path):
    pair = {"prompt": "abc ", "completion": "xyz"}
    trainer = _sft(models, tmp_path, [pair, *STORIES[:2]])
    view = trainer.train_dataset
    assert view.column_names == ["input_ids", "labels"]
    for ids, labels in zip(view["input_ids"], view["labels"]):
        assert len(ids) == len(labels) and all(label in (-100, t) for t, label in zip(ids, labels))
    assert sorted(sum(label == -100 for label in labels) for labels in view["labels"]) == [0, 0, 4]  # the prompt


@pytest.mark.parametrize(
    "strategy, eval_packing, train_lengths, eval_lengths",
    [("bfd", None, True, True), ("bfd", False, True, False), ("wrapped", None, False, False)],
)
def test_packed_prepared_datasets_are_trls(strategy, eval_packing, train_lengths, eval_lengths, models, tmp_path):
    from rlhfkit.trl import SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path / "o"),
        packing=True,
        packing_strategy=strategy,
        max_length=100,
        eval_packing=eval_packing,
        max_steps=1,
        **CPU,
    )
    trainer = SFTTrainer(models["plain"], args=args, train_dataset=STORIES, eval_dataset=STORIES)
    train, evals = trainer.train_dataset, trainer.eval_dataset
    assert ("seq_lengths" in train.column_names) == train_lengths
    assert ("seq_lengths" in evals.column_names) == eval_lengths
    assert len(train) < len(STORIES) and (len(evals) < len(STORIES)) == (eval_packing is not False)
    if train_lengths:  # every example whole in one row (TRL's bfd: seq_lengths add up to the row)
        assert sum(len(x) for x in train["seq_lengths"]) == len(STORIES)
        assert [sum(x) for x in train["seq_lengths"]] == [len(ids) for ids in train["input_ids"]]


def test_chat_rows_are_tokenised_as_trl_does_with_their_chat_template_kwargs(models, tmp_path):
    from rlhfkit.tasks.tiny import chatml_tokenizer

    tok = chatml_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ (m.role | upper) if loud else m.role }}:{{ m.content }};{% endfor %}"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    rows = [{"messages": chat, "chat_template_kwargs": {"loud": i == 1}} for i in range(2)]
    trainer = _sft(models, tmp_path, rows, processing_class=tok)
    texts = [tok.decode(ids) for ids in trainer.train_dataset["input_ids"]]
    assert texts == ["user:hi;assistant:yo;", "USER:hi;ASSISTANT:yo;"]  # the template's own end: no EOS added
    assert trainer.train_dataset["labels"] == trainer.train_dataset["input_ids"]  # every token trained
    with pytest.raises(ValueError, match=r"^train_dataset: row index 0 \(0-based\): chat_template_kwargs with assis"):
        _sft(models, tmp_path, rows, processing_class=tok, assistant_only_loss=True)


def test_training_arguments_as_args_become_an_sft_config_as_trl_converts_them(models, tmp_path):
    from transformers import TrainingArguments

    from rlhfkit.trl import SFTTrainer

    args = TrainingArguments(output_dir=str(tmp_path / "o"), max_steps=1, per_device_train_batch_size=2, **CPU)
    trainer = SFTTrainer(models["plain"], args=args, train_dataset=STORIES)
    config = trainer.trl_args
    assert isinstance(config, SFTConfig) and (config.max_steps, config.per_device_train_batch_size) == (1, 2)
    assert config.learning_rate == 5e-5 and config.logging_steps == 500  # TrainingArguments' defaults, as in TRL
    assert config.output_dir == str(tmp_path / "o") and (tmp_path / "o" / "config.yaml").exists()
    refused = TrainingArguments(output_dir=str(tmp_path / "o"), adam_beta1=0.8, **CPU)
    with pytest.raises(ValueError, match=r"^SFTConfig field 'adam_beta1'=0.8 is not supported by rlhfkit"):
        SFTTrainer(models["plain"], args=refused, train_dataset=STORIES)
