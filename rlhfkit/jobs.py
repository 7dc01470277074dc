"""What the command line adds to the trainers' configs: the model and data paths (the Python API
passes those as objects). Each job is a trainer config plus its sources, documented field by field
like every config, so ``rlhfkit <job> --help`` and YAML recipes see one flat set of keys."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .config import RLConfig
from .trainers.reward_model import RewardModelConfig
from .trainers.sft import SFTConfig


@dataclass(frozen=True)
class Sources:
    model: str = ""
    """Model to train: a local Hugging Face model directory, a .gguf file, or package:NAME/file.gguf (a file shipped in an installed Python package)."""
    train_dataset: str = ""
    """Training data: a .jsonl, .json or .parquet file."""
    eval_dataset: str | None = None
    """Held-out data in the same format; None: no evaluation."""


@dataclass(frozen=True)
class RMSources(Sources):
    center_dataset: str | None = None
    """Completions ({prompt, completion} rows, e.g. the SFT data) whose mean score becomes the reward's zero; None: the training completions."""


@dataclass(frozen=True)
class RLSources(Sources):
    reward_funcs: tuple[str, ...] = ()
    """Reward sources: registered names (e.g. shift_oracle), 'module:function' import paths, or reward-model directories."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward source; None: 1 each."""
    ref_model: str | None = None
    """Reference policy directory for the KL penalty; None: a frozen copy of the initial policy."""
    lora_r: int = 0
    """LoRA rank (peft); 0 trains every weight. With LoRA the reference is the adapter-disabled base: no second copy."""
    lora_alpha: int = 16
    """LoRA scaling numerator (alpha / r scales the adapter's output)."""
    lora_target_modules: str = "all-linear"
    """Modules that get adapters: 'all-linear' or a comma-separated list of module names."""


@dataclass(frozen=True)
class SFTJob(SFTConfig, Sources):
    """Supervised fine-tuning on demonstrations."""


@dataclass(frozen=True)
class RMJob(RewardModelConfig, RMSources):
    """Reward model on preference pairs (Bradley–Terry)."""


@dataclass(frozen=True)
class RLJob(RLConfig, RLSources):
    """RL against reward functions and/or reward models (PPO, GRPO, REINFORCE, RLOO, …)."""


def trainer_config(job, cls):
    """The trainer's own config from a job (the sources stripped off)."""
    return cls(**{f.name: getattr(job, f.name) for f in fields(cls)})


def require(job, *names: str) -> None:
    missing = [n for n in names if not getattr(job, n)]
    if missing:
        raise ValueError(f"config key(s) {', '.join(map(repr, missing))} must be set (in the YAML file or as key=value)")


def lora_config(job: RLJob):
    if job.lora_r <= 0:
        return None
    from peft import LoraConfig

    targets = job.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    return LoraConfig(r=job.lora_r, lora_alpha=job.lora_alpha, target_modules=targets, lora_dropout=0.0,
                      task_type="CAUSAL_LM")


def checkpoint_policy(path):
    """The policy saved in an ``rlhfkit rl`` checkpoint (``<run>/checkpoint-N/``), as a merged causal
    LM, with the base model's source for the tokenizer — or None when ``path`` is not such a
    checkpoint. The run's ``config.yaml`` names the base model and the LoRA settings; the
    checkpoint holds the trained weights (all of them, or the adapter's)."""
    from pathlib import Path

    from .config_io import load_config
    from .trainers.checkpoint import STATE_FILE, load_trainable_state

    path = Path(path)
    if not (path.is_dir() and (path / STATE_FILE).is_file() and (path / "policy.safetensors").is_file()):
        return None
    record = path.parent / "config.yaml"
    job = load_config(RLJob, str(record)) if record.is_file() else None
    if job is None or not job.model:
        raise ValueError(f"checkpoint {path}: {record} does not name the run's model (a run started from "
                         "Python records only its trainer config); load the base model and apply "
                         "policy.safetensors, or evaluate the run's final/ directory")
    from safetensors.torch import load_file

    from .models import load_causal_lm

    model = load_causal_lm(job.model, job.dtype)
    peft = lora_config(job)
    if peft is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft)
    load_trainable_state(model, load_file(str(path / "policy.safetensors")), str(path))
    if peft is not None:
        model = model.merge_and_unload()
    return model, job.model
