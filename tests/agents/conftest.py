"""A ChatML tokenizer with the shipped tool template, and an engine that replays scripted turns."""

import string
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.rollout.base import build_rollout

TEMPLATE = Path(rlhfkit.__file__).parent / "data" / "templates" / "chatml_tools.jinja"


def make_chatml_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_end|>", "<unk>", "<|im_start|>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in string.ascii_letters + string.digits + " +-*/=?:.,!\n{}[]\"_<>()'":
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\|im_start\|>|<\|im_end\|>|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=["<|im_start|>"], padding_side="left")
    fast.chat_template = TEMPLATE.read_text()
    return fast


@pytest.fixture
def chatml():
    return make_chatml_tokenizer()


class ScriptedEngine:
    """Returns, at its k-th ``generate`` call, the k-th list of turn texts (one per context), and
    records every context it was given and every id it returned."""

    needs_sync = False

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.contexts, self.returned = tokenizer, turns, [], []

    def generate(self, prompts, n, sampling, seed=None):
        texts = self.turns[len(self.contexts)]
        self.contexts.append([list(p) for p in prompts])
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"][:sampling.max_new_tokens] for t in texts]
        self.returned.append(ids)
        return build_rollout(prompts, ids, 1, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id)

    def sleep(self):
        pass
