"""A reward model named by its Hub id (``owner/name``), as TRL's GRPO and RLOO take one: loaded as a
sequence classifier — offline, from the Hugging Face cache — and scored like a reward-model directory;
offline and not cached, one line saying the name was treated as a Hub id."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from rlhfkit.models import ScalarModel
from rlhfkit.rewards.reward_model import RewardModelFunction
from rlhfkit.rewards.sources import build_rewards
from rlhfkit.tasks.tiny import char_tokenizer

from ..models.test_hub_names import offline  # noqa: F401  (the fixture: no network, an empty cache)

REPO = "trl-internal-testing/tiny-LlamaForSequenceClassification"


def cache_model(root, repo: str):
    """``repo`` in the Hugging Face cache under ``root`` (hub/models--owner--name, refs/main, a snapshot)."""
    torch.manual_seed(0)
    tok = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model = LlamaForSequenceClassification(config)
    torch.nn.init.normal_(model.score.weight, std=1.0)  # a trained-looking head: scores that differ
    repo_dir = root / "hf" / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / ("0" * 40)
    model.save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text("0" * 40)
    return snapshot, tok


def test_a_cached_hub_reward_model_scores_as_its_directory_does(offline):  # noqa: F811
    snapshot, tok = cache_model(offline, REPO)
    rewards = build_rewards([REPO], None, tok)
    [fn] = rewards.funcs
    assert isinstance(fn, RewardModelFunction) and rewards.names == ["tiny-LlamaForSequenceClassification"]
    prompts, completions = ["abc", "hello"], ["bcd", "ifmmp"]
    from_hub = fn(prompts=prompts, completions=completions)
    from_dir = build_rewards([str(snapshot)], None, tok)
    direct = from_dir.funcs[0]
    assert from_hub == direct(prompts=prompts, completions=completions)
    assert isinstance(ScalarModel.from_pretrained(str(snapshot)), ScalarModel) and from_hub[0] != from_hub[1]


def test_an_uncached_hub_reward_model_offline_is_one_line(offline):  # noqa: F811
    with pytest.raises(ValueError) as err:
        build_rewards(["someone/not-cached-rm"], None, char_tokenizer())
    message = str(err.value)
    assert "\n" not in message and "'someone/not-cached-rm' is not a local path" in message


def test_an_unknown_plain_name_is_still_an_unknown_reward_function():
    with pytest.raises(ValueError, match="unknown reward function 'no_such_reward'"):
        build_rewards(["no_such_reward"], None, char_tokenizer())


def test_a_reward_model_whose_weights_lack_the_scoring_head_is_refused(tmp_path):
    """A sequence classifier saved without ``score.weight`` (a causal LM's weights under a classifier's
    config): transformers would make a fresh head up; rlhfkit refuses the directory in one line."""
    from safetensors.torch import load_file, save_file

    snapshot, tok = cache_model(tmp_path, REPO)
    weights = load_file(snapshot / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("score.")}, snapshot / "model.safetensors")
    for source in (
        lambda: ScalarModel.from_pretrained(str(snapshot)),
        lambda: build_rewards([str(snapshot)], None, tok),
    ):
        with pytest.raises(ValueError) as err:
            source()
        message = str(err.value)
        assert "\n" not in message and "no trained 'score' head (score.weight missing)" in message, message


def test_a_saved_score_offset_that_is_no_number_names_its_file_and_key(tmp_path):
    import json

    snapshot, _ = cache_model(tmp_path, REPO)
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "rlhfkit_score_offset": "abc"}))
    with pytest.raises(ValueError) as err:
        ScalarModel.from_pretrained(str(snapshot))
    assert (
        str(err.value)
        == f"{snapshot / 'config.json'}: 'rlhfkit_score_offset' must be a number (the saved score offset), got 'abc'"
    )
