"""A user's first run prints what rlhfkit says and nothing transformers adds on default settings: no
progress bar of weight loading or saving, no warning about generation flags (issue 33)."""

import io
import logging

import pytest
from transformers.utils import logging as hf_logging

from rlhfkit import RLConfig, RLTrainer
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a


@pytest.fixture
def transformers_defaults():
    """transformers as a user has it (tests/conftest.py quiets it for the suite): progress bars on,
    warnings shown, each ``warning_once`` message not yet seen. Yields what transformers logs (its
    own handler writes to the stderr of the moment it was made, which pytest's capture may hold)."""
    verbosity, logged = hf_logging.get_verbosity(), io.StringIO()
    handler = logging.StreamHandler(logged)
    hf_logging.enable_progress_bar()
    hf_logging.set_verbosity_warning()
    hf_logging.warning_once.cache_clear()
    hf_logging.add_handler(handler)
    yield logged
    hf_logging.remove_handler(handler)
    hf_logging.set_verbosity(verbosity)
    hf_logging.disable_progress_bar()


def test_a_default_run_prints_no_weight_bar_and_no_generation_flags_warning(
    tmp_path, tiny_model_dir, capfd, transformers_defaults
):
    capfd.readouterr()
    args = RLConfig(algorithm="grpo", max_steps=1, max_new_tokens=4, prompts_per_step=2, output_dir=str(tmp_path))
    RLTrainer(str(tiny_model_dir), [fraction_of_a], args, train_dataset=PROMPTS, eval_dataset=PROMPTS[:2]).train()
    out, err = capfd.readouterr()
    printed = out + err + transformers_defaults.getvalue()
    for noise in ("Loading weights", "Writing model shards", "generation flags", "it/s]"):
        assert noise not in printed, f"{noise!r} printed:\n{printed}"
    assert "step 1/1" in out  # what rlhfkit itself prints is still there
    assert hf_logging.is_progress_bar_enabled()  # switched off for the loads only, then back
