"""rlhfkit against TRL 1.16 at reasoning-length completions with a 150k vocabulary: GRPO and SFT,
peak memory, step time and memory per 1k tokens above the floor, each run its own process.

    # CPU: Qwen2.5-0.5B's widths, 2 layers; TRL in its own venv (make setup-trl)
    .venv/bin/python benchmarks/scale.py --trl-python .venv-trl/bin/python --rounds 2 --json-out scale.jsonl
    # one CUDA GPU: full depth (24 layers); the TRL side needs trl 1.16 and datasets in that python
    python benchmarks/scale.py --device cuda --trl-python <python with trl 1.16>
    # smoke (seconds): one side, a tiny model
    .venv/bin/python benchmarks/scale.py --only rlhfkit --lengths 8 --sft-lengths 32 --dtypes float32 \\
        --hidden 64 --vocab 512 --layers 1 --warmup 0 --steps 1 --rounds 1

**Model.** A randomly initialised ``Qwen2ForCausalLM`` built from a config (``benchmarks/models.py``):
by default Qwen2.5-0.5B's widths (hidden 896, 14 / 2 heads of 64, MLP 4864, vocabulary 151,936,
tied embeddings), ``--layers`` 2 on the CPU, 24 with ``--device cuda``; saved once (float32) to a
temporary directory with the local character-level tokenizer; both sides load that directory.

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
``--checkpointing default,on,off``: each side's default, or both sides with it on / off.
``--rlhfkit-set key=value`` passes more fields to rlhfkit's config (e.g. ``lm_head=full``).

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
A summary table follows: per part, L, dtype and checkpointing the medians and the ratios rlhfkit / TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # rlhfkit and benchmarks/ from this checkout

SIDES = ("trl", "rlhfkit")
NEVER = "<|never|>"  # the RL tokenizer's EOS: id V, one past the model's logits


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"), help="an interpreter with trl")
    p.add_argument("--only", choices=SIDES, help="run one side only")
    p.add_argument("--part", choices=["rl", "sft"], help="run one part only (default: both)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each side per configuration, alternated")
    p.add_argument("--layers", type=int, default=None, help="default: 2 on the CPU, 24 (Qwen2.5-0.5B) on CUDA")
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
    p.add_argument("--checkpointing", default="default", help="comma-separated of default, on, off")
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
    p.add_argument("--work-dir", default=None, help="where the model directories are written (default: a temp dir)")
    # one measurement, in its own process (what the parent runs)
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    bad = set(a.checkpointing.split(",")) - {"default", "on", "off"} or set(a.dtypes.split(",")) - {"float32", "bf16"}
    if bad:
        p.error(f"unknown value(s) {sorted(bad)} in --checkpointing / --dtypes")
    return a


def ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x.strip()]


def shape(a) -> dict:
    from benchmarks.models import QWEN25_05B

    heads = max(1, a.hidden // 64)
    return dict(
        QWEN25_05B,
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 4864 // 896,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 7),
        vocab_size=a.vocab,
        num_hidden_layers=a.layers or (24 if a.device == "cuda" else 2),
    )


def save_models(a, root: Path) -> tuple[Path, Path, int]:
    """The SFT directory (plain tokenizer) and the RL one (the same weights, linked; EOS id V)."""
    import torch

    from benchmarks.models import build_model, qwen_like_tokenizer

    sft, rl = root / "sft", root / "rl"
    tok = qwen_like_tokenizer(a.vocab)
    model = build_model(shape(a), tok, torch.device("cpu"), torch.float32)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(sft)
    tok.save_pretrained(sft)
    tok.add_special_tokens({"eos_token": NEVER})  # id V: the model's logits stop at V - 1
    assert tok.eos_token_id == a.vocab, tok.eos_token_id
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    rl.mkdir()
    model.config.save_pretrained(rl)
    model.generation_config.save_pretrained(rl)
    tok.save_pretrained(rl)
    for f in sft.glob("model*.safetensors*"):
        (rl / f.name).symlink_to(f)
    return sft, rl, params


# ---------------------------------------------------------------- one measurement (a child process)
def run_one(a, side: str, part: str, length: int, dtype: str, ckpt: str, model_dir: Path, env: dict) -> dict:
    python = a.trl_python if side == "trl" else sys.executable
    cmd = [
        python,
        __file__,
        "--child",
        side,
        "--part",
        part,
        "--length",
        str(length),
        "--dtype",
        dtype,
        "--checkpointing",
        ckpt,
        "--model-dir",
        str(model_dir),
        "--device",
        a.device,
        "--prompts",
        str(a.prompts),
        "--group-size",
        str(a.group_size),
        "--prompt-length",
        str(a.prompt_length),
        "--sft-rows",
        str(a.sft_rows),
        "--warmup",
        str(a.warmup),
        "--steps",
        str(a.steps),
        *[f"--rlhfkit-set={s}" for s in a.rlhfkit_set],
    ]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
        lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
        row = json.loads(lines[-1]) if out.returncode == 0 and lines else {"error": out.stderr[-2000:]}
    except subprocess.TimeoutExpired:
        row = {"error": f"timed out after {a.timeout:g} s"}
    base = {"part": part, "side": side, "length": length, "dtype": dtype, "checkpointing": ckpt}
    return {**base, **row, "wall_s": round(time.perf_counter() - start, 1), "load1": os.getloadavg()[0]}


def summary(results: list[dict]) -> str:
    ok = [r for r in results if "error" not in r]
    keys = list(dict.fromkeys((r["part"], r["length"], r["dtype"], r["checkpointing"]) for r in ok))  # run order
    lines = [
        "| part | L | dtype | checkpointing | side | peak GB | step s | above floor GB | MB / 1k tokens | floor GB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = [
        "| part | L | dtype | checkpointing | peak rlhfkit/TRL | step time rlhfkit/TRL | above floor rlhfkit/TRL |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in keys:
        med = {}
        for side in SIDES:
            runs = [r for r in ok if (r["part"], r["length"], r["dtype"], r["checkpointing"], r["side"]) == (*k, side)]
            if not runs:
                continue
            med[side] = {
                m: statistics.median(r[m] for r in runs)
                for m in ("peak_gb", "step_s", "above_floor_gb", "mb_per_1k_tokens", "floor_gb")
            }
            ck = "/".join(sorted({"on" if r["gradient_checkpointing"] else "off" for r in runs}))
            lines.append(
                f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} ({ck}) | {side} | {med[side]['peak_gb']:.2f} | "
                f"{med[side]['step_s']:.2f} | {med[side]['above_floor_gb']:.2f} | "
                f"{med[side]['mb_per_1k_tokens']:.0f} | {med[side]['floor_gb']:.2f} |"
            )
        if len(med) == 2:
            r = {
                m: med["rlhfkit"][m] / med["trl"][m] if med["trl"][m] else float("nan")
                for m in ("peak_gb", "step_s", "above_floor_gb")
            }
            ratios.append(
                f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {r['peak_gb']:.2f}x | {r['step_s']:.2f}x | "
                f"{r['above_floor_gb']:.2f}x |"
            )
    failed = [
        f"- FAILED {r['side']} {r['part']} L={r['length']} {r['dtype']} {r['checkpointing']}: "
        f"{r['error'].strip().splitlines()[-1] if r['error'].strip() else '?'}"
        for r in results
        if "error" in r
    ]
    return "\n".join(["", *lines, "", *(ratios if len(ratios) > 2 else []), *failed])


def main(argv=None) -> None:
    a = parse(argv)
    if a.child:  # one run of one side, in a process of its own (run_one)
        from benchmarks.scale_child import child

        return child(a)
    sides = [a.only] if a.only else list(SIDES)
    if "trl" in sides and not Path(a.trl_python).exists():
        sys.exit(f"--trl-python {a.trl_python} does not exist (make setup-trl, or --only rlhfkit)")
    parts = [a.part] if a.part else ["rl", "sft"]
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        **({"OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)} if a.threads else {}),
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="rlhfkit-scale-", dir=a.work_dir) as root:
        sft_dir, rl_dir, params = save_models(a, Path(root))
        head = {"device": a.device, "model": shape(a), "params": params, "load_before": os.getloadavg()}
        print(json.dumps(head), flush=True)
        for part in parts:
            for length in ints(a.lengths if part == "rl" else a.sft_lengths):
                for dtype in a.dtypes.split(","):
                    for ckpt in a.checkpointing.split(","):
                        for _ in range(a.rounds):
                            for side in sides:
                                row = run_one(
                                    a, side, part, length, dtype, ckpt, rl_dir if part == "rl" else sft_dir, env
                                )
                                results.append(row)
                                line = json.dumps(row)
                                print(line, flush=True)
                                if a.json_out:
                                    with open(a.json_out, "a") as f:
                                        f.write(line + "\n")
    print(f"load after: {os.getloadavg()}", flush=True)
    print(summary(results), flush=True)
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
