"""Reward-model training end to end on tiny local models: an oracle-labelled toy set is learned,
centring survives save / load, the margin enters the loss as by hand, a trained reward model
initialises the PPO critic, and every bad input is reported before a model is loaded."""

import json
import random

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.models import ScalarModel, load_tokenizer
from rlhfkit.rewards.reward_model import RewardModelFunction
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers.reward_model import RewardModelConfig, RewardModelTrainer

LETTERS = "bcdefghijk"
MISSING = "/no/such/model/dir"


def oracle_pairs(n, seed, length=8):
    """Random-letter prompts; the completion with more 'a' (of ``length`` characters) is chosen."""
    rng = random.Random(seed)

    def completion(k):
        chars = ["a"] * k + [rng.choice(LETTERS) for _ in range(length - k)]
        rng.shuffle(chars)
        return "".join(chars)

    rows = []
    for _ in range(n):
        fewer, more = sorted(rng.sample(range(length + 1), 2))
        prompt = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6)))
        rows.append({"prompt": prompt, "chosen": completion(more), "rejected": completion(fewer)})
    return rows


def trainer(train=None, tok=None, model=None, **overrides):
    tok = tok or char_tokenizer()
    args = dict(learning_rate=1e-3, batch_size=8, max_steps=40, log_every=0, seed=0)
    args.update(overrides)
    extra = {k: args.pop(k) for k in ("eval_dataset", "center_dataset") if k in args}
    model = model if model is not None else tiny_causal_lm(tok, hidden_size=32, seed=0)
    return RewardModelTrainer(
        model, RewardModelConfig(**args), oracle_pairs(64, 0) if train is None else train, processing_class=tok, **extra
    )


def mean_score(model, tok, rows):
    """Mean score of {prompt, completion} rows through the RL loop's reward-model scorer."""
    scorer = RewardModelFunction(model.eval(), load_tokenizer(tok))
    return sum(scorer([r["prompt"] for r in rows], [r["completion"] for r in rows])) / len(rows)


def sides(rows):
    return [{"prompt": r["prompt"], "completion": r[k]} for r in rows for k in ("chosen", "rejected")]


# ---------------------------------------------------------------- learning


def test_learns_oracle_preferences_on_held_out_pairs():
    held_out = oracle_pairs(64, 1)
    t = trainer(oracle_pairs(256, 0), eval_dataset=held_out, eval_every=20)
    before = t.evaluate()
    history = t.train()
    assert [r["step"] for r in history] == list(range(1, 41))
    assert "eval/accuracy" in history[19] and "eval/accuracy" not in history[20]
    for key in [
        "rm/loss",
        "rm/accuracy",
        "rm/margin_mean",
        "rm/chosen_mean",
        "rm/rejected_mean",
        "rm/reward_mean",
        "rm/reward_std",
        "perf/lr",
        "perf/grad_norm",
        "rm/epoch",
    ]:
        assert key in history[0], key
    after = t.evaluate()
    assert after["eval/accuracy"] > 0.85, (before, after)
    assert after["eval/loss"] < before["eval/loss"] - 0.3
    assert history[-1]["eval/accuracy"] == pytest.approx(after["eval/accuracy"])


def test_linear_schedule_with_warmup_and_epochs():
    history = trainer(max_steps=None, num_epochs=2, warmup_steps=2, learning_rate=1e-3).train()
    assert len(history) == 2 * 8  # 64 pairs / 8 per step, two epochs
    lrs = [r["perf/lr"] for r in history]
    assert lrs[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:])) and lrs[-1] == pytest.approx(1e-3 / 14)
    assert history[-1]["rm/epoch"] == pytest.approx(2.0)


def test_padding_never_changes_a_score():
    t = trainer(max_steps=0)
    pairs = t.train_pairs[:6]
    chosen, rejected, _ = t._score_pairs(pairs)
    alone = [t._score_pairs([p]) for p in pairs]
    torch.testing.assert_close(chosen, torch.cat([a[0] for a in alone]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rejected, torch.cat([a[1] for a in alone]), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- margin


def test_margin_changes_the_loss_as_by_hand():
    rows = oracle_pairs(6, 2)
    margins = [0.0, 0.5, 1.0, 2.0, -1.0, 3.0]
    with_margin = [dict(r, margin=m) for r, m in zip(rows, margins)]
    t = trainer(with_margin, max_steps=1, batch_size=6, center=False)
    with torch.no_grad():
        c, r, m = t._score_pairs(t.train_pairs)
    diff = (c - r).double()
    by_hand = sum(torch.log1p(torch.exp(-(d - mg))).item() for d, mg in zip(diff, margins)) / 6
    no_margin = sum(torch.log1p(torch.exp(-d)).item() for d in diff) / 6
    assert m.tolist() == margins and abs(by_hand - no_margin) > 0.1
    assert t.evaluate(with_margin)["eval/loss"] == pytest.approx(by_hand, abs=1e-5)
    assert t.evaluate(rows)["eval/loss"] == pytest.approx(no_margin, abs=1e-5)
    # the training step's loss is the same number (one batch holding all six pairs, before the update)
    assert t.train()[0]["rm/loss"] == pytest.approx(by_hand, abs=1e-5)


# ---------------------------------------------------------------- centring, saving, PPO critic


def test_centring_survives_save_and_load(tmp_path):
    train = oracle_pairs(32, 3)
    history = trainer(train, max_steps=10, output_dir=str(tmp_path)).train()
    final = tmp_path / "final"
    meta = json.loads((final / "rlhfkit_scalar.json").read_text())
    assert meta["offset"] == pytest.approx(history[-1]["rm/offset"]) and abs(meta["offset"]) > 1e-3
    loaded = ScalarModel.from_pretrained(final)
    assert float(loaded.offset) == pytest.approx(meta["offset"])
    # default centre set: every chosen and rejected completion of the training data
    assert abs(mean_score(loaded, load_tokenizer(str(final)), sides(train))) < 1e-4
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 11)) and "rm/accuracy" in rows[0]


def test_custom_centre_set_and_center_off(tmp_path):
    tok = char_tokenizer()
    center = [
        "aaaa",
        {"prompt": "bcd", "completion": "abc"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    ]
    t = trainer(tok=tok, max_steps=5, center_dataset=center)
    t.train()
    as_rows = [
        {"prompt": "", "completion": "aaaa"},
        {"prompt": "bcd", "completion": "abc"},
        {
            "prompt": tok.apply_chat_template(
                [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
            ),
            "completion": "yo",
        },
    ]
    assert abs(mean_score(t.model, tok, as_rows)) < 1e-4
    off = trainer(max_steps=2, center=False)
    assert "rm/offset" not in off.train()[-1] and float(off.model.offset) == 0.0
    with pytest.raises(ValueError, match="center_dataset is given but args.center is False"):
        trainer(max_steps=1, center=False, center_dataset=center)


def test_trained_reward_model_initialises_the_ppo_critic(tiny_model_dir, tmp_path):
    rm_trainer = RewardModelTrainer(
        tiny_model_dir,
        RewardModelConfig(learning_rate=1e-3, max_steps=3, log_every=0, output_dir=str(tmp_path / "rm")),
        train_dataset=oracle_pairs(16, 4),
    )
    rm_trainer.train()
    rm_dir = str(tmp_path / "rm" / "final")
    from rlhfkit.trainers import RLTrainer

    args = RLConfig(algorithm="ppo", critic_init=rm_dir, max_steps=1, max_new_tokens=4, prompts_per_step=2, log_every=0)
    rl = RLTrainer(tiny_model_dir, [fraction_of_a, rm_dir], args, train_dataset=PROMPTS)
    for name in ("weight", "bias"):
        critic, rm = getattr(rl.models.critic.head, name), getattr(rm_trainer.model.head, name)
        torch.testing.assert_close(critic, rm, atol=0, rtol=0)
    backbone = dict(rm_trainer.model.backbone.named_parameters())
    for name, p in rl.models.critic.backbone.named_parameters():
        torch.testing.assert_close(p, backbone[name], atol=0, rtol=0)
    row = rl.train()[0]
    assert "critic/loss" in row
    per_function = [k for k in row if k.startswith("reward/") and k.endswith("_mean") and k != "reward/mean"]
    assert len(per_function) == 2, per_function  # fraction_of_a and the reward model, both scored


def test_model_kinds_path_object_and_scalar_model(tiny_model_dir, tmp_path):
    first = RewardModelTrainer(
        tiny_model_dir,
        RewardModelConfig(max_steps=1, log_every=0, output_dir=str(tmp_path)),
        train_dataset=oracle_pairs(8, 5),
    )
    assert first.model.config.hidden_size == 64
    first.train()
    # a saved reward-model directory continues: same head, same offset
    again = RewardModelTrainer(
        str(tmp_path / "final"),
        RewardModelConfig(max_steps=0, center=False, log_every=0),
        train_dataset=oracle_pairs(8, 5),
    )
    torch.testing.assert_close(again.model.head.weight, first.model.head.weight, atol=0, rtol=0)
    assert float(again.model.offset) == pytest.approx(float(first.model.offset))
    tok = char_tokenizer()
    lm = tiny_causal_lm(tok, hidden_size=32)
    from_lm = trainer(model=lm, tok=tok, max_steps=1)
    assert isinstance(from_lm.model, ScalarModel) and from_lm.model.backbone is not lm.base_model  # a copy
    given = ScalarModel.from_causal_lm(lm)
    assert trainer(model=given, tok=tok, max_steps=1).model is given
    with pytest.raises(ValueError, match="processing_class .* is required when model is an object"):
        RewardModelTrainer(lm, RewardModelConfig(), oracle_pairs(4, 0))


def test_chat_prompts_and_message_completions_train():
    user = [{"role": "user", "content": "pick"}]
    rows = [
        {"prompt": user, "chosen": [{"role": "assistant", "content": c}], "rejected": r}
        for c, r in [("aaa", "bcd"), ("aab", "bbc"), ("aaaa", "b")]
    ]
    history = trainer(rows, max_steps=2, batch_size=3).train()
    assert len(history) == 2 and "rm/offset" in history[-1]
    tok = char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"train_dataset: pair 0 \(0-based\): render_prompt: .* no chat template"):
        trainer(rows, tok=tok, max_steps=1)


# ---------------------------------------------------------------- errors before any model is loaded


def bad(**changes):
    return [oracle_pairs(1, 0)[0], {**oracle_pairs(1, 1)[0], **changes}]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(train_dataset=bad(chosen="")), r"^train_dataset: row index 1 \(0-based\): field 'chosen'"),
        (dict(train_dataset=bad(margin="x")), r"^train_dataset: row index 1 \(0-based\): field 'margin'"),
        (dict(train_dataset=[{"prompt": "p", "chosen": "a"}]), r"row index 0 \(0-based\): missing field 'rejected'"),
        (
            dict(train_dataset=oracle_pairs(2, 0), eval_dataset=bad(rejected=None)),
            r"^eval_dataset: row index 1 \(0-based\): field 'rejected'",
        ),
        (
            dict(train_dataset=oracle_pairs(2, 0), center_dataset=["ok", {"prompt": "p"}]),
            r"^center_dataset: row index 1 \(0-based\): missing field 'completion'",
        ),
        (dict(train_dataset=None), r"train_dataset is required"),
    ],
)
def test_bad_data_is_reported_before_the_model_is_loaded(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardModelTrainer(MISSING, RewardModelConfig(), **kwargs)


def test_bad_files_name_the_file_and_line(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(oracle_pairs(1, 0)[0]) + "\n" + json.dumps(bad(chosen="x", rejected="x")[1]) + "\n")
    with pytest.raises(ValueError, match=r"prefs\.jsonl: line 2: fields 'chosen' and 'rejected' are the same"):
        RewardModelTrainer(MISSING, RewardModelConfig(), train_dataset=path)
    path.write_bytes(b'{"prompt": "\xfe"}\n')
    with pytest.raises(ValueError, match=r"prefs\.jsonl: line 1: not valid UTF-8"):
        RewardModelTrainer(MISSING, RewardModelConfig(), train_dataset=path)
    with pytest.raises(ValueError, match=r"data file not found: .*absent\.jsonl"):
        RewardModelTrainer(MISSING, RewardModelConfig(), train_dataset=tmp_path / "absent.jsonl")


def test_good_data_and_a_missing_model_path():
    with pytest.raises(ValueError, match=r"model path does not exist: /no/such/model/dir"):
        RewardModelTrainer(MISSING, RewardModelConfig(), train_dataset=oracle_pairs(2, 0))


def test_pairs_that_do_not_fit_are_dropped_with_a_warning():
    rows = oracle_pairs(4, 0) + [{"prompt": "p", "chosen": "a" * 40, "rejected": "b"}]
    with pytest.warns(UserWarning, match=r"train_dataset: dropped 1 of 5 pairs .* max_length=16"):
        t = trainer(rows, max_length=16, max_steps=0)
    assert len(t.train_pairs) == 4 and max(len(p.chosen) for p in t.train_pairs) <= 16
    with pytest.raises(ValueError, match=r"train_dataset: every pair is longer than max_length=4"):
        trainer(rows, max_length=4, max_steps=0)


def test_tokenised_pairs_train_as_they_are_and_long_ones_are_dropped():
    tok = char_tokenizer()
    rows = [
        {"chosen_ids": tok(r["prompt"] + r["chosen"])["input_ids"], "rejected_ids": [5, 6]} for r in oracle_pairs(4, 0)
    ]
    rows.append({"chosen_ids": list(range(3, 30)), "rejected_ids": [3], "margin": 1.0})
    with pytest.warns(UserWarning, match=r"train_dataset: dropped 1 of 5 pairs"):
        t = trainer(rows, tok=tok, max_length=16, max_steps=2)
    assert [p.chosen for p in t.train_pairs] == [r["chosen_ids"] for r in rows[:4]]
    assert all(p.rejected == [5, 6] and p.margin is None for p in t.train_pairs)
    assert len(t.train()) == 2


@pytest.mark.parametrize(
    "field,value",
    [
        ("batch_size", 0),
        ("learning_rate", 0.0),
        ("lr_scheduler", "step"),
        ("max_length", 1),
        ("dtype", "int8"),
        ("max_steps", -1),
    ],
)
def test_config_fields_are_checked(field, value):
    with pytest.raises(ValueError, match=rf"config field '{field}' must be"):
        RewardModelConfig(**{field: value})


def test_a_centre_row_longer_than_max_length_is_said_to_be_cut(capsys):
    center = [{"prompt": "abc", "completion": "x" * 5000}, {"prompt": "ab", "completion": "cd"}]
    trainer(max_steps=1, max_length=64, center_dataset=center)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning: center_dataset")]
    assert lines == [
        "warning: center_dataset: 1 of 2 rows are longer than max_length=64 tokens and were cut "
        "(their prompt's start first); raise max_length to keep them whole"
    ]
