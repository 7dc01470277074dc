"""Final-weight fingerprints of a fixed set of short runs, to show that a change of structure
changes no number: SFT, reward model and DPO on the shift task, GRPO / PPO / RLOO / DAPO (dynamic
sampling) on the toy task (HF engine), 30 steps each, a 2-process GRPO run (gloo), a 2-process GRPO
run with one generator rank (``rollout_workers: 1, max_staleness: 1``), and the calculator agent
(a 40-step warm start, then 4 GRPO steps of tool episodes). Each line is ``<run> <sha256>`` of the
final weights (every tensor, sorted by name, as float32 bytes). Compare two revisions with

    python benchmarks/weight_hashes.py > before.txt   # on the old revision
    python benchmarks/weight_hashes.py > after.txt    # on the new one
    diff before.txt after.txt                         # empty: bit-identical (torch.equal)

``--only NAME`` runs one of them; ``--steps`` changes the 30.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

RUNS = ("sft", "rm", "dpo", "grpo", "ppo", "rloo", "dapo", "grpo-2proc", "grpo-async", "agent")


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def saved_digest(directory: Path) -> str:
    from safetensors.torch import load_file

    state = {}
    for file in sorted(directory.glob("*.safetensors")):
        state.update({f"{file.name}:{k}": v for k, v in load_file(file).items()})
    return digest(state)


def supervised(kind: str, root: Path, steps: int) -> str:
    from rlhfkit.tasks import shift
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
    from rlhfkit.trainers.dpo import DPOConfig, DPOTrainer
    from rlhfkit.trainers.reward_model import RewardModelConfig, RewardModelTrainer
    from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

    tok = char_tokenizer(alphabet=shift.LETTERS + "=")
    quiet = dict(log_every=0, progress_bar=False, seed=0)
    sft_dir = root / "sft"
    if not (sft_dir / "final").exists():
        SFTTrainer(
            tiny_causal_lm(tok, hidden_size=64, layers=2, seed=0),
            SFTConfig(learning_rate=3e-3, max_steps=steps, batch_size=16, output_dir=str(sft_dir), **quiet),
            train_dataset=shift.make_sft_rows(400, 0),
            processing_class=tok,
        ).train()
    if kind == "sft":
        return saved_digest(sft_dir / "final")
    pairs = shift.make_synthetic_pairs(400, 0)
    if kind == "rm":
        RewardModelTrainer(
            str(sft_dir / "final"),
            RewardModelConfig(learning_rate=1e-3, max_steps=steps, batch_size=16, output_dir=str(root / "rm"), **quiet),
            train_dataset=pairs,
        ).train()
        return saved_digest(root / "rm" / "final")
    DPOTrainer(
        str(sft_dir / "final"),
        DPOConfig(learning_rate=1e-3, max_steps=steps, batch_size=16, output_dir=str(root / "dpo"), **quiet),
        train_dataset=pairs,
    ).train()
    return saved_digest(root / "dpo" / "final")


def rl(algorithm: str, steps: int) -> str:
    from rlhfkit import distributed
    from rlhfkit.tasks.toy import toy_trainer

    trainer = toy_trainer(algorithm, max_steps=steps)
    trainer.train()
    state = {f"policy.{k}": v for k, v in distributed.full_state_dict(trainer.models.policy).items()}
    if trainer.models.critic_module is not None:
        state.update({f"critic.{k}": v for k, v in distributed.full_state_dict(trainer.models.critic_module).items()})
    return digest(state)


def agent(root: Path) -> str:
    from rlhfkit.tasks.calculator_demo import demo_files, train_agent, warm_start

    paths = demo_files(root / "calculator", n_train=64, n_eval=4)
    model_dir = warm_start(paths, root / "calculator-sft", max_steps=40, batch_size=8)
    train_agent(
        model_dir,
        paths,
        root / "agent",
        "environment",
        max_steps=4,
        eval_every=0,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=96,
        save_steps=0,
        learning_rate=1e-3,
        log_every=0,
    )
    return saved_digest(root / "agent" / "final")


def two_processes(root: Path, steps: int, name: str = "grpo-2proc") -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        __file__,
        "--worker",
        str(root / name),
        "--steps",
        str(steps),
    ]
    if name == "grpo-async":
        cmd.append("--async")
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return saved_digest(root / name / "final")


def worker(out_dir: str, steps: int, generator: bool) -> None:
    from rlhfkit.tasks.toy import toy_trainer

    extra = dict(rollout_workers=1, max_staleness=1) if generator else {}
    toy_trainer("grpo", max_steps=steps, output_dir=out_dir, **extra).train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=RUNS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--async", dest="generator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.generator)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in [args.only] if args.only else RUNS:
            if name in ("sft", "rm", "dpo"):
                value = supervised(name, root, args.steps)
            elif name in ("grpo-2proc", "grpo-async"):
                value = two_processes(root, args.steps, name)
            elif name == "agent":
                value = agent(root)
            else:
                value = rl(name, args.steps)
            print(f"{name:<11} {value}", flush=True)


if __name__ == "__main__":
    main()
