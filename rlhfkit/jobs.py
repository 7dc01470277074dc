"""What the command line adds to the trainers' configs: the model and data paths (the Python API
passes those as objects). Each job is a trainer config plus its sources, documented field by field
like every config, so ``rlhfkit <job> --help`` and YAML recipes see one flat set of keys."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from .config import RLConfig
from .config_io import config_values
from .trainers.dpo import DPOConfig
from .trainers.reward_model import RewardModelConfig
from .trainers.sft import SFTConfig


@dataclass(frozen=True)
class Sources:
    model: str = ""
    """Model to train: a local Hugging Face model directory, a .gguf file, package:NAME/file.gguf (a file shipped in an installed Python package), or a Hugging Face Hub id (e.g. HuggingFaceTB/SmolLM2-135M-Instruct)."""
    train_dataset: str = ""
    """Training data: a .jsonl, .json or .parquet file, or a Hugging Face Hub dataset id (loaded with datasets.load_dataset)."""
    eval_dataset: str | None = None
    """Held-out data in the same format; None: no evaluation."""
    dataset_subset: str | None = None
    """Hub datasets: the subset (configuration) name, e.g. 'main' for openai/gsm8k; None: the dataset's default."""
    dataset_train_split: str = "train"
    """Hub datasets: the split train_dataset is read from."""
    dataset_eval_split: str = "test"
    """Hub datasets: the split eval_dataset is read from."""
    lora_r: int = 0
    """LoRA rank (peft); 0 trains every weight. With LoRA the reference (RL, DPO) is the adapter-disabled base: no second copy."""
    lora_alpha: int = 16
    """LoRA scaling numerator (alpha / r scales the adapter's output)."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input during training (RL keeps 0: its log-probs must not change between passes)."""
    lora_target_modules: str = "all-linear"
    """Modules that get adapters: 'all-linear', a comma-separated list of module names, or '' (peft's default for the architecture, e.g. q_proj,v_proj for Llama)."""


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


@dataclass(frozen=True)
class DPOSources(Sources):
    ref_model: str | None = None
    """Reference policy (a model directory or Hub id); None: a frozen copy of the initial model (with LoRA: the adapter-disabled base)."""


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
class RLJob(RLConfig, RLSources):
    """RL against reward functions and/or reward models (PPO, GRPO, REINFORCE, RLOO, …)."""


_JOBS = ((RLConfig, RLJob), (SFTConfig, SFTJob), (RewardModelConfig, RMJob), (DPOConfig, DPOJob))


def trainer_config(job, cls):
    """The trainer's own config from a job (the sources stripped off)."""
    values = config_values(job)  # preset-filled fields stay unset: the trainer config keeps the preset rule
    return cls(**{f.name: values[f.name] for f in fields(cls)})


def open_run(output_dir, args, model, datasets: dict, **sources) -> Path | None:
    """Once the model, data and rewards have loaded (``output_dir``: None on the processes that do
    not write): refuse to clear a directory that holds one of the run's inputs
    (``run_dir.check_inputs_outside``), create the run directory (``prepare_run_dir``) and record
    the run (``record_run``)."""
    if not output_dir:
        return None
    from .run.directory import check_inputs_outside, prepare_run_dir

    inputs = {"model": model, **{name: given for name, (given, _) in datasets.items()},
              "reward_funcs": sources.get("reward_funcs"), "ref_model": sources.get("ref_model"),
              "critic_init": getattr(args, "critic_init", None)}
    check_inputs_outside(output_dir, args.overwrite, args.resume_from, inputs)
    prepare_run_dir(output_dir, args.overwrite, resume_from=args.resume_from)
    return record_run(args, model, datasets, args.resume_from, **sources)


def record_run(args, model, datasets: dict, resume_from=None, **sources) -> Path | None:
    """Write the run's record — the trainer config ``args`` plus its sources, as the job of the
    matching command (``RLJob``, ``SFTJob``, ``RMJob``) — to ``<output_dir>/config.yaml`` (or the
    resume record). The trainers call this; it is the one writer of the record, so a run started
    from Python records its model, data and rewards exactly as ``rlhfkit <command>`` does, and
    ``rlhfkit <command> --config <run>/config.yaml`` or ``rlhfkit eval --model <run>/checkpoint-N``
    work for it.

    ``model`` / ``ref_model``: paths, or model objects (recorded by the local directory they were
    loaded from, or "" when they have none); ``datasets``: name -> (what the user passed, the
    loaded rows) — in-memory data are written to ``<output_dir>/data/<name>.jsonl`` and recorded by
    that path; ``reward_funcs``: recorded by name, import path or directory (``reward_source``);
    ``peft_config``: a LoRA config, recorded as ``lora_r`` / ``lora_alpha`` / ``lora_target_modules``.
    """
    if not args.output_dir:
        return None
    from .config_io import save_config
    from .files import writing
    from .run.directory import run_config_path
    job_cls = next((job for cfg, job in _JOBS if isinstance(args, cfg)), None)
    if job_cls is None:
        raise ValueError(f"record_run: no command records a {type(args).__name__}")
    values = config_values(args)
    values["model"] = model_source(model)
    for name, (given, rows) in datasets.items():
        values[name] = _dataset_source(name, given, rows, Path(args.output_dir))
    if "reward_funcs" in sources:
        values["reward_funcs"] = tuple(reward_source(f) for f in sources.pop("reward_funcs"))
    if sources.get("reward_weights") is not None:
        values["reward_weights"] = tuple(float(w) for w in sources.pop("reward_weights"))
    sources.pop("reward_weights", None)
    if "ref_model" in sources:
        ref = sources.pop("ref_model")
        values["ref_model"] = None if ref is None else model_source(ref)
    peft = sources.pop("peft_config", None)
    if peft is not None:
        values.update(_lora_fields(peft))
    if sources:
        raise ValueError(f"record_run: unknown sources {sorted(sources)}")
    target = run_config_path(args.output_dir, resume_from)
    with writing(target):
        return save_config(job_cls(**values), target)


def model_source(model) -> str:
    """How a model is recorded: its path, or the local directory an object was loaded from ("" if none)."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    config = getattr(model, "config", None)
    origin = str(getattr(config, "_name_or_path", "") or "")
    return origin if origin and Path(origin).exists() else ""


def reward_source(spec) -> str:
    """How a reward source is recorded: a name or path as given, a registered function by its name,
    an importable function as ``module:qualname``, a reward model by the directory it came from."""
    from .rewards.functions import REWARD_FUNCTIONS, unrecorded_reward

    if isinstance(spec, (str, os.PathLike)):
        return str(spec)
    import torch

    if isinstance(spec, torch.nn.Module):  # a reward model: by its directory, if it was loaded as one
        origin = model_source(getattr(spec, "backbone", spec))
        return origin if origin and _is_reward_model_dir(origin) else unrecorded_reward(type(spec).__name__)
    for name, fn in REWARD_FUNCTIONS.items():
        if fn is spec:
            return name
    module, qualname = getattr(spec, "__module__", None), getattr(spec, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        import importlib

        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            obj = None
        if obj is spec:
            return f"{module}:{qualname}"
    return unrecorded_reward(getattr(spec, "__name__", None) or type(spec).__name__)


def _is_reward_model_dir(path: str) -> bool:
    from .models.heads import META_FILE

    config = Path(path) / "config.json"
    archs = (json.loads(config.read_text()).get("architectures") or []) if config.is_file() else []
    return (Path(path) / META_FILE).is_file() or any(a.endswith("ForSequenceClassification") for a in archs)


def _dataset_source(name: str, given, rows, output_dir: Path) -> str | None:
    """A path as given; in-memory rows written to ``<output_dir>/data/<name>.jsonl`` (numpy values
    as plain numbers). Rows JSON cannot hold are not recorded (a warning; the run goes on)."""
    if given is None:
        return None
    if isinstance(given, (str, os.PathLike)):
        return str(given)
    path = output_dir / "data" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = "".join(json.dumps(row, ensure_ascii=False, default=_plain) + "\n" for row in rows)
    except (TypeError, ValueError) as err:
        import warnings

        warnings.warn(f"{name}: the in-memory rows are not recorded in the run directory ({err})", stacklevel=3)
        return f"<not recorded: in-memory {name}>"
    from .files import writing

    with writing(path):
        path.write_text(text, encoding="utf-8")
    return str(path)


def _plain(value):
    """numpy scalars and arrays (and tensors) as JSON values; anything else is refused."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} values cannot be written as JSON")


def _lora_fields(peft) -> dict:
    if getattr(peft, "r", None) is None or not hasattr(peft, "lora_alpha"):
        import warnings

        warnings.warn(f"{type(peft).__name__} is not recorded in config.yaml (only LoRA settings are)", stacklevel=3)
        return {}
    targets = getattr(peft, "target_modules", None)
    targets = "" if targets is None else targets if isinstance(targets, str) else ",".join(sorted(targets))
    return {"lora_r": int(peft.r), "lora_alpha": int(peft.lora_alpha),
            "lora_dropout": float(getattr(peft, "lora_dropout", 0.0) or 0.0), "lora_target_modules": targets}


def require(job, *names: str) -> None:
    missing = [n for n in names if not getattr(job, n)]
    if missing:
        raise ValueError(f"config key(s) {', '.join(map(repr, missing))} must be set (in the YAML file or as key=value)")


def lora_config(job: Sources):
    """The job's ``peft.LoraConfig`` (None when ``lora_r`` is 0)."""
    if job.lora_r <= 0:
        return None
    from peft import LoraConfig

    targets = job.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()] or None
    return LoraConfig(r=job.lora_r, lora_alpha=job.lora_alpha, target_modules=targets, lora_dropout=job.lora_dropout,
                      task_type="CAUSAL_LM")


def checkpoint_policy(path):
    """The policy saved in a checkpoint of ``rlhfkit rl``, ``sft`` or ``dpo``
    (``<run>/checkpoint-N/``), as a merged causal LM, with the base model's source for the
    tokenizer — or None when ``path`` is not such a checkpoint. The run's ``config.yaml`` names the
    base model and the LoRA settings; the checkpoint holds the trained weights (all of them, or the
    adapter's) under the module name ``policy`` (RL) or ``model`` (SFT, DPO)."""
    from .config_io import load_config
    from .run.checkpoint import DCP_DIR, STATE_FILE, _read_metadata, has_module_weights, load_module_weights

    path = Path(path)
    if not (path.is_dir() and (path / STATE_FILE).is_file()):
        return None
    if (path / DCP_DIR / ".metadata").is_file():
        modules = {k.split(".", 1)[0] for k in _read_metadata(path / DCP_DIR).state_dict_metadata}
    else:  # the single-process format of earlier versions (RL only)
        modules = {"policy"} if has_module_weights(path, "policy") else set()
    name, job_classes = (("policy", (RLJob,)) if "policy" in modules else
                         ("model", (SFTJob, DPOJob)) if "model" in modules and "critic" not in modules else (None, ()))
    if name is None:
        return None
    record, job = path.parent / "config.yaml", None
    for job_cls in job_classes if record.is_file() else ():
        try:
            job = load_config(job_cls, str(record))
            break
        except ValueError:  # the record of another command
            continue
    if job is None and record.is_file():
        raise ValueError(f"checkpoint {path} holds no policy: {record} is not the record of an rlhfkit sft, dpo "
                         "or rl run (a reward model is evaluated as a reward: --reward <run>/final)")
    if job is None or not job.model:
        raise ValueError(f"checkpoint {path}: {record} does not name the run's model (a run started from "
                         "Python records only its trainer config); load the base model and apply the policy "
                         "weights (rlhfkit.run.checkpoint.load_module_weights), or evaluate the run's final/")
    from .models import load_causal_lm

    model = load_causal_lm(job.model, job.dtype)
    peft = lora_config(job)
    if peft is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft)
    load_module_weights(path, name, model)  # the sharded format of any process count, or an older one
    if peft is not None:
        model = model.merge_and_unload()
    return model, job.model
