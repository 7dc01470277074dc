"""GPU check: SFT, DPO, GRPO, PPO, LoRA, FSDP2, quantized and compiled rollout steps of rlhfkit, and the
HF engine's decode speeds, on one CUDA GPU, as one JSON report.

    python benchmarks/gpu_check.py                   # one CUDA GPU: a Qwen2.5-0.5B-shaped model (< 8 min)
    python benchmarks/gpu_check.py --device cpu      # the same checks on a tiny Qwen2, gloo (~10 s)
    python benchmarks/gpu_check.py --only grpo,fsdp  # some checks

Nothing is downloaded: the model is a randomly initialised ``Qwen2ForCausalLM`` built from a config
(on CUDA Qwen2.5-0.5B's shape: 24 layers, hidden 896, 14 heads / 2 KV heads, vocabulary 151936,
tied embeddings; ~494M parameters) and the tokenizer a character-level one built locally, padded
to the model's vocabulary (``qwen_like_tokenizer``, ``benchmarks/models.py``). Each check builds a
fresh model and trains it for ``--steps`` steps (the first is the warm-up, left out of the times)
with a run directory, so the step timeline (``trace.json``) and the plots are written as in any run:

- ``sft``: SFTTrainer, weights in bfloat16;         ``dpo``: DPOTrainer (policy + reference), bfloat16;
- ``grpo``: RLTrainer GRPO on the HF engine, bf16;  ``ppo``: RLTrainer PPO (separate critic), bf16;
- ``lora``: GRPO with a LoRA adapter (r 16, attention projections) on the bf16 base;
- ``quantized``: GRPO sampling from an fp8 copy of the policy (``rollout_precision='fp8'``, torchao;
  int8 on the CPU), with the ``rollout/*`` mismatch metrics; ``compiled``: GRPO with
  ``hf_decode='static'`` (transformers' static cache, compiled with CUDA graphs on CUDA) on bf16
  weights, on float32 weights under bf16 autocast, and that with LoRA (``variants``); ``decode``:
  decode tokens/s of the HF engine's variants (``DECODE_VARIANTS``: generate, loop, static, bf16 and
  fp8 copies on CUDA; int8 and bf16 copies on the CPU) side by side, with each copy's log-prob gap;
- ``fsdp``: GRPO with FSDP2 over a process group of one process (NCCL on CUDA, gloo on the CPU),
  float32 master weights computing in bfloat16 (autocast; FSDP2's mixed precision on CUDA). rlhfkit
  shards only when a role has several processes, so the check switches ``distributed.role_active`` on
  for it: the sharding, the gathering for generation, the all-reduces, the optimizer step on DTensors
  and the gathering of the full state dict run as in a multi-process run, on one GPU. Not the save of
  ``final/`` (it gathers when ``role_size() > 1``, which one process never is): this check has no run
  directory, and its ``step_s`` is the sum of its phases (``perf/time_*``), not a timeline step.

It prints one JSON object: per check ``ok``, the mean ``step_s`` (the timeline's ``step`` events
after the warm-up), ``tokens_per_s`` (RL: generated tokens over the step's phases, ``perf/tokens_per_s``;
SFT / DPO: trained tokens over the step), ``peak_cuda_gb`` (``torch.cuda.max_memory_allocated``), the
mean ``perf/time_*`` phase seconds and every other ``perf/*`` counter the last step logged; and exits
1 when any check failed (each failure named on stderr, with its traceback).

**Offline install** (the GPU machine has PyTorch >= 2.11, transformers >= 5.17, peft and
accelerate, no network; rlhfkit needs nothing from ``datasets`` or vLLM here). Beyond what
transformers brings (numpy, pyyaml, safetensors, tokenizers, tqdm), rlhfkit needs matplotlib (the
run directory's plots) and its dependencies. On a machine with network, for the GPU machine's Python
(here 3.12):

    pip download --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux2014_x86_64 \\
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d wheels \\
        matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil tzdata

(24.9 MB in all for cp312, measured 2026-11-27), copy ``wheels/`` and this repository over, then

    pip install --no-index --find-links wheels matplotlib   # what is already installed stays
    python benchmarks/gpu_check.py                      # rlhfkit is imported from the checkout itself

(docs/results/speed.md, "GPU check").
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rlhfkit from this checkout, installed or not

from benchmarks import gpu_rl  # noqa: E402  (the rollout checks: quantized, compiled, decode)
from benchmarks.gpu_rl import rl_trainer, text  # noqa: E402
from benchmarks.models import QWEN25_05B, build_model, qwen_like_tokenizer  # noqa: E402

CHECKS = ("sft", "dpo", "grpo", "ppo", "lora", "fsdp", "quantized", "compiled", "decode")
MODELS = {
    "cuda": QWEN25_05B,
    "cpu": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=256,
        max_position_embeddings=512,
    ),
}
# The work of one step: prompt characters (= tokens), completions, rows.
WORK = {
    "cuda": dict(
        prompt=64,
        new_tokens=128,
        prompts=8,
        group=4,
        ppo_prompts=16,
        sft_length=512,
        sft_batch=8,
        dpo_length=256,
        dpo_batch=4,
    ),
    "cpu": dict(
        prompt=16,
        new_tokens=8,
        prompts=2,
        group=2,
        ppo_prompts=2,
        sft_length=32,
        sft_batch=2,
        dpo_length=24,
        dpo_batch=2,
    ),
}


# ---------------------------------------------------------------- the checks
def check_sft(ctx):
    from rlhfkit.trainers import SFTConfig, SFTTrainer

    w, half = ctx.work, (ctx.work["sft_length"] - 1) // 2  # prompt + completion + EOS fit max_length
    rows = [{"prompt": text(i, half), "completion": text(i + 1, half)} for i in range(w["sft_batch"] * ctx.steps)]
    args = SFTConfig(
        batch_size=w["sft_batch"], max_length=w["sft_length"], max_steps=ctx.steps, dtype="bfloat16", **ctx.common()
    )
    trainer = SFTTrainer(ctx.model(torch.bfloat16), args, rows, processing_class=ctx.tokenizer)
    return ctx.measure(trainer, "sft/loss", tokens=lambda row: row["sft/tokens"])


def check_dpo(ctx):
    from rlhfkit.trainers import DPOConfig, DPOTrainer

    w, third = ctx.work, ctx.work["dpo_length"] // 3
    rows = [
        {"prompt": text(i, third), "chosen": text(i + 1, third), "rejected": text(i + 2, third)}
        for i in range(w["dpo_batch"] * ctx.steps)
    ]
    args = DPOConfig(
        batch_size=w["dpo_batch"], max_length=w["dpo_length"], max_steps=ctx.steps, dtype="bfloat16", **ctx.common()
    )
    trainer = DPOTrainer(ctx.model(torch.bfloat16), args, rows, processing_class=ctx.tokenizer)
    tokens = 2 * 2 * third * w["dpo_batch"]  # chosen and rejected rows, prompt + answer each
    return ctx.measure(trainer, "dpo/loss", tokens=lambda row: tokens)


def check_grpo(ctx):
    return ctx.measure(rl_trainer(ctx, "grpo"), "reward/mean")


def check_ppo(ctx):
    return ctx.measure(rl_trainer(ctx, "ppo"), "critic/loss")


def check_lora(ctx):
    return ctx.measure(rl_trainer(ctx, "grpo", peft_config=gpu_rl.lora_config()), "reward/mean")


def check_fsdp(ctx):
    from rlhfkit import distributed

    ctx.out_dir = None  # no final/: the export gathers only when the role has several processes (see above)
    with one_process_group(ctx.device):
        trainer = rl_trainer(ctx, "grpo", torch.float32, parallelism="fsdp", autocast="bfloat16")
        policy = trainer.models.policy
        if not any(type(m).__name__.startswith("FSDP") for m in policy.modules()):
            raise RuntimeError("the policy was not sharded by FSDP2")
        result = ctx.measure(trainer, "reward/mean")
        full = distributed.full_state_dict(policy)  # what a multi-process run's save gathers
        if sum(v.numel() for v in full.values()) < sum(p.numel() for p in policy.parameters()):
            raise RuntimeError("the gathered state dict is smaller than the model")
    return result


@contextmanager
def one_process_group(device: torch.device):
    """A process group of this process alone (NCCL on CUDA, gloo on the CPU) in which rlhfkit acts
    as in a multi-process role: ``distributed.role_active`` True, collectives on ``device``."""
    import torch.distributed as dist

    from rlhfkit import distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    saved = distributed.role_active, distributed._DEVICE[0]
    distributed.role_active, distributed._DEVICE[0] = (lambda: True), device
    try:
        yield
    finally:
        distributed.role_active, distributed._DEVICE[0] = saved
        dist.destroy_process_group()


class Context:
    """What every check shares: device, model shape, work sizes, tokenizer, steps, a run directory."""

    def __init__(self, device: torch.device, steps: int):
        self.device, self.steps = device, steps
        self.shape, self.work = MODELS[device.type], WORK[device.type]
        self.tokenizer = qwen_like_tokenizer(self.shape["vocab_size"])
        self.out_dir = None
        self.last: dict = {}  # the last check's last logged step

    def model(self, dtype: torch.dtype):
        return build_model(self.shape, self.tokenizer, self.device, dtype)

    def common(self) -> dict:
        return dict(
            device=self.device.type,
            output_dir=self.out_dir,
            log_every=0,
            progress_bar=False,
            learning_rate=1e-6,
            seed=0,
        )

    def measure(self, trainer, key: str, tokens=None) -> dict:
        """Train; the step times from the run's timeline (warm-up step left out), tokens/s, the
        phases' mean seconds and the last step's other ``perf/*`` counters; a missing or
        non-finite ``key`` metric fails the check."""
        history = trainer.train()
        self.last = history[-1] if history else {}
        if len(history) != self.steps or not all(math.isfinite(float(r.get(key, math.nan))) for r in history):
            raise RuntimeError(f"{key} missing or not finite in the logged steps: {[r.get(key) for r in history]}")
        rows = history[1:] or history
        if self.out_dir is None:  # no run directory, no timeline: the step's phases
            steps = [(r["step"], sum(v for k, v in r.items() if k.startswith("perf/time_"))) for r in history]
        else:
            events = json.loads((Path(self.out_dir) / "trace.json").read_text())["traceEvents"]
            steps = sorted((e["args"]["step"], e["dur"] / 1e6) for e in events if e["name"] == "step" and e["pid"] == 0)
        if [s for s, _ in steps] != list(range(1, self.steps + 1)):
            raise RuntimeError(f"the timeline holds steps {[s for s, _ in steps]}, not 1..{self.steps}")
        timed = [d for _, d in steps[1:]] or [steps[0][1]]
        step_s = sum(timed) / len(timed)
        result = {"step_s": round(step_s, 4), "steps_timed": len(timed)}
        if tokens is not None:
            result["tokens_per_s"] = round(sum(tokens(r) for r in rows) / len(rows) / step_s, 1)
        elif "perf/tokens_per_s" in rows[0]:
            result["tokens_per_s"] = round(sum(r["perf/tokens_per_s"] for r in rows) / len(rows), 1)
        phases = sorted({k for r in rows for k in r if k.startswith("perf/time_")})
        result["phases_s"] = {
            k.removeprefix("perf/time_"): round(sum(r.get(k, 0.0) for r in rows) / len(rows), 4) for k in phases
        }
        result["perf"] = {
            k: v
            for k, v in history[-1].items()
            if k.startswith("perf/") and not k.startswith("perf/time_") and k != "perf/tokens_per_s"
        }
        result[key] = history[-1][key]
        return result


def run_check(name: str, ctx: Context) -> dict:
    """One check in its own run directory; its failure is caught, named and printed, never fatal."""
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as out:
        ctx.out_dir = str(Path(out) / "run")
        try:
            result = {"ok": True, **(globals().get(f"check_{name}") or getattr(gpu_rl, f"check_{name}"))(ctx)}
        except Exception as e:  # noqa: BLE001 — every failure is reported by its check's name
            traceback.print_exc()
            print(f"gpu_check: {name} FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    result["wall_s"] = round(time.perf_counter() - start, 2)
    if cuda:
        result["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    gc.collect()
    print(
        f"gpu_check: {name} {'ok' if result['ok'] else 'FAILED'} in {result['wall_s']} s", file=sys.stderr, flush=True
    )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cuda: the Qwen2.5-0.5B-shaped model; cpu: a tiny one of the same architecture",
    )
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated checks of {', '.join(CHECKS)}")
    p.add_argument("--steps", type=int, default=3, help="steps per check; the first is the warm-up")
    p.add_argument(
        "--budget-s", type=float, default=480.0, help="checks not started within this many seconds fail as out of time"
    )
    a = p.parse_args(argv)
    only = [c.strip() for c in a.only.split(",") if c.strip()]
    unknown = [c for c in only if c not in CHECKS]
    if unknown or a.steps < 1:
        p.error(f"unknown check(s) {unknown}: choose from {', '.join(CHECKS)}" if unknown else "--steps must be >= 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --device cpu for the small CPU run", file=sys.stderr)
        return 1
    import peft
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    start = time.perf_counter()
    device = torch.device(a.device, 0) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ctx = Context(device, a.steps)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "model": {"architecture": "Qwen2ForCausalLM", **ctx.shape},
        "work": ctx.work,
        "steps": a.steps,
        "checks": {},
    }
    for name in only:
        if time.perf_counter() - start > a.budget_s:
            report["checks"][name] = {"ok": False, "error": f"not started: past the {a.budget_s:g} s budget"}
            continue
        report["checks"][name] = run_check(name, ctx)
    report["total_s"] = round(time.perf_counter() - start, 1)
    failed = [n for n, r in report["checks"].items() if not r["ok"]]
    report["ok"] = not failed
    print(json.dumps(report, indent=1))
    if failed:
        print(f"gpu_check: FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
