"""The tiny models the supervised drop-in tests train (test_supervised_dropin.py,
test_supervised_features.py)."""

import pytest

from rlhfkit.tasks.tiny import chatml_tokenizer, save_tiny_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A plain and a chat (ChatML tokenizer) tiny model directory, saved once per test module."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "plain": save_tiny_model(root / "plain", seed=0),
        "chat": save_tiny_model(root / "chat", tokenizer=chatml_tokenizer(), seed=0),
    }
