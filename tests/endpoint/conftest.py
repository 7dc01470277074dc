"""A ChatML tokenizer and tiny models, an engine that replays scripted turns, and a helper that serves
an ``Endpoint`` on a thread (the trainer serves it on its own)."""

import threading
from contextlib import contextmanager

import pytest
import torch

from rlhfkit.rollout.base import build_rollout
from rlhfkit.tasks.tiny import add, chatml_tokenizer  # noqa: F401  (add: the tests' tool)


@pytest.fixture
def chatml():
    return chatml_tokenizer()


def turn_ending_model(tokenizer, positions: int = 2048):
    """A random Llama that ends its turns often (EOS logit lifted), so episodes have several turns."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] *= 0
        model.lm_head.weight[tokenizer.eos_token_id] += model.lm_head.weight.mean(0) + 0.02
    return model


class ScriptedEngine:
    """Returns, at its k-th ``generate`` call, the k-th list of turn texts (one per prompt, in the
    order given), and records every context it was given."""

    needs_sync = False

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.contexts = tokenizer, turns, []

    def generate(self, prompts, n, sampling, seed=None):
        texts = self.turns[len(self.contexts)]
        self.contexts.append([list(p) for p in prompts])
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"][: sampling.max_new_tokens] for t in texts]
        return build_rollout(prompts, ids, 1, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id)

    def sleep(self):
        pass


@contextmanager
def serving(endpoint):
    """``endpoint`` started and its engine loop running on a thread, until the block ends."""
    done = threading.Event()
    endpoint.start()
    thread = threading.Thread(target=endpoint.serve, kwargs={"until": done.is_set}, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        done.set()
        thread.join(timeout=10)
        endpoint.stop()
