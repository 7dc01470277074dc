"""A run that collapses (the gradient exactly 0 for good, the loss stuck above 0) says so in one line while it
runs and again when it ends, instead of a silent exit 0 (issue 51); a healthy run says nothing."""

import pytest

from rlhfkit.run.collapse import CollapseWatch
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import RewardModelConfig, RewardModelTrainer, SFTConfig, SFTTrainer

SFT_ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat", "dog", "sun"]]
PAIRS = [{"prompt": w, "chosen": "aaa", "rejected": "bbb"} for w in ["ab", "cd", "ef", "gh"]]


def train(kind, learning_rate, tmp_path):
    tok = char_tokenizer()
    args = dict(learning_rate=learning_rate, max_steps=6, log_every=0, output_dir=str(tmp_path / kind))
    if kind == "sft":
        SFTTrainer(tiny_causal_lm(tok), SFTConfig(batch_size=2, **args), SFT_ROWS, processing_class=tok).train()
    else:
        RewardModelTrainer(
            tiny_causal_lm(tok), RewardModelConfig(batch_size=4, **args), PAIRS, processing_class=tok
        ).train()


@pytest.mark.parametrize("kind, stuck_at", [("sft", "3.871"), ("rm", "0.6931")])  # ln V (48 characters), ln 2
def test_a_collapsed_run_says_so_while_it_runs_and_at_its_end(kind, stuck_at, tmp_path, capfd):
    train(kind, 1e3, tmp_path)
    lines = [line for line in capfd.readouterr().err.splitlines() if "collapsed" in line]
    assert len(lines) == 2, lines
    assert lines[0].startswith("warning: step ") and lines[1].startswith("warning: this run ended collapsed")
    assert f"loss stuck at {stuck_at}" in lines[0] and "learning rate of 1000" in lines[0]


@pytest.mark.parametrize("kind", ["sft", "rm"])
def test_a_healthy_run_says_nothing(kind, tmp_path, capfd):
    train(kind, 1e-2, tmp_path)
    assert "collapsed" not in capfd.readouterr().err


def test_only_a_zero_gradient_for_patience_steps_with_a_loss_above_zero_is_a_collapse(capfd):
    watch = CollapseWatch(1.0, patience=3)
    for step, (grad, loss) in enumerate([(0.0, 1.0), (0.0, 1.0), (1e-9, 1.0), (0.0, 0.0), (0.0, 1.0), (0.0, 1.0)]):
        watch.observe(step, grad, {"sft/loss": loss})
    assert watch.collapsed_at is None  # interrupted by a small gradient, then by a zero loss
    watch.observe(6, 0.0, {"sft/loss": 1.0})
    assert watch.collapsed_at == 4 and capfd.readouterr().err.count("collapsed at step 4") == 1
