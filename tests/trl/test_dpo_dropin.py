"""TRL 1.16's DPO settings on the drop-in ``rlhfkit.trl.DPOConfig`` / ``DPOTrainer``: every TRL
``loss_type`` and weighted lists of them, ``f_divergence_type``, ``ld_alpha`` and TR-DPO's
``sync_ref_model`` translated into rlhfkit's config; ``trainer.ref_model``; TRL's refusals with
``precompute_ref_log_probs`` (a streamed dataset; a dataset given to ``evaluate`` once the reference
is gone), in TRL's words where TRL's tests match them."""

import pytest
import torch
from datasets import Dataset

from rlhfkit.trl import DPOConfig, DPOTrainer
from rlhfkit.trl.dpo import LOSS_TYPES

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none", disable_tqdm=True)
PAIRS = [
    {"prompt": w, "chosen": w[::-1] + "a", "rejected": w + "zz"} for w in ["abc", "hello", "xyz", "qq", "go", "hi"]
]
HELD_OUT = [{"prompt": w, "chosen": w + "a", "rejected": w[::-1]} for w in ["cat", "dog", "sun", "moon", "sea"]]


def native(**fields):
    return DPOConfig(output_dir="out", **CPU, **fields).to_rlhfkit(n_rows=8)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_trl_loss_type_is_rlhfkits_of_that_name(loss_type):
    eps = {"label_smoothing": 1e-3} if loss_type == "exo_pair" else {}
    assert native(loss_type=loss_type, **eps).loss_type == loss_type


def test_a_list_of_losses_and_the_other_loss_settings_are_translated():
    ours = native(loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0])
    assert ours.loss_type == ("sigmoid", "bco_pair", "sft") and ours.loss_weights == (0.8, 0.2, 1.0)
    ours = native(
        f_divergence_type="alpha_divergence",
        f_alpha_divergence_coef=0.3,
        ld_alpha=0.5,
        sync_ref_model=True,
        ref_model_sync_steps=4,
        ref_model_mixup_alpha=0.9,
    )
    assert (ours.f_divergence_type, ours.f_alpha_divergence_coef, ours.ld_alpha) == ("alpha_divergence", 0.3, 0.5)
    assert (ours.sync_ref_model, ours.ref_model_sync_steps, ours.ref_model_mixup_alpha) == (True, 4, 0.9)
    assert native(loss_type="discopop", discopop_tau=0.2).discopop_tau == 0.2


def test_label_smoothing_reaches_the_losses_trl_gives_it_to():
    assert native(loss_type="robust", label_smoothing=0.1).label_smoothing == 0.1
    assert native(loss_type=["aot", "hinge"], label_smoothing=0.1).label_smoothing == 0.1
    # TRL's sigmoid ignores it where rlhfkit's reads it: with a loss that reads it, one line instead of a guess
    with pytest.raises(ValueError, match="'label_smoothing'=0.1 with loss_type=\\['sigmoid', 'robust'\\]"):
        native(loss_type=["sigmoid", "robust"], label_smoothing=0.1)


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(loss_type="exo_pair"), "Label smoothing must be greater than 0.0 when using 'exo_pair' loss"),
        (dict(loss_type="nca_pair", f_divergence_type="js_divergence"), "is only supported for the following loss"),
        (dict(loss_type=["sigmoid", "hinge"], loss_weights=[1.0]), "`loss_weights` must have the same length"),
        (dict(ld_alpha=1.5), "'ld_alpha' must be in [0, 1]"),
        (dict(sync_ref_model=True, precompute_ref_log_probs=True), "You cannot use `sync_ref_model=True` together"),
    ],
)
def test_trls_refusals_in_trls_words(fields, says):
    with pytest.raises(ValueError) as err:
        native(**fields)
    assert says in str(err.value) and "\n" not in str(err.value)


def _trainer(models, tmp_path, ref_model=None, train=None, eval_dataset=None, **fields):
    args = DPOConfig(output_dir=str(tmp_path), learning_rate=1e-2, per_device_train_batch_size=2, **CPU, **fields)
    return DPOTrainer(
        models["plain"],
        ref_model=ref_model,
        args=args,
        train_dataset=train if train is not None else Dataset.from_list(PAIRS),
        eval_dataset=eval_dataset,
    )


def test_ref_model_is_trls_attribute_and_tr_dpo_moves_it(models, tmp_path):
    from transformers import AutoModelForCausalLM

    given = AutoModelForCausalLM.from_pretrained(models["plain"])
    t = _trainer(models, tmp_path / "a", ref_model=given, max_steps=1)
    assert t.ref_model is given and t.aux_loss_enabled is False
    before = {n: p.detach().clone() for n, p in given.named_parameters()}
    t.train()
    assert all(torch.equal(p, before[n]) for n, p in given.named_parameters())  # a fixed reference stays
    synced = _trainer(models, tmp_path / "b", max_steps=2, sync_ref_model=True, ref_model_sync_steps=2)
    start = {n: p.detach().clone() for n, p in synced.ref_model.named_parameters()}
    synced.train()
    for n, p in synced.ref_model.named_parameters():  # 0.6 θ_2 + 0.4 θ_0 (TRL's default α)
        expected = 0.6 * synced.model.get_parameter(n).detach() + 0.4 * start[n]
        assert torch.allclose(p.detach(), expected, atol=1e-6), n


@pytest.mark.parametrize("where", ["train", "eval", "eval_dict"])
def test_precompute_refuses_a_stream_in_trls_words(models, tmp_path, where):
    stream = Dataset.from_list(PAIRS).to_iterable_dataset()
    train = stream if where == "train" else None
    eval_dataset = {"train": None, "eval": stream, "eval_dict": {"held_out": stream}}[where]
    with pytest.raises(ValueError, match="precompute_ref_log_probs.*not supported with IterableDataset"):
        _trainer(models, tmp_path, train=train, eval_dataset=eval_dataset, max_steps=1, precompute_ref_log_probs=True)


def test_precompute_scores_evaluation_sets_before_training_and_refuses_new_ones_after(models, tmp_path):
    """Without ref_model the model before its first update is the reference: evaluation sets given
    at init are scored then (and evaluate after training reuses them), a dataset given to
    ``evaluate`` before training is scored too, one given after training is refused (TRL's words)."""
    held_out = Dataset.from_list(HELD_OUT[:2])
    t = _trainer(models, tmp_path, eval_dataset=held_out, max_steps=1, precompute_ref_log_probs=True)
    assert t.ref_model is None
    assert t.evaluate(eval_dataset=Dataset.from_list(HELD_OUT[2:4]))["eval_loss"] == pytest.approx(0.6931, abs=1e-4)
    t.train()
    assert t.evaluate()["eval_loss"] > 0  # scored at init: the reference's log-probs of before training
    with pytest.raises(ValueError, match="Cannot compute reference log-probs for a dataset passed to"):
        t.evaluate(eval_dataset=Dataset.from_list(HELD_OUT[4:]))


USER = lambda q: {"role": "user", "content": q}  # noqa: E731
BOT = lambda a: {"role": "assistant", "content": a}  # noqa: E731


def _decoded(t, pair):
    return [t.processing_class.decode(ids) for ids in (pair.prompt, pair.chosen, pair.rejected)]


def test_chat_rows_are_tokenised_as_trls_dpo_tokenises_them(models, tmp_path):
    """The prompt through the chat template with the generation prompt; each completion is the rest
    of the whole conversation's rendering — the turn's end and the newline after it, no EOS added —
    with the row's tools and chat_template_kwargs (rlhfkit's own rendering stopped at <|im_end|> and
    dropped the tool calls of a multi-turn completion)."""
    call = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "rev", "arguments": {}}}]}
    tool = {"type": "function", "function": {"name": "rev", "description": "reverse", "parameters": {}}}
    rows = [
        {"prompt": [USER("2+2?")], "chosen": [BOT("4")], "rejected": [BOT("5")], "tools": None},
        {
            "prompt": [USER("rev ab")],
            "chosen": [call, {"role": "tool", "content": "ba"}, BOT("ba")],
            "rejected": [BOT("ab")],
            "tools": [tool],
        },
    ]
    args = DPOConfig(output_dir=str(tmp_path), max_steps=1, **CPU)
    t = DPOTrainer(models["chat"], args=args, train_dataset=Dataset.from_list(rows))
    prompt, chosen, rejected = _decoded(t, t.train_pairs[0])
    assert prompt.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert (chosen, rejected) == ("4<|im_end|>\n", "5<|im_end|>\n")
    prompt, chosen, rejected = _decoded(t, t.train_pairs[1])
    assert "<tools>" in prompt and '"name": "rev"' in prompt  # the row's tools in the system turn
    assert chosen == (  # the whole completion: the call, the tool's answer, the final turn
        '<tool_call>\n{"name": "rev", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n<tool_response>\nba\n</tool_response><|im_end|>\n<|im_start|>assistant\nba<|im_end|>\n"
    )
    assert rejected == "ab<|im_end|>\n"


def test_chat_template_kwargs_reach_the_template(models, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["chat"])
    tok.chat_template = (
        "{%- for m in messages -%}{{ '<|im_start|>' + (m.role.upper() if shout and m.role == 'user' else m.role)"
        " + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )
    rows = [{"prompt": [USER("hi")], "chosen": [BOT("yo")], "rejected": [BOT("no")], "chat_template_kwargs": {}}]
    rows = [rows[0] | {"chat_template_kwargs": {"shout": s}} for s in (False, True)]
    args = DPOConfig(output_dir=str(tmp_path), max_steps=1, **CPU)
    t = DPOTrainer(models["chat"], args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    assert [_decoded(t, p)[0] for p in t.train_pairs] == [
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>USER\nhi<|im_end|>\n<|im_start|>assistant\n",
    ]
