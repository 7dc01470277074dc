"""The names users expect at the top level, as ``from trl import GRPOTrainer, GRPOConfig``."""

import subprocess
import sys


def test_trainers_and_configs_import_from_the_top_level():
    from rlhfkit import (  # noqa: F401
        RewardModelConfig, RewardModelTrainer, RLConfig, RLTrainer, SFTConfig, SFTTrainer,
    )
    from rlhfkit.config import RLConfig as Direct
    from rlhfkit.trainers import RLTrainer as DirectTrainer

    assert RLConfig is Direct and RLTrainer is DirectTrainer
    assert RLConfig(algorithm="rloo").advantage_estimator == "rloo"
    import rlhfkit

    assert set(rlhfkit.__all__) <= set(dir(rlhfkit))
    for name in rlhfkit.__all__:
        assert getattr(rlhfkit, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    import pytest

    import rlhfkit

    with pytest.raises(AttributeError, match="no attribute 'GRPOTrainerX'"):
        rlhfkit.GRPOTrainerX  # noqa: B018


def test_importing_the_package_does_not_load_transformers():
    code = "import sys, rlhfkit, rlhfkit.algorithms; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
