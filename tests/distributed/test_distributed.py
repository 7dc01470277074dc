"""Several processes on the CPU (gloo, torchrun, loopback rendezvous) compute what one process
computes: one RL update of a fixed batch gives the same weights on 1 and 2 processes (FSDP2 and
DDP), and a 2-process DDP run learns the toy task with identical weights on every process."""

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.tasks.toy import toy_trainer

WORKER = Path(__file__).with_name("worker.py")
ROLLOUT = ("input_ids", "attention_mask", "response_mask", "has_eos", "prompt_index")
pytestmark = pytest.mark.usefixtures("one_thread")  # this process builds toy trainers too (tests/conftest.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nproc: int, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    """``worker.py args`` under torchrun with ``nproc`` processes (plain python for 1)."""
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
    out = subprocess.run(
        launcher + [str(WORKER), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out


def _experience(path: Path, config) -> dict:
    """One batch of experience from the toy trainer, saved as plain tensors to ``path``; returns the
    trainer's policy weights before any update. ``engine_noise`` in the config: the engine's own
    log-probs are the policy's plus that much noise (an engine that is not the trained model, whose
    rollout correction the experience carries, or the loss computes in its one on-policy pass)."""
    trainer = toy_trainer(**{k: v for k, v in config.items() if k not in ("checkpoint_above_tokens", "engine_noise")})
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], trainer.args.group_size, trainer.sampler.sampling
    )
    if config.get("engine_noise"):
        with torch.no_grad():
            own = trainer.models.policy_outputs(rollout, with_values=False)[0]
        noise = torch.randn(own.shape, generator=torch.Generator().manual_seed(5))
        rollout.logprobs = own + config["engine_noise"] * noise
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    exp = trainer.make_experience(rollout, scores, valid, metrics)
    data = {k: getattr(exp.rollout, k) for k in ROLLOUT}
    data["prompt_len"] = torch.tensor(exp.rollout.prompt_len)
    data["correct_in_loss"] = torch.tensor(exp.correct_in_loss)
    if exp.rollout.logprobs is not None:
        data["logprobs"] = exp.rollout.logprobs
    for k in ("mask", "old_logprobs", "ref_logprobs", "old_values", "advantages", "returns", "is_weights"):
        if getattr(exp, k) is not None:
            data[k] = getattr(exp, k)
    torch.save(data, path)
    return {k: v.detach().clone() for k, v in trainer.models.policy.state_dict().items()}


CASES = {
    "grpo-minibatches-micro": dict(
        algorithm="grpo", prompts_per_step=4, mini_batch_size=8, micro_batch_size=3, num_iterations=2, kl_coef=0.05
    ),
    "grpo-token-mean": dict(algorithm="grpo", prompts_per_step=4, loss_agg="token-mean", micro_batch_size=2),
    "ppo-separate-critic": dict(
        algorithm="ppo", prompts_per_step=8, mini_batch_size=4, micro_batch_size=2, num_iterations=1
    ),
    # issue 21's presets: the sequence ratio (its second pass off-policy), the capped ratio, DAPO's
    # token-mean with truncated completions out of the loss
    "gspo-minibatches-micro": dict(
        algorithm="gspo", prompts_per_step=4, mini_batch_size=8, micro_batch_size=3, num_iterations=2
    ),
    "cispo-minibatches": dict(algorithm="cispo", prompts_per_step=4, mini_batch_size=8, micro_batch_size=2),
    "dapo-mask-truncated": dict(
        algorithm="dapo", prompts_per_step=4, micro_batch_size=3, overlong_buffer_len=4, mask_truncated_completions=True
    ),
    # TRL's rules (the drop-in's): the micro-batch entropy term with processes holding unequal numbers of
    # micro-batches (one global shuffle), and truncated rows masked but counted in a seq-mean denominator
    "grpo-trl-entropy-masked-rows": dict(
        algorithm="grpo",
        prompts_per_step=4,
        mini_batch_size=8,
        micro_batch_size=2,
        entropy_coef=0.5,
        entropy_agg="micro-batch-token-mean",
        mask_truncated_completions=True,
        masked_rows_count=True,
    ),
    # micro-batches by tokens (issue 43): processes whose rows split into different numbers of micro-batches
    "grpo-token-budget": dict(
        algorithm="grpo", prompts_per_step=4, loss_agg="token-mean", max_tokens_per_micro_batch=60
    ),
    # activation checkpointing (issue 50): every pass recomputed under FSDP2's and DDP's backward; and 'auto'
    # with the free memory of a 52-token pass (worker.py): processes whose micro-batches differ agree on each
    # pass (on transformers < 5.24 a recompute inside FSDP2's hooks gathers the parameters: a collective)
    "ppo-checkpointing-on": dict(
        algorithm="ppo", prompts_per_step=8, mini_batch_size=4, micro_batch_size=2, gradient_checkpointing="on"
    ),
    # on-policy distillation's full divergence (issue 52): the teacher sharded as the reference, its hidden states
    # per micro-batch, the policy's output layer gathered differentiably (FSDP2), uneven micro-batches per process
    "distill-full-micro": dict(
        algorithm="distill", distillation_mode="full", distillation_beta=0.5, prompts_per_step=8, micro_batch_size=3
    ),
    # every kind of metric the update logs (issue 53): the rollout correction computed in the one on-policy pass of
    # the loss (an engine's own log-probs, a mask mode that zeroes weights), β·KL in the loss, the off-policy
    # sequence mask, the adaptive entropy bonus, the dual clip; and VESPO's per-row weight with the correction
    # made before the update (two minibatches), on uneven micro-batches
    "grpo-correction-in-loss": dict(
        algorithm="grpo",
        prompts_per_step=4,
        micro_batch_size=3,
        kl_coef=0.05,
        rollout_is="token_mask",
        rollout_is_threshold=1.2,
        rollout_is_zero_masked=True,
        off_policy_mask_threshold=0.02,
        use_adaptive_entropy=True,
        dual_clip=2.0,
        engine_noise=0.2,
    ),
    "vespo-corrected-minibatches": dict(
        algorithm="grpo",
        policy_loss="vespo",
        prompts_per_step=4,
        mini_batch_size=8,
        micro_batch_size=3,
        engine_noise=0.1,
    ),
    "grpo-checkpointing-auto": dict(
        algorithm="grpo",
        prompts_per_step=4,
        loss_agg="token-mean",
        max_tokens_per_micro_batch=60,
        gradient_checkpointing="auto",
        checkpoint_above_tokens=52,
    ),
}


# AdamW's step g/(sqrt(v) + eps) turns the float rounding of a near-zero gradient component into a
# weight difference of up to ~lr·rounding/eps: at eps=1e-8 one element of a tensor can differ by ~4e-5
# (measured for GSPO's narrow clip: one of 8192, 1.5e-5 relative in norm), and which case crosses the
# 1e-5 bound moves with the machine and the installed packages (GRPO minibatches+micro under FSDP2 on
# one install, GRPO token-mean under DDP on the CI machine: 2.4e-5 relative in norm, measured). So every
# case compares at eps=1e-5, as tests/trainers/test_rl_options.py does: a wrong reduction across
# processes still moves whole tensors by far more.
COMPARABLE_ADAM_EPS = 1e-5

PARALLELISMS = ("fsdp", "ddp")


@pytest.fixture(scope="module")
def one_updates(tmp_path_factory):
    """Every case under both parallelisms, updated on one process and on two: one launch each, the
    worker taking the cases in turn (a launch costs seconds of imports per process, an update of the
    toy model a fraction of one). Returns {(case, parallelism): (config, untrained policy, out dir)}."""
    root = tmp_path_factory.mktemp("one-update")
    runs, cases = {}, {1: [], 2: []}
    for case in CASES:
        # made in this (unlaunched) process, where the parallelism wraps nothing: one batch per case
        experience = root / f"{case}.pt"
        untrained = _experience(experience, CASES[case])
        for parallelism in PARALLELISMS:
            config, out = dict(CASES[case], parallelism=parallelism), root / f"{case}-{parallelism}"
            out.mkdir()
            (out / "config.json").write_text(json.dumps({**config, "adam_eps": COMPARABLE_ADAM_EPS}))
            runs[case, parallelism] = config, untrained, out
            for n, name in ((1, "one"), (2, "two")):
                cases[n].append([str(experience), str(out / "config.json"), str(out / f"{name}.safetensors")])
    for nproc in (1, 2):
        (root / f"cases-{nproc}.json").write_text(json.dumps(cases[nproc]))
        runs["stderr", nproc] = run(nproc, "update", root / f"cases-{nproc}.json").stderr
    return runs


# Every case, both parallelisms, in the default suite: the two launches of the fixture serve them all.
@pytest.mark.parametrize("parallelism", PARALLELISMS)
@pytest.mark.parametrize("case", CASES)
def test_one_update_of_a_fixed_batch_is_the_same_on_one_and_two_processes(one_updates, case, parallelism):
    config, untrained, out = one_updates[case, parallelism]
    one, two = load_file(out / "one.safetensors"), load_file(out / "two.safetensors")
    assert any(not torch.equal(one[f"policy.{k}"], v) for k, v in untrained.items())  # the update moved them
    assert set(one) == set(two) and any(k.startswith("critic.") for k in one) == config["algorithm"].startswith("ppo")
    for name in one:  # equal to 1e-5 relative, in norm per tensor (AdamW's first steps amplify float
        # rounding of near-zero gradients element by element: up to ~2e-6 absolute was measured)
        assert (two[name] - one[name]).norm() <= 1e-5 * one[name].norm(), name


@pytest.mark.parametrize("parallelism", PARALLELISMS)
@pytest.mark.parametrize("case", CASES)
def test_every_metric_of_the_update_is_the_same_on_one_and_two_processes(one_updates, case, parallelism):
    """The metrics that update logged (worker.py writes them beside the weights) are the batch's own on
    any number of processes: their statistics are reduced over the processes by kind (algorithms/metrics.py)."""
    out = one_updates[case, parallelism][2]
    one, two = (json.loads((out / f"{name}.json").read_text()) for name in ("one", "two"))
    assert one.keys() == two.keys() and "policy/loss" in one
    for name, value in one.items():
        assert two[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


def test_the_cases_log_every_kind_of_metric(one_updates):
    """The rollout correction in the loss, the critic's explained variance, VESPO's per-row weight: logged,
    and measuring something."""
    logged = lambda case: json.loads((one_updates[case, "ddp"][2] / "one.json").read_text())  # noqa: E731
    correction = logged("grpo-correction-in-loss")
    assert correction["rollout/is_weight_std"] > 0.01 and 0 < correction["rollout/is_masked_frac"] < 1
    assert {"policy/kept_token_frac", "policy/entropy_coef", "kl/k1", "policy/clip_frac_dual"} <= correction.keys()
    assert logged("ppo-separate-critic")["critic/explained_variance"] != 0
    assert logged("vespo-corrected-minibatches")["policy/vespo_phi_mean"] > 0


def test_auto_checkpointing_mixes_passes_and_two_processes_agree_on_each(one_updates):
    """The 'auto' case did mix (worker.py prints each process's checkpointed share per parallelism), and
    the two processes checkpointed the same passes although their micro-batches differ (without the
    agreement their shares differ: measured), so the equivalence above covers agreed passes."""
    shares: dict = {}  # (nproc, rank) -> the share of each case in turn
    for nproc in (1, 2):
        for rank, share in re.findall(r"checkpointed_frac\[(\d+)\]=([0-9.]+)\n", one_updates["stderr", nproc]):
            shares.setdefault((nproc, int(rank)), []).append(float(share))
    assert set(shares) == {(1, 0), (2, 0), (2, 1)} and all(len(v) == len(PARALLELISMS) for v in shares.values())
    assert all(0 < f < 1 for f in shares[1, 0] + shares[2, 0]), shares
    assert shares[2, 0] == shares[2, 1], shares


# The short 2-process runs of this file's tests: (command, config), each writing to <root>/<name>.
SHORT_RUNS = {
    "generate": ("generate", dict(algorithm="grpo", parallelism="fsdp")),
    "stop": ("train", dict(algorithm="grpo", prompts_per_step=4, max_steps=6, parallelism="ddp", stop=[1, 2])),
    "dynamic": (
        "train",
        dict(
            algorithm="dapo",
            prompts_per_step=4,
            max_steps=4,
            max_sampling_rounds=2,
            parallelism="ddp",
            mini_batch_size=4,
            reward="some_prompts_vary",
        ),
    ),
    **{
        f"lora-{p}": (
            "train",
            dict(algorithm="grpo", prompts_per_step=4, max_steps=3, kl_coef=0.1, lora_r=4, parallelism=p),
        )
        for p in PARALLELISMS
    },
}


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory) -> tuple[Path, str]:
    """Every SHORT_RUNS run in turn in ONE 2-process launch (a launch costs seconds of imports per
    process, these runs a few steps of the toy model; so the DDP LoRA run and the stopping callback
    are in the default suite too). Each run's files go to <root>/<name>, its run directory is
    <root>/<name>/run. Returns (root, the launch's stderr)."""
    root = tmp_path_factory.mktemp("short-runs")
    jobs = []
    for name, (command, config) in SHORT_RUNS.items():
        (root / name).mkdir()
        config = {**config, "output_dir": str(root / name / "run")} if command == "train" else config
        (root / name / "config.json").write_text(json.dumps(config))
        jobs.append([command, str(root / name / "config.json"), str(root / name)])
    (root / "jobs.json").write_text(json.dumps(jobs))
    return root, run(2, "jobs", root / "jobs.json", timeout=600).stderr


def test_sampling_from_a_gathered_fsdp_policy_is_no_collective(short_runs):
    # Agent episodes end a turn earlier on one process than on another: the HF engine's generate
    # must not wait on the other processes (transformers' synced_gpus, on by default for FSDP).
    out = short_runs[0] / "generate"
    calls = [json.loads((out / f"generated-{r}.json").read_text()) for r in range(2)]
    assert [len(c) for c in calls] == [1, 2]


@pytest.mark.slow  # the one-update equivalence tests cover every loss; this is the end-to-end run
def test_two_processes_learn_the_toy_task_with_identical_weights(tmp_path):
    """Under DDP every process holds its own copy of the weights: after 30 steps on different
    prompts and samples, each process's own copy (hashed before any gathering) is the same, and it
    is the model the run saved."""
    config = dict(
        algorithm="grpo", prompts_per_step=4, max_steps=30, parallelism="ddp", output_dir=str(tmp_path / "run")
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    run(2, "train", tmp_path / "config.json", tmp_path, timeout=600)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))
    start, end = (sum(r["reward/mean"] for r in part) / 5 for part in (rows[:5], rows[-5:]))
    assert end - start > 0.2, (start, end)
    rank0, rank1 = (json.loads((tmp_path / f"weights-{r}.json").read_text()) for r in (0, 1))
    assert rank0 and rank0.keys() == rank1.keys()
    assert [k for k in rank0 if rank0[k] != rank1[k]] == []
    saved = load_file(tmp_path / "run" / "final" / "model.safetensors")
    saved = {
        k: hashlib.sha256(v.contiguous().flatten().view(torch.uint8).numpy()).hexdigest() for k, v in saved.items()
    }
    assert sorted(saved.values()) == sorted(rank0.values())  # the copies are the trained, saved weights
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(
        [
            ".rlhfkit-run",
            "config.yaml",
            "data",
            "final",
            "metrics.jsonl",
            "plots",
            "run.json",
            "samples.jsonl",
            "trace.json",
        ]
    )


def test_a_callback_that_stops_one_process_stops_every_process(short_runs):
    """``control.should_training_stop`` set on rank 1 alone (worker.StopOnOneRank): both processes
    end after that step — no process waits for a collective the other never joins — and the run
    saves ``final/``."""
    out = short_runs[0] / "stop"
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    rank0, rank1 = (json.loads((out / f"weights-{r}.json").read_text()) for r in (0, 1))
    assert rank0 == rank1
    assert (out / "run" / "final" / "model.safetensors").is_file()


def test_dynamic_sampling_runs_the_same_rounds_on_two_processes(short_runs):
    """DAPO's dynamic sampling under DDP, with rewards that vary only for two of the eight prompts
    (worker.some_prompts_vary): the processes keep different numbers of groups, yet run the same
    rounds (the stopping test is on counts summed over them) and the same update (a process short
    of groups fills up with invalid ones: with minibatches of one group, unequal batches would give
    the processes different numbers of optimizer steps), so their copies of the weights stay
    identical. The rounds and kept fractions are those the data order implies."""
    from rlhfkit.run.training import epoch_order
    from rlhfkit.tasks.toy import PROMPTS

    out, stderr = short_runs[0] / "dynamic", short_runs[1]
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    # Each round gives each process the next 2 prompts of the order (process 0 the first two).
    order = [i for epoch in range(5) for i in epoch_order(0, epoch, len(PROMPTS))]
    varies = [PROMPTS[i]["prompt"] in ("xyz 12", "hello") for i in order]  # worker.VARYING
    expected, uneven, pos = [], 0, 0
    for _ in rows:
        kept, generated = [0, 0], 0
        for n in range(1, 3):  # noqa: B007 (n, the rounds it took, is read after the loop)
            kept = [kept[r] + sum(varies[pos + 2 * r : pos + 2 * r + 2]) for r in (0, 1)]
            pos, generated = pos + 4, generated + 4
            if sum(min(k, 2) for k in kept) >= 4:
                break
        expected.append((float(n), sum(kept) / generated))
        uneven += min(kept[0], 2) != min(kept[1], 2)
    assert [(r["rollout/sampling_rounds"], r["rollout/kept_groups_frac"]) for r in rows] == expected
    assert uneven  # a step where one process kept fewer groups than the other (filler rows)
    # once a step, rank 0 (no other run of the launch samples dynamically)
    assert stderr.count("dynamic sampling:") == sum(n == 2 for n, _ in expected)
    rank0, rank1 = (json.loads((out / f"weights-{r}.json").read_text()) for r in (0, 1))
    assert rank0 and [k for k in rank0 if rank0[k] != rank1[k]] == []


@pytest.mark.parametrize("parallelism", PARALLELISMS)
def test_a_lora_policy_trains_sharded_and_saves_a_merged_model(short_runs, parallelism):
    from transformers import AutoModelForCausalLM

    out = short_runs[0] / f"lora-{parallelism}"
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kl/k1"] == pytest.approx(0.0, abs=1e-5) and rows[-1]["kl/k3"] > 0  # the adapter moved
    merged = AutoModelForCausalLM.from_pretrained(out / "run" / "final")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

    base = dict(tiny_causal_lm(char_tokenizer(), seed=0).named_parameters())
    trained = dict(merged.named_parameters())
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(trained[name], base[name])  # the adapter is merged in
    assert torch.equal(trained["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])
