"""``packing_strategy="wrapped"`` (TRL's): the examples' tokens one after another, cut every
``max_length``; each row one sequence whose loss is the model's own on it (checked by hand)."""

import pytest
import torch

from rlhfkit.data.encode import Encoded
from rlhfkit.data.sft import IGNORE_INDEX, collate_groups, pack_wrapped
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rows_are_the_concatenation_cut_every_max_length():
    text, pair = Encoded([1, 2, 3], 0, False), Encoded([4, 5, 6, 7], 2, False)
    rows = pack_wrapped([text, pair, text], 4)
    assert [r[0].input_ids for r in rows] == [[1, 2, 3, 4], [5, 6, 7, 1], [2, 3]]
    # a token trains where it trains in its example: the pair's prompt (4, 5) not, a text's first token too
    assert [r[0].mask for r in rows] == [(1, 1, 1, 0), (0, 1, 1, 1), (1, 1)]
    batch = collate_groups(rows, 0, 4)
    assert batch["labels"].tolist() == [
        [IGNORE_INDEX, 2, 3, IGNORE_INDEX],
        [IGNORE_INDEX, 6, 7, 1],  # the text's first token, predicted from the pair's last
        [IGNORE_INDEX, 3, IGNORE_INDEX, IGNORE_INDEX],
    ]
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 3]  # one sequence: no reset inside the row


def test_the_trainer_trains_each_row_as_one_sequence():
    tok = char_tokenizer()
    rows = [{"text": w * 3} for w in ["cat", "dog", "sun", "owl"]]
    args = SFTConfig(packing=True, packing_strategy="wrapped", max_length=7, batch_size=2, max_steps=1, log_every=0)
    trainer = SFTTrainer(tiny_causal_lm(tok), args, rows, processing_class=tok)
    tokens = sum(len(tok(r["text"], add_special_tokens=False)["input_ids"]) + 1 for r in rows)
    assert [len(u[0].input_ids) for u in trainer.units] == [7] * (tokens // 7) + ([tokens % 7] if tokens % 7 else [])
    unit = trainer.units[1][0]
    with torch.no_grad():
        loss_sum, n = trainer.loss_sum(collate_groups([[unit]], tok.pad_token_id, 7), packed=True)
        logprobs = trainer.model(input_ids=torch.tensor([unit.input_ids])).logits[0].log_softmax(-1)
    by_hand = -sum(logprobs[j - 1, unit.input_ids[j]] for j in range(1, len(unit.input_ids)) if unit.mask[j])
    assert n == sum(unit.mask[1:]) and loss_sum.item() == pytest.approx(by_hand.item(), rel=1e-5)
    trainer.train()
