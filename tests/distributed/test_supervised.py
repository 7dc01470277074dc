"""SFT and reward-model training on several CPU processes (gloo, torchrun, loopback rendezvous)
train what one process trains: the same weights after the same steps (FSDP2 and DDP), the same
global metrics on every process, the same run directory and ``final/``; a batch that does not
split evenly over the processes is refused in one line before anything loads."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlhfkit.models import ScalarModel
from rlhfkit.trainers.reward_model import RewardModelConfig, RewardModelTrainer
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

WORKER = Path(__file__).with_name("supervised_worker.py")
WORDS = ["cat", "dog", "sun", "pen", "box", "cup", "hat", "map", "owl", "fig", "jam", "kit", "log", "nut", "rug", "van"]
# Completions of 1 to 8 characters: the processes hold different token counts (26 and 25, then
# 23 and 14, with seed 0), so the global token mean differs from the mean of per-process means.
SFT_ROWS = [{"prompt": f"{w}=", "completion": (w[::-1] * 3)[: 1 + i // 2]} for i, w in enumerate(WORDS)]
SFT_EVAL = [{"prompt": f"{w}?", "completion": w * (1 + i % 2)} for i, w in enumerate(WORDS[:5])]
# 9 pairs, batch 8: the second step's single pair leaves one process without pairs (a stand-in).
RM_ROWS = [
    {"prompt": f"{w}:", "chosen": w * (1 + i % 3), "rejected": w[::-1][: 1 + i % 3], "margin": 0.5 * (i % 2)}
    for i, w in enumerate(WORDS[:9])
]
# 9 eval pairs, 4 per pass: the processes hold 4 and 5, so the first pads its second pass.
RM_EVAL = [{"prompt": f"{w}:", "chosen": w, "rejected": w[::-1]} for w in WORDS[7:16]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, jobs: list[tuple[dict, Path]]) -> None:
    """``supervised_worker.py`` on every (spec, out) of ``jobs``, in turn, in one launch of ``nproc``
    processes (plain python for 1; a launch costs seconds of imports per process, a tiny run less)."""
    for _, out in jobs:
        out.mkdir(parents=True)
    jobs_file = jobs[0][1].parent / f"jobs-{nproc}.json"
    jobs_file.write_text(json.dumps([[spec, str(out)] for spec, out in jobs]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_DIST_TIMEOUT": "120"}
    launcher = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
        ]
        if nproc > 1
        else [sys.executable]
    )
    done = subprocess.run(
        launcher + [str(WORKER), str(jobs_file)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]


def history(out: Path, nproc: int) -> list[dict]:
    """Rank 0's metrics of the run written to ``out``, after checking that every process logged the
    same global ones."""
    histories = [json.loads((out / f"history-{r}.json").read_text()) for r in range(nproc)]
    assert all(h == histories[0] for h in histories)  # global metrics, on every process
    return histories[0]


def assert_same_weights(one: dict, two: dict) -> None:
    assert set(one) == set(two)
    for name in one:  # equal to 1e-5 relative, in norm per tensor
        assert (two[name] - one[name]).norm() <= 1e-5 * one[name].norm(), name


def assert_same_metrics(one: list[dict], two: list[dict]) -> None:
    """Equal to 1e-4 relative: a later step's metrics come from weights equal to ~1e-5."""
    assert [r["step"] for r in one] == [r["step"] for r in two] and set(one[0]) == set(two[0])
    for a, b in zip(one, two):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["step"], key)


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def sft_spec(model: str, run_dir: Path, parallelism: str) -> dict:
    # 8 rows per step over 2 micro-batches: each process takes 4, in 2 micro-batches of 2 (DDP
    # synchronises the last only); the eval set of 5 splits 2 / 3 (the short process pads a pass).
    # lr 1e-3: AdamW's normalised step turns the relative rounding error of a nearly cancelling
    # gradient element into an error of ~lr times it (one process with 2 micro-batches vs 1
    # already differs by 5e-5 relative at lr 1e-2, by 2e-6 at 1e-3).
    args = dict(
        learning_rate=1e-3,
        batch_size=4,
        grad_accumulation=2,
        max_steps=2,
        log_every=0,
        seed=0,
        lr_scheduler="constant",
        parallelism=parallelism,
        max_length=64,
    )
    return dict(trainer="sft", model=model, args=args, train=SFT_ROWS, eval=SFT_EVAL)


def rm_spec(model: str, run_dir: Path, parallelism: str) -> dict:
    # lr 3e-4: an element whose gradient nearly cancels (4e-7 against a median of 1e-2) carries a
    # relative rounding error of ~1e-2, which AdamW's normalised step turns into ~lr x 1e-2.
    # 8 pairs a step in 2 micro-batches of 4 (2 per process); the second step's single pair: one
    # micro-batch, a stand-in on the other process.
    args = dict(
        learning_rate=3e-4,
        batch_size=4,
        grad_accumulation=2,
        max_steps=2,
        log_every=0,
        seed=0,
        parallelism=parallelism,
        max_length=64,
        output_dir=str(run_dir),
    )
    return dict(trainer="rm", model=model, args=args, train=RM_ROWS, eval=RM_EVAL)


def dpo_spec(model: str, run_dir: Path, lora: bool, reference: str = "synced") -> dict:
    # 9 pairs, batch 8: the second step leaves one process a single pair and the other none (a
    # stand-in of weight 0). full: the reference (a frozen copy) is sharded too, and synced toward
    # the policy after step 1 (TR-DPO: the sharded weights mixed shard by shard), or precomputed by
    # the policy itself before its first update. lora: the reference is the adapter-disabled base,
    # precomputed by slices; final/ is merged from rank 0's copy.
    args = dict(
        learning_rate=1e-3,
        batch_size=8,
        max_steps=2,
        log_every=0,
        seed=0,
        max_length=64,
        beta=0.5,
        precompute_ref_logprobs=lora or reference == "precomputed",
        sync_ref_model=not lora and reference == "synced",
        ref_model_sync_steps=1,
        output_dir=str(run_dir),
    )
    spec = dict(trainer="dpo", model=model, args=args, train=RM_ROWS, eval=RM_EVAL)
    if lora:
        spec["lora"] = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return spec


# KTO's unpaired rows: each pair's chosen completion desirable, its rejected one not (18 rows, 9 eval rows).
KTO_ROWS = [
    {"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"} for r in RM_ROWS for k in ("chosen", "rejected")
]
KTO_EVAL = [{"prompt": r["prompt"], "completion": r["chosen"], "label": i % 2 == 0} for i, r in enumerate(RM_EVAL)]


def kto_spec(model: str, run_dir: Path, precomputed: bool) -> dict:
    # the reference scored as it goes, or once before the first step (precompute_ref_logprobs): the table holds
    # every process's items, training's and evaluation's, so both runs train and evaluate alike
    args = dict(
        learning_rate=1e-3,
        batch_size=8,
        max_steps=2,
        log_every=0,
        seed=0,
        max_length=64,
        eval_every=1,
        precompute_ref_logprobs=precomputed,
        output_dir=str(run_dir),
    )
    return dict(trainer="kto", model=model, args=args, train=KTO_ROWS, eval=KTO_EVAL)


def run_directory_spec(model: str, run_dir: Path) -> dict:
    args = dict(
        learning_rate=1e-3, batch_size=4, max_steps=3, log_every=0, seed=0, max_length=64, output_dir=str(run_dir)
    )
    return dict(trainer="sft", model=model, args=args, train=SFT_ROWS, eval=SFT_EVAL)


def float16_spec(model: str, run_dir: Path, parallelism: str) -> dict:
    """SFT of the model loaded in float16: float32 masters trained (models/master_weights.py), final/ in float16."""
    spec = sft_spec(model, run_dir, parallelism)
    spec["args"].update(dtype="float16", output_dir=str(run_dir))
    return spec


SPECS = {
    "sft-fsdp": lambda m, d: sft_spec(m, d, "fsdp"),
    "sft-ddp": lambda m, d: sft_spec(m, d, "ddp"),
    "sft-float16-fsdp": lambda m, d: float16_spec(m, d, "fsdp"),
    "sft-float16-ddp": lambda m, d: float16_spec(m, d, "ddp"),
    "rm-fsdp": lambda m, d: rm_spec(m, d, "fsdp"),
    "rm-ddp": lambda m, d: rm_spec(m, d, "ddp"),
    "dpo-full": lambda m, d: dpo_spec(m, d, False),
    "dpo-full-precomputed": lambda m, d: dpo_spec(m, d, False, "precomputed"),
    "dpo-lora-precomputed": lambda m, d: dpo_spec(m, d, True),
    "kto-live": lambda m, d: kto_spec(m, d, False),
    "kto-precomputed": lambda m, d: kto_spec(m, d, True),
    "run-directory": run_directory_spec,
}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> Path:
    """Every equivalence run of this file on one process and on two: one launch each, the worker
    training the specs in turn (<root>/<spec>/one and .../two, run directories .../run). With the
    launches shared, every parallelism and variant is in the default suite."""
    root = tmp_path_factory.mktemp("supervised")
    for nproc, label in ((1, "one"), (2, "two")):
        launch(
            nproc,
            [(spec(tiny_model_dir, root / name / label / "run"), root / name / label) for name, spec in SPECS.items()],
        )
    return root


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_sft_steps_are_the_same_on_one_and_two_processes(runs, tiny_model_dir, parallelism):
    out = runs / f"sft-{parallelism}"
    one, two = history(out / "one", 1), history(out / "two", 2)
    assert_same_metrics(one, two)
    assert "eval/loss" in one[-1]
    w1, w2 = load_file(out / "one" / "weights.safetensors"), load_file(out / "two" / "weights.safetensors")
    untrained = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(w1[k], v) for k, v in untrained.items())  # the steps moved them
    assert_same_weights(w1, w2)


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_a_float16_model_trains_float32_masters_and_saves_float16_on_two_processes(runs, parallelism):
    out = runs / f"sft-float16-{parallelism}"
    finals = [load_file(out / label / "run" / "final" / "model.safetensors") for label in ("one", "two")]
    assert all({w.dtype for w in final.values()} == {torch.float16} for final in finals)
    for name, one in finals[0].items():  # the same float32 masters, each rounded to float16 once
        two = finals[1][name].float()
        assert (two - one.float()).norm() <= 1e-3 * one.float().norm(), name


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_reward_model_steps_and_final_are_the_same_on_one_and_two_processes(runs, tiny_model_dir, parallelism):
    out = runs / f"rm-{parallelism}"
    histories = {"one": history(out / "one", 1), "two": history(out / "two", 2)}
    assert_same_metrics(histories["one"], histories["two"])
    assert {"rm/loss", "rm/accuracy", "rm/reward_std", "eval/loss", "eval/accuracy", "rm/offset"} <= set(
        histories["one"][-1]
    )
    w1, w2 = (load_file(out / name / "weights.safetensors") for name in ("one", "two"))
    assert_same_weights(w1, w2)
    untrained = ScalarModel.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(w1["model." + k], v) for k, v in untrained.items() if "head" not in k)  # moved
    # final/: written by rank 0 from the gathered weights, equal to the one-process model
    final = {name: ScalarModel.from_pretrained(out / name / "run" / "final") for name in ("one", "two")}
    assert float(final["two"].offset) == pytest.approx(float(final["one"].offset), rel=1e-5, abs=1e-6)
    assert float(final["one"].offset) == pytest.approx(histories["one"][-1]["rm/offset"], rel=1e-6)
    assert_same_weights(final["one"].state_dict(), final["two"].state_dict())
    assert_same_weights({k.removeprefix("model."): v for k, v in w2.items()}, final["two"].state_dict())
    assert files(out / "one" / "run") == files(out / "two" / "run")


@pytest.mark.parametrize("variant", ["full", "full-precomputed", "lora-precomputed"])
def test_dpo_steps_and_final_are_the_same_on_one_and_two_processes(runs, variant):
    out = runs / f"dpo-{variant}"
    assert_same_metrics(history(out / "one", 1), history(out / "two", 2))
    assert {"dpo/loss", "rewards/accuracies", "rewards/margins", "eval/loss", "eval/rewards/chosen"} <= set(
        history(out / "one", 1)[-1]
    )
    w1, w2 = (load_file(out / name / "weights.safetensors") for name in ("one", "two"))
    assert_same_weights(w1, w2)
    final = [AutoModelForCausalLM.from_pretrained(out / name / "run" / "final") for name in ("one", "two")]
    assert_same_weights(final[0].state_dict(), final[1].state_dict())


def test_kto_s_precomputed_reference_is_the_live_one_on_two_processes(runs):
    # each process scores its slice of one table of every process's items: with an evaluation split unevenly over
    # the processes, a table of this process's own items would pair the wrong rows (or differ in length)
    for label, nproc in (("one", 1), ("two", 2)):
        live, precomputed = (history(runs / f"kto-{kind}" / label, nproc) for kind in ("live", "precomputed"))
        assert "eval/loss" in live[-1] and "eval/kl" in live[-1]
        assert_same_metrics(live, precomputed)


def test_a_two_process_sft_run_writes_the_run_directory_of_one_process(runs):
    out = runs / "run-directory"
    one, two = out / "one" / "run", out / "two" / "run"
    assert files(one) == files(two) and {"config.yaml", "metrics.jsonl", "plots", "final", "data"} <= set(files(two))
    logged = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3]  # rank 0 alone writes
    assert_same_metrics(history(out / "one", 1), logged)
    models = [AutoModelForCausalLM.from_pretrained(run_dir / "final") for run_dir in (one, two)]
    assert_same_weights(models[0].state_dict(), models[1].state_dict())


@pytest.mark.parametrize("trainer", ["sft", "rm"])
def test_a_batch_that_does_not_split_over_the_processes_is_refused_in_one_line(tmp_path, monkeypatch, trainer):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it, before the process group exists
    out = tmp_path / "run"
    if trainer == "sft":
        with pytest.raises(ValueError) as err:
            SFTTrainer("/no/such/model", SFTConfig(batch_size=3, grad_accumulation=1, output_dir=str(out)), SFT_ROWS)
        assert str(err.value).startswith(
            "batch_size x grad_accumulation = 3 must be divisible by the number of processes (2)"
        )
    else:
        with pytest.raises(ValueError) as err:
            RewardModelTrainer("/no/such/model", RewardModelConfig(batch_size=5, output_dir=str(out)), RM_ROWS)
        assert str(err.value).startswith("batch_size=5 must be divisible by the number of processes (2)")
    assert "\n" not in str(err.value) and not out.exists()  # before any data, directory or model


def checkpoint_args(trainer: str) -> tuple[list[dict], dict]:
    rows, extra = (SFT_ROWS, {}) if trainer == "sft" else (RM_ROWS, {"beta": 0.5})
    return rows, dict(
        learning_rate=1e-3,
        batch_size=4,
        max_steps=4,
        log_every=0,
        seed=0,
        max_length=64,
        save_steps=2,
        lr_scheduler="constant",
        **extra,
    )


@pytest.fixture(scope="module")
def resumed_runs(tiny_model_dir, tmp_path_factory) -> Path:
    """For SFT and DPO (<root>/<trainer>): a 2-process run of 4 steps that checkpoints at 2 (two/),
    then that checkpoint resumed on 1 process (one/); one launch each for both trainers."""
    root, jobs = tmp_path_factory.mktemp("resumed"), {2: [], 1: []}
    for trainer in ("sft", "dpo"):
        rows, args = checkpoint_args(trainer)
        two, one = root / trainer / "two", root / trainer / "one"
        jobs[2].append(
            (
                dict(trainer=trainer, model=tiny_model_dir, args={**args, "output_dir": str(two / "run")}, train=rows),
                two,
            )
        )
        resume = {**args, "output_dir": str(one / "run"), "resume_from": str(two / "run" / "checkpoint-2")}
        jobs[1].append((dict(trainer=trainer, model=tiny_model_dir, args=resume, train=rows), one))
    launch(2, jobs[2])
    launch(1, jobs[1])
    return root


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["sft", "dpo"])
def test_a_two_process_checkpoint_resumes_on_one_process_to_the_same_weights(resumed_runs, trainer):
    """Saved by 2 processes (FSDP2 shards), resumed by 1: the weights of the uninterrupted 2-process run."""
    out = resumed_runs / trainer
    history(out / "two", 2)
    resumed = history(out / "one", 1)
    assert [r["step"] for r in resumed] == [3, 4]
    assert_same_weights(load_file(out / "two" / "weights.safetensors"), load_file(out / "one" / "weights.safetensors"))
