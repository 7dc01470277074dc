"""What the command line adds to the trainers' configs: the model and data paths (the Python API
passes those as objects). Each job is a trainer config plus its sources, documented field by field
like every config, so ``rlhfkit <job> --help`` and YAML recipes see one flat set of keys. A run
started from Python is recorded as the job of its command too (``run/record.py``), so the jobs
sit in the config layer, below the run record and the trainers."""

from __future__ import annotations

from dataclasses import dataclass

from .base import ranged
from .rl import RLConfig
from .supervised import DPOConfig, KTOConfig, RewardModelConfig, SFTConfig


@dataclass(frozen=True)
class Sources:
    model: str = ""
    """Model to train: a local Hugging Face model directory, a .gguf file, package:NAME/file.gguf (a file shipped in an
    installed Python package), or a Hugging Face Hub id (e.g. HuggingFaceTB/SmolLM2-135M-Instruct)."""
    train_dataset: str | dict = ""
    """Training data: a .jsonl, .json or .parquet file, a Hugging Face Hub dataset id (loaded with
    datasets.load_dataset), or (rlhfkit rl) reasoning-gym tasks: 'reasoning_gym:<task>' or a mapping {reasoning_gym:
    <task> or {<task>: weight, ...}, size, seed, config, system_prompt}."""
    eval_dataset: str | dict | None = None
    """Held-out data in the same format (a reasoning-gym eval set is drawn with seed + 10**9, less any question of the
    training set); None: no evaluation."""
    dataset_subset: str | None = None
    """Hub datasets: the subset (configuration) name, e.g. 'main' for openai/gsm8k; None: the dataset's default."""
    dataset_train_split: str = "train"
    """Hub datasets: the split train_dataset is read from."""
    dataset_eval_split: str = "test"
    """Hub datasets: the split eval_dataset is read from."""
    lora_r: int = ranged(0, "[0, 1e5]")
    """LoRA rank (peft); 0 trains every weight. With LoRA the reference (RL, DPO) is the adapter-disabled base: no
    second copy."""
    lora_alpha: int = ranged(16, "(0, 1e6]")
    """LoRA scaling numerator (alpha / r scales the adapter's output)."""
    lora_dropout: float = ranged(0.0, "[0, 1)")
    """Dropout on the adapter's input during training (RL keeps 0: its log-probs must not change between passes)."""
    lora_target_modules: str = "all-linear"
    """Modules that get adapters: 'all-linear', a comma-separated list of module names, or '' (peft's default for the
    architecture, e.g. q_proj,v_proj for Llama)."""


@dataclass(frozen=True)
class RMSources(Sources):
    center_dataset: str | None = None
    """Completions ({prompt, completion} rows, e.g. the SFT data) whose mean score becomes the reward's zero; None: the
    training completions."""


@dataclass(frozen=True)
class RLSources(Sources):
    reward_funcs: tuple[str, ...] = ()
    """Reward sources: registered names (e.g. shift_oracle), 'module:function' import paths, or reward-model
    directories."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward source; None: 1 each."""
    ref_model: str | None = None
    """Reference policy directory for the KL penalty; None: a frozen copy of the initial policy."""
    tools: tuple[str, ...] = ()
    """Agents: tools the model may call, as 'module:function' import paths (typed functions with Google-style
    docstrings)."""
    environment: str | None = None
    """Agents: an environment class as 'module:Class', instantiated per episode (reset(**row), its public methods are
    tools, get_reward() an extra reward)."""


@dataclass(frozen=True)
class DPOSources(Sources):
    ref_model: str | None = None
    """Reference policy (a model directory or Hub id); None: a frozen copy of the initial model (with LoRA: the
    adapter-disabled base)."""


@dataclass(frozen=True)
class SFTJob(SFTConfig, Sources):
    """Supervised fine-tuning on demonstrations."""


@dataclass(frozen=True)
class RMJob(RewardModelConfig, RMSources):
    """Reward model on preference pairs (Bradley–Terry)."""


@dataclass(frozen=True)
class DPOJob(DPOConfig, DPOSources):
    """Direct preference optimisation on preference pairs (DPO, IPO, hinge, SimPO): no reward model, no sampling."""


@dataclass(frozen=True)
class KTOJob(KTOConfig, DPOSources):
    """Kahneman–Tversky optimisation on unpaired preferences (a completion and a thumbs-up or -down label per row; pairs
    are split in two): no reward model, no sampling."""


@dataclass(frozen=True)
class RLJob(RLConfig, RLSources):
    """RL against reward functions and/or reward models (PPO, GRPO, REINFORCE, RLOO, …)."""


# The job that records a run of each trainer config (``run.record.record_run``).
JOBS = ((RLConfig, RLJob), (SFTConfig, SFTJob), (RewardModelConfig, RMJob), (DPOConfig, DPOJob), (KTOConfig, KTOJob))
