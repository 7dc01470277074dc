"""The SFT drop-in's TRL forms beyond test_supervised_dropin.py: TRL's loss types, the dataset forms
TRL's SFTTrainer takes (tokenised rows, ``conversations`` of from/value messages, conversational
completions of several messages), packing strategies, TRL's refusals, and a float16 model."""

import pytest

from rlhfkit.trl import SFTConfig

from .test_supervised_dropin import CPU

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_trls_loss_types_are_rlhfkits(loss_type, tmp_path):
    assert SFTConfig(output_dir=str(tmp_path), loss_type=loss_type, **CPU).to_rlhfkit(8).loss_type == loss_type
