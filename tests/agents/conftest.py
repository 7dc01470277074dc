"""A ChatML tokenizer with the shipped tool template, a typed tool, and an engine that replays scripted turns."""

import pytest

from rlhfkit.rollout.base import build_rollout
from rlhfkit.tasks.tiny import add  # noqa: F401  (the tests' typed tool)


def make_chatml_tokenizer():
    from rlhfkit.tasks.tiny import chatml_tokenizer

    return chatml_tokenizer()


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
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"][: sampling.max_new_tokens] for t in texts]
        self.returned.append(ids)
        return build_rollout(prompts, ids, 1, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id)

    def sleep(self):
        pass
