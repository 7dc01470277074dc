"""The child process of ``benchmarks/scale.py``: one run of one side (``--child trl|rlhfkit``),
GRPO or SFT at one completion length, dtype and checkpointing setting (and memory budget), printing its
measurements as one JSON line (the module docstring of ``scale.py`` defines them).

``--checkpointing``: ``default`` passes nothing; TRL gets ``gradient_checkpointing`` True / False for
``on`` / ``off`` and its default for ``auto`` (TRL has no such policy); rlhfkit gets the string (``'on'``,
``'off'``, ``'auto'``) when its config's ``gradient_checkpointing`` field is not a plain bool, else True /
False (``auto`` then fails, named). ``--memory-budget-gb``: on CUDA both sides' processes are capped by
``torch.cuda.set_per_process_memory_fraction`` before any allocation; rlhfkit also gets
``memory_budget_gb`` when its config has that field."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import tempfile
import time
import zlib


def reward(prompts, completions, **columns):
    """A different score per completion (a hash of its text), so every group has gradient."""
    return [zlib.crc32(str(c).encode()) / 2**32 for c in completions]


def make_timer(cuda: bool):
    import torch
    from transformers import TrainerCallback

    sync = torch.cuda.synchronize if cuda else (lambda: None)

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            self.times.append(time.perf_counter() - self.start)

    return Timer()


def rows(a) -> list[dict]:
    from benchmarks.gpu_rl import text

    if a.part == "rl":
        return [{"prompt": text(i, a.prompt_length)} for i in range(2 * a.prompts * (a.warmup + a.steps))]
    half = (a.length - 1) // 2  # prompt + completion + EOS = L tokens
    return [
        {"prompt": text(i, half), "completion": text(i + 1, a.length - 1 - half)}
        for i in range(a.sft_rows * (a.warmup + a.steps))
    ]


def value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_trl(a, timer):
    from datasets import Dataset

    common = dict(
        output_dir=tempfile.mkdtemp(),
        max_steps=a.warmup + a.steps,
        logging_steps=1,
        report_to="none",
        use_cpu=a.device == "cpu",
        bf16=a.dtype == "bf16",
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
        # TRL has no policy: 'auto' runs its default (on), as 'default' does
        **({"gradient_checkpointing": a.checkpointing == "on"} if a.checkpointing in ("on", "off") else {}),
    )
    data = Dataset.from_list(rows(a))
    if a.part == "rl":
        from trl import GRPOConfig, GRPOTrainer

        cfg = GRPOConfig(
            per_device_train_batch_size=a.prompts * a.group_size,
            num_generations=a.group_size,
            max_completion_length=a.length,
            learning_rate=1e-6,
            beta=0.0,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            **common,
        )
        trainer = GRPOTrainer(model=a.model_dir, reward_funcs=[reward], args=cfg, train_dataset=data, callbacks=[timer])
    else:
        from trl import SFTConfig, SFTTrainer

        cfg = SFTConfig(per_device_train_batch_size=a.sft_rows, max_length=a.length, **common)
        trainer = SFTTrainer(model=a.model_dir, args=cfg, train_dataset=data, callbacks=[timer])
    return trainer, trainer.model, cfg.gradient_checkpointing, {}


def rlhfkit_fields(cls, a) -> dict:
    """What ``--checkpointing`` and ``--memory-budget-gb`` give rlhfkit's config ``cls``: the checkpointing
    policy as a string where the field takes one (its annotation is no plain bool), else a bool (before the
    policy, where any truthy value, 'off' too, would turn it on); the budget where the field exists."""
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    out = {}
    if a.checkpointing != "default":
        if types["gradient_checkpointing"] not in (bool, "bool"):
            out["gradient_checkpointing"] = a.checkpointing
        elif a.checkpointing == "auto":
            raise SystemExit(f"{cls.__name__}.gradient_checkpointing is a bool in this checkout: no 'auto' policy")
        else:
            out["gradient_checkpointing"] = a.checkpointing == "on"
    if a.memory_budget_gb is not None and "memory_budget_gb" in types:
        out["memory_budget_gb"] = a.memory_budget_gb
    return out


def build_rlhfkit(a, timer):
    from rlhfkit.config import RLConfig
    from rlhfkit.trainers import RLTrainer, SFTConfig, SFTTrainer

    cls = RLConfig if a.part == "rl" else SFTConfig
    fields = rlhfkit_fields(cls, a)
    common = dict(
        max_steps=a.warmup + a.steps,
        log_every=0,
        progress_bar=False,
        seed=0,
        device=a.device,
        autocast="bfloat16" if a.dtype == "bf16" else None,
        **fields,
        **{k: value(v) for k, v in (s.split("=", 1) for s in a.rlhfkit_set)},
    )
    if a.part == "rl":
        cfg = RLConfig(
            algorithm="grpo",
            prompts_per_step=a.prompts,
            group_size=a.group_size,
            max_new_tokens=a.length,
            learning_rate=1e-6,
            kl_coef=0.0,
            **common,
        )
        trainer = RLTrainer(a.model_dir, [reward], cfg, train_dataset=rows(a), callbacks=[timer])
        return trainer, trainer.models.policy, cfg.gradient_checkpointing, fields
    cfg = SFTConfig(batch_size=a.sft_rows, max_length=a.length, **common)
    trainer = SFTTrainer(a.model_dir, cfg, rows(a), callbacks=[timer])
    return trainer, trainer.model, cfg.gradient_checkpointing, fields


def state_bytes(model) -> tuple[int, int]:
    """(parameters, bytes of weights + gradients + AdamW's two moments): 4 n s per trainable tensor."""
    n = b = 0
    for p in model.parameters():  # a tied weight once
        n += p.numel()
        b += p.numel() * p.element_size() * (4 if p.requires_grad else 1)
    return n, b


def checkpointed(side: str, model, history) -> tuple[bool, float | None]:
    """Whether the model ran with activation checkpointing, and the share of its passes with gradient that
    did where the run says (rlhfkit's ``perf/checkpointed_frac``: ``auto`` decides per pass, so the layers'
    flags, which transformers sets on each layer it checkpoints, say only that it was installed)."""
    fracs = [r["perf/checkpointed_frac"] for r in history if "perf/checkpointed_frac" in r] if side == "rlhfkit" else []
    if fracs:
        frac = sum(fracs) / len(fracs)
        return frac > 0, frac
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()), None


def completion_lengths(side: str, trainer, history) -> list[float]:
    """Each step's mean completion length (L on every step when no completion ended early)."""
    if side == "trl":
        return [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
    return [r["rollout/response_length_mean"] for r in history]


def prepare(a):
    """Imports everything either side imports while it builds its trainer (before the baseline), caps CUDA
    memory at the budget; returns (the memory reader, the fraction set or None)."""
    import accelerate  # noqa: F401
    import peft  # noqa: F401
    import torch
    import transformers
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    import benchmarks.gpu_rl  # noqa: F401

    if a.child == "trl":
        import datasets  # noqa: F401
        from trl import GRPOTrainer, SFTTrainer  # noqa: F401
    else:
        from rlhfkit.trainers import RLTrainer, SFTTrainer  # noqa: F401, F811

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if a.device != "cuda":
        return (lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")), None
    torch.cuda.init()
    fraction = None
    if a.memory_budget_gb is not None:  # a smaller card emulated: allocations past it fail out of memory
        fraction = min(1.0, a.memory_budget_gb * 1e9 / torch.cuda.get_device_properties(0).total_memory)
        torch.cuda.set_per_process_memory_fraction(fraction)
    return torch.cuda.memory_allocated, fraction


class SavedActivations:
    """The bytes of the tensors autograd keeps for backward, live and at their peak, while its hooks are
    installed (``counting``): each storage once while any saved reference to it lives, parameters left
    out. The same count on both sides and on any device (the CPU's peak RSS is too coarse for a layer's
    share: it holds model loading's transients); inside a non-reentrant checkpoint the layer's own
    saves are the checkpoint's, so with checkpointing it counts what is kept between forward and
    backward — the layers' inputs —, not one layer's recompute."""

    def __init__(self):
        self.live = self.peak = 0
        self.refs: dict[int, list[int]] = {}

    def pack(self, t):
        import torch

        if isinstance(t, torch.nn.Parameter):
            return t
        storage = t.untyped_storage()
        key = storage.data_ptr()
        entry = self.refs.get(key)
        if entry is None:
            self.refs[key] = [1, storage.nbytes()]
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        else:
            entry[0] += 1
        return _Held(self, key, t)

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[0] -= 1
        if not entry[0]:
            self.live -= entry[1]
            del self.refs[key]

    def counting(self):
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda h: h.tensor if isinstance(h, _Held) else h)


class _Held:
    """A saved tensor as the graph holds it; released from the count when the graph drops it."""

    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter: SavedActivations, key: int, tensor):
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self):
        self.meter.release(self.key)


def child(a) -> None:
    import torch

    cuda = a.device == "cuda"
    now, fraction = prepare(a)
    baseline = now()
    timer = make_timer(cuda)
    torch.manual_seed(0)
    trainer, model, configured, passed = (build_trl if a.child == "trl" else build_rlhfkit)(a, timer)
    loaded = now()
    meter = SavedActivations()
    with meter.counting() if not cuda else contextlib.nullcontext():  # CUDA: the allocator's own numbers
        history = trainer.train()
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    params, state = state_bytes(model)
    used, frac = checkpointed(a.child, model, history)
    times = timer.times[a.warmup :] or timer.times
    tokens = a.prompts * a.group_size * a.length if a.part == "rl" else a.sft_rows * a.length
    floor = baseline + state
    out = {
        "part": a.part,
        "side": a.child,
        "layers": model.config.num_hidden_layers,
        "length": a.length,
        "dtype": a.dtype,
        "checkpointing": a.checkpointing,
        "gradient_checkpointing": used,
        "checkpointed_frac": frac,
        "gradient_checkpointing_config": configured,
        "memory_budget_gb": a.memory_budget_gb,
        "memory_fraction": fraction,
        "rlhfkit_fields": passed,
        "device": a.device,
        "params": params,
        "tokens": tokens,
        "step_s": sum(times) / len(times),
        "steps_s": times,
        "peak_gb": peak / 1e9,
        "baseline_gb": baseline / 1e9,
        "loaded_gb": loaded / 1e9,
        "floor_gb": floor / 1e9,
        "above_floor_gb": (peak - floor) / 1e9,
        **({} if cuda else {"activations_gb": meter.peak / 1e9}),
        "mb_per_1k_tokens": (peak - floor) / 1e6 / tokens * 1000,
    }
    if a.part == "rl":
        out["completion_len"] = completion_lengths(a.child, trainer, history)
        out["exact_length"] = all(x == a.length for x in out["completion_len"])
    print(json.dumps(out), flush=True)
