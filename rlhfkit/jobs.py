"""The command line's side of the jobs (``config/jobs.py``: a trainer config plus its model and
data paths): the trainer config of a job, the required keys, the job's LoRA config, and the policy
of a checkpoint for ``rlhfkit eval``. The command line's layer: it imports only downward (the config
layer, the run's checkpoints, models)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from .config.io import config_values

# The job classes live in the config layer (the run record writes them too); the command line
# finds them here by name (``rlhfkit <command>``).
from .config.jobs import DPOJob, DPOSources, KTOJob, RLJob, RLSources, RMJob, RMSources, SFTJob, Sources  # noqa: F401


def trainer_config(job, cls):
    """The trainer's own config from a job (the sources stripped off)."""
    values = config_values(job)  # preset-filled fields stay unset: the trainer config keeps the preset rule
    return cls(**{f.name: values[f.name] for f in fields(cls)})


def require(job, *names: str) -> None:
    missing = [n for n in names if not getattr(job, n)]
    if missing:
        raise ValueError(
            f"config key(s) {', '.join(map(repr, missing))} must be set (in the YAML file or as key=value)"
        )


def lora_config(job: Sources):
    """The job's ``peft.LoraConfig`` (None when ``lora_r`` is 0)."""
    if job.lora_r <= 0:
        return None
    from peft import LoraConfig

    given = job.lora_target_modules
    targets = given if given == "all-linear" else [t.strip() for t in given.split(",") if t.strip()] or None
    return LoraConfig(
        r=job.lora_r,
        lora_alpha=job.lora_alpha,
        target_modules=targets,
        lora_dropout=job.lora_dropout,
        task_type="CAUSAL_LM",
    )


def checkpoint_policy(path):
    """The policy saved in a checkpoint of ``rlhfkit rl``, ``sft``, ``dpo`` or ``kto``
    (``<run>/checkpoint-N/``), as a merged causal LM, with the base model's source for the
    tokenizer — or None when ``path`` is not such a checkpoint. The run's ``config.yaml`` names the
    base model and the LoRA settings; the checkpoint holds the trained weights (all of them, or the
    adapter's) under the module name ``policy`` (RL) or ``model`` (SFT, DPO, KTO)."""
    from .config.io import load_config
    from .run.checkpoint import DCP_DIR, STATE_FILE, has_module_weights, load_module_weights, read_dcp_metadata

    path = Path(path)
    if not (path.is_dir() and (path / STATE_FILE).is_file()):
        return None
    if (path / DCP_DIR / ".metadata").is_file():
        modules = {k.split(".", 1)[0] for k in read_dcp_metadata(path / DCP_DIR).state_dict_metadata}
    else:  # the single-process format of earlier versions (RL only)
        modules = {"policy"} if has_module_weights(path, "policy") else set()
    name, job_classes = (
        ("policy", (RLJob,))
        if "policy" in modules
        else ("model", (SFTJob, DPOJob, KTOJob))
        if "model" in modules and "critic" not in modules
        else (None, ())
    )
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
        raise ValueError(
            f"checkpoint {path} holds no policy: {record} is not the record of an rlhfkit sft, dpo, "
            "kto or rl run (a reward model is evaluated as a reward: --reward <run>/final)"
        )
    if job is None or not job.model:
        raise ValueError(
            f"checkpoint {path}: {record} does not name the run's model (a run started from "
            "Python records only its trainer config); load the base model and apply the policy "
            "weights (rlhfkit.run.checkpoint.load_module_weights), or evaluate the run's final/"
        )
    from .models import load_causal_lm

    model = load_causal_lm(job.model, job.dtype)
    peft = lora_config(job)
    if peft is not None:
        from .models.lora import apply_lora

        model = apply_lora(model, peft)
    load_module_weights(path, name, model)  # the sharded format of any process count, or an older one
    if peft is not None:
        model = model.merge_and_unload()
    return model, job.model


def check_eval_output(output: str, overwrite: bool, inputs: dict) -> None:
    """``eval --output``, before any model is loaded: a file in an existing directory, never one of
    the command's ``inputs`` (flag -> path) nor inside one, and an existing file replaced only when
    it is an earlier ``eval`` result or with ``--overwrite``."""
    out = Path(output)
    if out.is_dir():
        raise ValueError(f"--output {output!r} is a directory: name a file")
    if not out.resolve().parent.is_dir():
        raise ValueError(f"--output {output!r}: no directory {str(out.parent)!r}")
    for flag, value in inputs.items():
        given = Path(value).resolve() if value and Path(value).exists() else None
        if given is not None and (given == out.resolve() or given in out.resolve().parents):
            raise ValueError(f"--output {output!r} would overwrite {flag} {value!r}: name another file")
    if out.exists() and not overwrite and not _eval_result(out):
        raise ValueError(
            f"--output {output!r} exists and is not an rlhfkit eval result: name another file, "
            "or --overwrite to replace it"
        )


def _eval_result(path: Path) -> bool:
    """Whether ``path`` holds what ``eval --output`` writes (a JSON object with metrics and samples)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("metrics"), dict) and "samples" in data


def write_eval_output(output: str, result: dict) -> None:
    """``result`` as JSON, whole or not at all (``files.write_text_atomic``)."""
    import json

    from .files import write_text_atomic

    write_text_atomic(output, json.dumps(result, indent=1))
