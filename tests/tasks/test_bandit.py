import pytest

from rlhfkit.cli import main
from rlhfkit.tasks.bandit import BANDIT_PRESETS, train_bandit


@pytest.mark.parametrize("algorithm", list(BANDIT_PRESETS))
def test_bandit_converges_to_the_known_optimum(algorithm):
    result = train_bandit(algorithm, steps=60, seed=1)
    assert result.optimal, result
    assert result.reward_end > 0.95 and result.reward_end - result.reward_start > 0.4


def test_bandit_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="valid: ppo"):
        train_bandit("dpo")


def test_demo_command_exits_zero(capsys):
    assert main(["demo", "--steps", "60"]) == 0
    assert "rloo" in capsys.readouterr().out
