"""The names users expect at the top level, as ``from trl import GRPOTrainer, GRPOConfig``."""

import subprocess
import sys

# The top-level names and where each is defined (the README's and the package docstring's imports).
EXPECTED = {
    "RLConfig": "rlhfkit.config",
    "RLTrainer": "rlhfkit.trainers.rl",
    "SFTConfig": "rlhfkit.config.supervised",
    "SFTTrainer": "rlhfkit.trainers.sft",
    "RewardModelConfig": "rlhfkit.config.supervised",
    "RewardModelTrainer": "rlhfkit.trainers.reward_model",
    "DPOConfig": "rlhfkit.config.supervised",
    "DPOTrainer": "rlhfkit.trainers.dpo",
    "KTOConfig": "rlhfkit.config.supervised",
    "KTOTrainer": "rlhfkit.trainers.kto",
    "RewardFunctions": "rlhfkit.rewards",
    "register_reward_function": "rlhfkit.rewards",
    "load_config": "rlhfkit.config.io",
}


def test_trainers_and_configs_import_from_the_top_level():
    """Each name is the object its module defines, and ``from rlhfkit import *`` gives exactly these."""
    import importlib

    import rlhfkit

    assert sorted(rlhfkit.__all__) == sorted([*EXPECTED, "__version__"])
    for name, module in EXPECTED.items():
        assert getattr(rlhfkit, name) is getattr(importlib.import_module(module), name), name
        assert getattr(rlhfkit, name).__name__ == name
    code = "from rlhfkit import *; print(sorted(k for k in dir() if not k.startswith('_')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(sorted(EXPECTED))


def test_an_unknown_name_is_an_attribute_error():
    import pytest

    import rlhfkit

    with pytest.raises(AttributeError, match="no attribute 'GRPOTrainerX'"):
        rlhfkit.GRPOTrainerX  # noqa: B018


def test_importing_the_package_does_not_load_transformers():
    code = "import sys, rlhfkit, rlhfkit.algorithms; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_trainer_modules_still_export_their_configs():
    """The configs live in the config layer; ``rlhfkit.trainers`` and each trainer module re-export
    the same classes (``from rlhfkit.trainers.sft import SFTConfig`` keeps working)."""
    import rlhfkit.trainers as trainers
    from rlhfkit.config.supervised import DPOConfig, RewardModelConfig, SFTConfig
    from rlhfkit.trainers import dpo, reward_model, sft

    assert (sft.SFTConfig, reward_model.RewardModelConfig, dpo.DPOConfig) == (SFTConfig, RewardModelConfig, DPOConfig)
    assert (trainers.SFTConfig, trainers.RewardModelConfig, trainers.DPOConfig) == (
        SFTConfig,
        RewardModelConfig,
        DPOConfig,
    )


def test_the_configs_and_jobs_import_without_torch():
    code = (
        "import sys; from rlhfkit import RLConfig, SFTConfig, RewardModelConfig; import rlhfkit.config.jobs; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
