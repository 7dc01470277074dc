"""What every trainer's config shares: the fixed lists of choices of the shared fields (each named
once; ``check_fields`` refuses any other value), the optimiser and run fields (``OptimBase``,
``RunBase``) that ``RLConfig`` (``rl.py``) and the supervised configs (``supervised.py``) both build
on, and their rules: ``shared_rules`` (these fields' choices) and ``placement_rules`` (where and in
what precision a model runs: ``dtype``, ``device``, ``autocast``, ``parallelism``, which every config
declares in its own words)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
SCHEDULERS = ("constant", "linear", "cosine", "hf_constant", "hf_linear", "hf_cosine")
PARALLELISMS = ("fsdp", "ddp")
DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu")
LM_HEADS = ("chunked", "full")  # how log-prob passes read the output layer (models.lm_head)
CHECKPOINTING_MODES = ("off", "on", "auto")  # gradient_checkpointing (models.memory.MemoryPlan); True/False: on/off
AUTOCAST_DTYPES = ("bfloat16", "float16")

Rule = tuple[bool, str, str]  # a check_fields entry: (holds, the field it names, what the field must be)


def ranged(default: Any, spec: str) -> Any:
    """A numeric field's declaration with its allowed values beside it: ``lam: float = ranged(0.95, "[0, 1]")``.
    ``spec`` in ``checks.in_range``'s notation ("(a, b)" open, "[a, b]" closed, "> a", ">= a", "finite"; "or None"
    admits None where the annotation does); ``checks.check_ranges`` enforces it at construction."""
    return dataclasses.field(default=default, metadata={"range": spec})


def preset(spec: str | None = None) -> Any:
    """A field the algorithm's preset fills (``presets.PRESETS``) when the user leaves it unset (None, the
    default): after construction it always holds a value of its annotation, so it is annotated without None.
    ``spec``: its allowed values, as ``ranged``'s."""
    metadata: dict[str, object] = {"preset": True}
    if spec is not None:
        metadata["range"] = spec
    return dataclasses.field(default=None, metadata=metadata)


@dataclass(frozen=True)
class OptimBase:
    """Optimiser fields every trainer shares."""

    learning_rate: float = ranged(1e-5, "> 0")
    """AdamW peak learning rate (of the policy, in RL)."""
    weight_decay: float = ranged(0.0, ">= 0")
    """AdamW decoupled weight decay on every trainable parameter (norms and biases too)."""
    max_grad_norm: float | None = ranged(1.0, "> 0 or None")
    """Clip the global gradient norm to this; None: off."""
    warmup_steps: int = ranged(0, "[0, 1e9]")
    """Linear learning-rate warmup, in applied optimizer steps (a step skipped for a non-finite loss or gradient does
    not advance the schedule)."""
    lr_scheduler: str = "constant"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine (Loshchilov & Hutter 2017) (SCHEDULERS);
    the warmup factor is (s+1)/(w+1) after s updates. hf_constant, hf_linear, hf_cosine: transformers' formulas (TRL's
    drop-in configs select them): warmup factor s/w, so the first update runs at learning rate 0."""
    max_consecutive_skips: int = ranged(3, "[1, 1e9]")
    """An optimizer step whose loss or gradient norm is not finite is skipped (weights untouched, counted in
    perf/skipped_steps); this many in a row stop the run with an error."""


@dataclass(frozen=True)
class RunBase:
    """Run fields every trainer shares."""

    seed: int = ranged(0, "[0, 2147483647]")
    """Seed of torch, numpy and Python's random, and of the data order."""
    output_dir: str | None = None
    """Run directory (config.yaml, metrics.jsonl, plots/, checkpoints, final/); None: nothing is written."""
    log_every: int = ranged(1, "[0, 1e9]")
    """Print a progress line every this many steps (0: silent); metrics.jsonl gets every step."""
    progress_bar: bool = True
    """On a terminal, show a progress bar with ETA and the main metric; False (--quiet): log lines only."""
    overwrite: bool = False
    """Allow output_dir to exist and hold files already (they may be replaced). False: refuse, so no run is lost."""
    save_steps: int = ranged(0, "[0, 1e9]")
    """Write a checkpoint (output_dir/checkpoint-<step>) every this many optimizer steps (0: only the final model)."""
    save_total_limit: int | None = ranged(None, "[1, 1e9] or None")
    """Keep only the newest this many checkpoints of this run (older checkpoint-N directories are deleted); None: keep
    all."""
    resume_from: str | None = None
    """Checkpoint directory to continue from (weights, optimizer, scheduler, RNG, data position), or 'latest' (the
    newest complete checkpoint in output_dir): the resumed run ends with the weights of an uninterrupted one; resumed
    inside its run, metrics.jsonl and samples.jsonl drop the rows after the checkpoint's step."""
    save_adapter: bool = False
    """With LoRA: False writes final/ with the adapter merged into the base weights (a plain model directory); True
    writes the adapter alone (adapter_config.json + adapter_model.safetensors, which peft and transformers load on top
    of the base model)."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers that get every logged metric, the run name and the config, besides metrics.jsonl (always
    written): any of tensorboard (event files in output_dir/runs), wandb, mlflow, trackio; each is an optional extra
    (pip install 'rlhfkit[tensorboard]', ...). Empty: none."""
    run_name: str | None = None
    """The run's name in the trackers; None: the output_dir's last component (or 'rlhfkit')."""
    gradient_checkpointing: str | bool = "auto"
    """Activation checkpointing, a policy (CHECKPOINTING_MODES; models/memory.py): 'off' keeps every decoder layer's
    activations for backward (fastest, most memory); 'on' recomputes each layer in backward (non-reentrant; about a
    third more compute of the passes with gradient, the activation memory of one hidden state per layer and token);
    'auto' decides per micro-batch from the activation cost a probe measures at set-up (the run's own forward pass on a
    few short rows, with and without checkpointing) against the memory the device has free (memory_budget_gb): a
    micro-batch that fits runs without checkpointing, one that would not checkpoints, and micro-batches are split so
    one always fits (a single row that cannot is refused before the first step). True / False (TRL's form): 'on' /
    'off'. The same weights in every mode, up to float rounding."""
    memory_budget_gb: float | None = ranged(None, "> 0 or None")
    """The memory this run may use on its device, in GB (weights, gradients, optimizer state and activations
    together): 'auto' checkpointing and max_tokens_per_micro_batch='auto' keep under it (a smaller card, room for
    other processes). None: what the device has free (CUDA: the driver's free memory and torch's cache, under
    torch.cuda.set_per_process_memory_fraction; a CPU: MemAvailable and a container's limit)."""
    lm_head: str = "chunked"
    """How log-probs, entropies and the SFT loss read the model's output layer (LM_HEADS). 'chunked': from the last
    hidden states through the head in chunks of rows, the softmax statistics in float32 and recomputed in backward, so
    no tokens x vocabulary logits tensor exists (models.lm_head; a model whose head is not a plain linear map, or whose
    forward changes the head's output, such as Gemma 2's soft-capping, runs 'full'). 'full': the model's own logits, as
    transformers computes them."""


def shared_rules(c) -> list[Rule]:
    """The choices of ``OptimBase``'s and ``RunBase``'s fields (``lr_scheduler``, ``lm_head``; the ranges and
    ``gradient_checkpointing`` / ``report_to`` are ``checks.check_ranges`` / ``check_run_fields``)."""
    return [
        (c.lr_scheduler in SCHEDULERS, "lr_scheduler", f"one of {', '.join(SCHEDULERS)}"),
        (c.lm_head in LM_HEADS, "lm_head", f"one of {', '.join(LM_HEADS)}"),
    ]


def placement_rules(c) -> list[Rule]:
    """The choices of where and how a model runs, fields every trainer's config declares: ``dtype``, ``device``,
    ``parallelism``, ``autocast``."""
    return [
        (c.dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}"),
        (
            c.device == "auto" or c.device.split(":")[0] in DEVICE_KINDS,
            "device",
            "'auto', 'cpu', 'cuda' (or 'cuda:N'), 'mps' or 'xpu'",
        ),
        (c.parallelism in PARALLELISMS, "parallelism", f"one of {', '.join(PARALLELISMS)}"),
        (
            c.autocast is None or c.autocast in AUTOCAST_DTYPES,
            "autocast",
            f"None or one of {', '.join(AUTOCAST_DTYPES)}",
        ),
    ]
