"""rlhfkit against TRL 1.16 at reasoning-length completions with a 150k vocabulary: GRPO and SFT,
peak memory, step time and memory per 1k tokens above the floor, at two depths for the activation
memory per layer, each run its own process.

    # CPU: Qwen2.5-0.5B's widths at 2 and 6 layers; TRL in its own venv (make setup-trl)
    .venv/bin/python benchmarks/scale.py --trl-python .venv-trl/bin/python --rounds 2 --json-out scale.jsonl
    # one CUDA GPU: full depth (24 layers), a 24 GB card emulated; the TRL side needs trl 1.16 and datasets
    python benchmarks/scale.py --device cuda --trl-python <python with trl 1.16> --memory-budget-gb 24
    # smoke (seconds): one side, a tiny model, two depths
    .venv/bin/python benchmarks/scale.py --only rlhfkit --lengths 8 --sft-lengths 32 --dtypes float32 \\
        --hidden 64 --vocab 512 --depths 1,2 --warmup 0 --steps 1 --rounds 1
    # the tables again from JSON lines already written (benchmarks/scale_summary.py)
    .venv/bin/python benchmarks/scale_summary.py scale.jsonl

**Model.** A randomly initialised ``Qwen2ForCausalLM`` built from a config (``benchmarks/models.py``):
by default Qwen2.5-0.5B's widths (hidden 896, 14 / 2 heads of 64, MLP 4864, vocabulary 151,936,
tied embeddings), at each depth of ``--depths`` (default 2,6 on the CPU, 24 with ``--device cuda``;
``--layers N`` is one depth, N); one model directory per depth, saved once (float32) with the local
character-level tokenizer; both sides load that directory. ``--work-dir DIR`` keeps the directories
there and reuses them on the next call of the same shape (default: a temporary directory, removed).

**Completions of exactly L tokens.** The RL directory's tokenizer has one token more than the model
has logits: its EOS, ``<|never|>``, is id V (the vocabulary size); ``config.json`` and
``generation_config.json`` declare the same EOS. Both sides stop generation at the tokenizer's EOS
and at the model's generation-config EOS (TRL 1.16 ``GRPOTrainer.eos_token_ids``; rlhfkit
``models.loading.eos_token_ids``) and nothing else, and a model of V logits never samples id V: every
completion runs to ``max_new_tokens`` = L, on both sides, with no logits processor that either side
could drop (rlhfkit's HF engine sets ``min_new_tokens``, ``suppress_tokens`` and the model's own
generation config aside, so those would bind TRL only). Each run checks it (``completion_len``).
SFT uses a second directory (the same weights, linked) with the plain tokenizer, EOS
``<|im_end|>``: SFT appends the EOS to each row, so it must be an id the model can embed.

**Work.** RL: GRPO, beta=0, ``--prompts`` x ``--group-size`` completions of L tokens after a
``--prompt-length``-token prompt, a reward that differs per completion (a hash of its text: no
group is left without gradient), one generation and one optimizer step per step; every other
setting each side's default (TRL: ``GRPOConfig`` defaults, gradient checkpointing on; rlhfkit:
``RLConfig`` defaults). SFT: ``--sft-rows`` prompt/completion rows of exactly L tokens (EOS
included), completion-only loss, TRL's ``SFTTrainer`` (1.16: gradient checkpointing on; its loss reads
the LM head in chunks, ``add_fused_lm_head``: no tokens x vocabulary logits) against rlhfkit's.
dtype float32: float32 weights and compute; bf16: float32 weights under bf16 autocast, TRL's
``bf16=True`` and rlhfkit's ``autocast="bfloat16"`` (as ``trl_grpo_step.py --compare`` pairs them).
``--rlhfkit-set key=value`` passes more fields to rlhfkit's config (e.g. ``lm_head=full``,
``hf_decode=static``); such runs are labelled ``rlhfkit[key=value]`` in the tables.

**Checkpointing** (``--checkpointing``, comma-separated): ``default`` each side's default; ``on`` /
``off`` both sides with activation checkpointing on / off; ``auto`` rlhfkit's policy that decides from
the measured activation cost against the free memory (or ``memory_budget_gb``), while TRL's side, which
has no such policy, runs its default (on) under that label. rlhfkit's ``gradient_checkpointing`` gets
the strings ``'on'`` / ``'off'`` / ``'auto'`` when its config field takes them; a config whose field is
a plain bool gets True / False (and ``auto`` fails there, named). What each model did is recorded as
``gradient_checkpointing`` (read from its modules after the run) and shown as (on) / (off).

**Memory budget** (``--memory-budget-gb X``, GB = 1e9 bytes as every number here): rlhfkit's side gets
``memory_budget_gb=X`` when its config has that field; on CUDA every child process of both sides also
calls ``torch.cuda.set_per_process_memory_fraction(X / total)`` before any allocation, so a smaller
card (24 GB) is emulated on a large one and a run beyond it fails out of memory. On the CPU nothing
caps TRL's side: the budget is only recorded (``memory_budget_gb``, ``memory_fraction`` null).

**Measured, per run** (one JSON line each, as it completes; ``--json-out`` appends them to a file):
``step_s`` the mean wall time of ``--steps`` steps after ``--warmup`` (the same ``TrainerCallback``
``on_step_begin`` / ``on_step_end`` on both sides; CUDA synchronised); ``peak_gb`` the process's
peak RSS (``getrusage``, CPU; model loading included) or ``torch.cuda.max_memory_allocated`` (CUDA);
``baseline_gb`` the process's own memory after its imports, before the model (current RSS from
``/proc/self/statm``; CUDA: ``memory_allocated``); ``loaded_gb`` the same once the trainer is built,
before the first step; ``floor_gb`` = baseline + the training state:
for each trainable parameter tensor of n elements of s bytes, 4 n s (weights, gradient, AdamW's two
moments in the parameter's dtype), n s for a frozen one (float32: 16 bytes per parameter; bf16
autocast keeps float32 weights, so the same); ``above_floor_gb`` = peak - floor and ``mb_per_1k_tokens``
= (peak - floor) / tokens x 1000 (RL: the step's completion tokens, prompts x group x L; SFT: rows x L).

**Per layer.** With two or more depths, the summary's last table gives, per side, part, L, dtype and
checkpointing, the **activation memory per layer per 1k tokens**: the difference of (peak - floor)
between the deepest and the shallowest depth, divided by the layer difference and by tokens / 1000.
The parameters' share (which grows with depth) is already subtracted by the floor, so this is what a
layer adds beyond its parameters; TRL's and rlhfkit's side by side with the ratio rlhfkit / TRL, and the
step-time ratio at the deepest depth. The tables before it: per depth, part, L, dtype and
checkpointing the medians and the ratios rlhfkit / TRL (``benchmarks/scale_summary.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # rlhfkit and benchmarks/ from this checkout

from benchmarks.scale_summary import per_layer, summary  # noqa: E402

SIDES = ("trl", "rlhfkit")
CHECKPOINTING = ("default", "on", "off", "auto")
NEVER = "<|never|>"  # the RL tokenizer's EOS: id V, one past the model's logits


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"), help="an interpreter with trl")
    p.add_argument("--only", choices=SIDES, help="run one side only")
    p.add_argument("--part", choices=["rl", "sft"], help="run one part only (default: both)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each side per configuration, alternated")
    p.add_argument("--depths", default=None, help="layer counts, comma-separated (default: 2,6 on the CPU, 24 on CUDA)")
    p.add_argument("--layers", type=int, default=None, help="one depth (the same as --depths N)")
    p.add_argument(
        "--hidden", type=int, default=896, help="hidden size; heads of 64, MLP width and KV heads in Qwen2.5's ratios"
    )
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt-length", type=int, default=64, help="prompt tokens (characters)")
    p.add_argument("--lengths", default="256,1024,4096", help="RL completion lengths L")
    p.add_argument("--sft-lengths", default="2048,8192", help="SFT tokens per row")
    p.add_argument("--sft-rows", type=int, default=2)
    p.add_argument("--dtypes", default="float32,bf16")
    p.add_argument("--checkpointing", default="default", help="comma-separated of default, on, off, auto")
    p.add_argument("--memory-budget-gb", type=float, default=None, help="rlhfkit's memory_budget_gb; on CUDA a cap")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="OMP/MKL threads of every run")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run; a run past it is reported failed")
    p.add_argument(
        "--rlhfkit-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an rlhfkit config field for every rlhfkit run (repeatable), e.g. lm_head=full",
    )
    p.add_argument("--json-out", help="also append every JSON line to this file")
    p.add_argument("--work-dir", default=None, help="keep the model directories here, reused (default: a temp dir)")
    # one measurement, in its own process (what the parent runs)
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    bad = set(a.checkpointing.split(",")) - set(CHECKPOINTING) or set(a.dtypes.split(",")) - {"float32", "bf16"}
    if bad:
        p.error(f"unknown value(s) {sorted(bad)} in --checkpointing / --dtypes")
    if a.layers is not None and a.depths is not None:
        p.error("--layers is one depth: give --depths or --layers, not both")
    return a


def ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x.strip()]


def depths(a) -> list[int]:
    if a.layers is not None:
        return [a.layers]
    return ints(a.depths or ("24" if a.device == "cuda" else "2,6"))


def shape(a, layers: int) -> dict:
    from benchmarks.models import QWEN25_05B

    heads = max(1, a.hidden // 64)
    return dict(
        QWEN25_05B,
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 4864 // 896,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 7),
        vocab_size=a.vocab,
        num_hidden_layers=layers,
    )


def save_models(a, layers: int, root: Path) -> tuple[Path, Path, int]:
    """The SFT directory (plain tokenizer) and the RL one (the same weights, linked; EOS id V), of one depth,
    under ``root``; reused when a previous call finished writing them (``--work-dir``)."""
    import torch

    from benchmarks.models import build_model, qwen_like_tokenizer

    sft, rl, done = root / "sft", root / "rl", root / "complete.json"
    if done.exists():
        return sft, rl, json.loads(done.read_text())["params"]
    tok = qwen_like_tokenizer(a.vocab)
    model = build_model(shape(a, layers), tok, torch.device("cpu"), torch.float32)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(sft)
    tok.save_pretrained(sft)
    tok.add_special_tokens({"eos_token": NEVER})  # id V: the model's logits stop at V - 1
    assert tok.eos_token_id == a.vocab, tok.eos_token_id
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    rl.mkdir(exist_ok=True)
    model.config.save_pretrained(rl)
    model.generation_config.save_pretrained(rl)
    tok.save_pretrained(rl)
    for f in sft.glob("model*.safetensors*"):
        if not (rl / f.name).exists():
            (rl / f.name).symlink_to(f)
    done.write_text(json.dumps({"params": params}))
    return sft, rl, params


# ---------------------------------------------------------------- one measurement (a child process)
def child_command(a, side: str, part: str, length: int, dtype: str, ckpt: str, model_dir: Path) -> list[str]:
    opts = {
        "--child": side,
        "--part": part,
        "--length": length,
        "--dtype": dtype,
        "--checkpointing": ckpt,
        "--model-dir": model_dir,
        "--device": a.device,
        "--prompts": a.prompts,
        "--group-size": a.group_size,
        "--prompt-length": a.prompt_length,
        "--sft-rows": a.sft_rows,
        "--warmup": a.warmup,
        "--steps": a.steps,
    }
    if a.memory_budget_gb is not None:
        opts["--memory-budget-gb"] = a.memory_budget_gb
    python = a.trl_python if side == "trl" else sys.executable
    return [python, __file__, *(f"{k}={v}" for k, v in opts.items()), *[f"--rlhfkit-set={s}" for s in a.rlhfkit_set]]


def run_one(a, side: str, part: str, layers: int, length: int, dtype: str, ckpt: str, model_dir: Path, env) -> dict:
    start = time.perf_counter()
    try:
        cmd = child_command(a, side, part, length, dtype, ckpt, model_dir)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
        lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
        row = json.loads(lines[-1]) if out.returncode == 0 and lines else {"error": out.stderr[-2000:]}
    except subprocess.TimeoutExpired:
        row = {"error": f"timed out after {a.timeout:g} s"}
    base = {
        "part": part,
        "side": side,
        "layers": layers,
        "length": length,
        "dtype": dtype,
        "checkpointing": ckpt,
        "variant": " ".join(a.rlhfkit_set) if side == "rlhfkit" else "",
        "memory_budget_gb": a.memory_budget_gb,
    }
    return {**base, **row, "wall_s": round(time.perf_counter() - start, 1), "load1": os.getloadavg()[0]}


def plan(a, sides: list[str]) -> list[tuple]:
    """Every run, in order: per part, L, dtype and checkpointing, each depth in turn, the rounds, the sides
    alternated (so an interrupted sweep has both depths of its first configurations)."""
    parts = [a.part] if a.part else ["rl", "sft"]
    return [
        (side, part, layers, length, dtype, ckpt)
        for part in parts
        for length in ints(a.lengths if part == "rl" else a.sft_lengths)
        for dtype in a.dtypes.split(",")
        for ckpt in a.checkpointing.split(",")
        for layers in depths(a)
        for _ in range(a.rounds)
        for side in sides
    ]


def record(a, row: dict) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if a.json_out:
        with open(a.json_out, "a") as f:
            f.write(line + "\n")


def sweep(a, sides: list[str], root: Path, env: dict) -> list[dict]:
    dirs = {}
    for layers in depths(a):
        tag = f"qwen-L{layers}-h{a.hidden}-v{a.vocab}"
        (root / tag).mkdir(parents=True, exist_ok=True)
        sft_dir, rl_dir, params = save_models(a, layers, root / tag)
        dirs[layers] = {"sft": sft_dir, "rl": rl_dir}
        head = {"device": a.device, "layers": layers, "model": shape(a, layers), "params": params}
        print(json.dumps({**head, "load_before": os.getloadavg()}), flush=True)
    results = []
    for side, part, layers, length, dtype, ckpt in plan(a, sides):
        row = run_one(a, side, part, layers, length, dtype, ckpt, dirs[layers][part], env)
        results.append(row)
        record(a, row)
    return results


def main(argv=None) -> None:
    a = parse(argv)
    if a.child:  # one run of one side, in a process of its own (run_one)
        from benchmarks.scale_child import child

        return child(a)
    sides = [a.only] if a.only else list(SIDES)
    if "trl" in sides and not shutil.which(a.trl_python):
        sys.exit(f"--trl-python {a.trl_python} does not exist (make setup-trl, or --only rlhfkit)")
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        **({"OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)} if a.threads else {}),
    )
    if a.work_dir:
        results = sweep(a, sides, Path(a.work_dir), env)
    else:
        with tempfile.TemporaryDirectory(prefix="rlhfkit-scale-") as root:
            results = sweep(a, sides, Path(root), env)
    print(f"load after: {os.getloadavg()}", flush=True)
    print(summary(results), flush=True)
    layered = per_layer(results)
    if layered:
        print(json.dumps({"per_layer": layered}), flush=True)
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
