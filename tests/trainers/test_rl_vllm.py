"""The RL loop with ``rollout_engine="vllm"``: a real vLLM (CPU build) engine in each training
process. Run by ``make test-vllm``; deselected from ``make test``."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.tasks.toy import toy_trainer

pytestmark = pytest.mark.vllm

VLLM = dict(rollout_engine="vllm", vllm_kv_cache_gb=0.25)
HEADS = {"heads": 2}  # head size 32: vLLM's CPU attention needs >= 32
WORKER = Path(__file__).parents[1] / "distributed" / "vllm_worker.py"


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)


def _mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_the_loop_learns_the_toy_task_with_the_vllm_engine(algorithm):
    trainer = toy_trainer(algorithm, model_kwargs=HEADS, **VLLM)
    history = trainer.train()
    start, end = _mean(history[:5], "reward/mean"), _mean(history[-5:], "reward/mean")
    assert end - start > 0.2, (start, end)
    # every step generated from the weights of the step before (synced), so the engine's log-probs
    # are the trainer's up to float32 kernel differences, and the correction weights stay ~1
    assert max(r["rollout/logprob_diff_max"] for r in history) < 1e-3
    assert all(abs(r["rollout/is_weight_mean"] - 1) < 1e-3 for r in history)
    assert all(r["rollout/is_masked_frac"] == 0 for r in history)
    assert all(r["perf/time_weight_sync"] > 0 for r in history[1:])
    assert trainer.engine.synced_version == trainer.weights_version - trainer.args.num_iterations


def test_evaluation_uses_the_synced_engine_and_matches_hf_greedy_scores():
    vl = toy_trainer("grpo", model_kwargs=HEADS, max_steps=2, **VLLM)
    vl.eval_rows = vl.rows
    vl.eval_prompt_ids = vl.prompt_ids
    history = vl.train()  # evaluates before the first step and after the last
    # The last step's update came after its generation: only the evaluation after it synced those weights.
    assert vl.engine.synced_version == vl.weights_version > 0
    hf = toy_trainer("grpo", model_kwargs=HEADS, max_steps=0)
    hf.models.policy.load_state_dict(vl.models.policy.state_dict())
    hf.eval_rows, hf.eval_prompt_ids = hf.rows, hf.prompt_ids
    a, b = history[-1], hf.evaluate()
    assert abs(a["eval/score_mean"] - b["eval/score_mean"]) <= 1.01 / len(vl.eval_rows)  # at most one near-tie


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_each_generate_their_own_prompts_with_synced_engines(tmp_path):
    config = dict(algorithm="grpo", prompts_per_step=4, max_steps=3, model_kwargs=HEADS, **VLLM)
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_DIST_TIMEOUT": "300"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(WORKER), str(tmp_path / "config.json"), str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"vllm-{r}.json").read_text()) for r in range(2)]
    assert all(r["world"] == 2 for r in ranks)
    for step in range(3):  # each process its own half of the step's prompts
        mine, theirs = ranks[0]["rows"][step], ranks[1]["rows"][step]
        assert len(mine) == len(theirs) == 2 and not set(mine) & set(theirs)
    for r in ranks:  # before every generation the engine held the weights of every update so far
        assert r["versions"] == [[0, 0], [1, 1], [2, 2], [3, 3]], r["versions"]  # the last: the check after
        assert r["gap"] < 1e-3, r["gap"]


def test_the_step_benchmark_compares_the_engines(tmp_path):
    from rlhfkit.tasks.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "model", heads=2)
    script = Path(__file__).parents[2] / "benchmarks" / "rl_step.py"
    out = subprocess.run([sys.executable, str(script), "--model", model, "--compare-engines", "--warmup", "1",
                          "--steps", "1", "--new-tokens", "4"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].split()[0] == "engine" and [line.split()[0] for line in lines[1:]] == ["hf", "vllm"]


def test_an_adapter_the_engine_cannot_take_merged_is_refused_at_construction_in_one_line(tmp_path):
    from peft import LoraConfig

    from rlhfkit.config import RLConfig
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
    from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
    from rlhfkit.trainers import RLTrainer

    tok = char_tokenizer()
    lora_on_tied_embedding = LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"])
    args = RLConfig(algorithm="grpo", max_steps=1, output_dir=str(tmp_path / "run"), **VLLM)
    with pytest.raises(ValueError) as err:
        RLTrainer(tiny_causal_lm(tok, **HEADS), [fraction_of_a], args, train_dataset=PROMPTS, processing_class=tok,
                  peft_config=lora_on_tied_embedding)
    assert "\n" not in str(err.value) and "lm_head.weight are one tied weight" in str(err.value)
    assert not (tmp_path / "run").exists()  # before anything was written


def test_a_vllm_generator_rank_and_a_trainer_rank_learn_the_toy_task(tmp_path):
    """rollout_workers=1: the last rank generates with vLLM (its engine core in a process of its own)
    and receives the weights after every update; S = 1, so each batch is one version old."""
    config = dict(algorithm="grpo", max_steps=30, rollout_workers=1, max_staleness=1, output_dir=None,
                  model_kwargs=HEADS, **VLLM)
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_DIST_TIMEOUT": "300"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(WORKER.parent / "async_worker.py"), "train",
           str(tmp_path / "config.json"), str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    history = json.loads((tmp_path / "history.json").read_text())
    assert _mean(history[-5:], "reward/mean") - _mean(history[:5], "reward/mean") > 0.2
    assert [r["rollout/staleness_max"] for r in history] == [0.0] + [1.0] * 29
    # The engine's log-probs are the behaviour policy's: one update behind the trainer's, so they differ.
    assert max(r["rollout/logprob_diff_max"] for r in history[1:]) > 1e-2


def _async_worker(tmp_path, name: str, config: dict, nproc: int):
    """The toy run of ``async_worker.py train`` on ``nproc`` processes (1: no torchrun): its final
    weights and logged rows."""
    from safetensors.torch import load_file

    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_DIST_TIMEOUT": "300",
           "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")])}
    launcher = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port())]
    done = subprocess.run([*launcher, str(WORKER.parent / "async_worker.py"), "train", str(out / "config.json"),
                           str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return load_file(str(out / "weights.safetensors")), json.loads((out / "history.json").read_text())


def test_staleness_0_with_a_vllm_generator_is_the_single_process_vllm_run(tmp_path):
    """S = 0: a vLLM generator (its engine core in a process of its own, the weights received
    serialised) samples with the same per-prompt seeds as the single process's in-process vLLM
    engine, so the trainer beside it logs the same rewards and ends on the same weights."""
    config = dict(algorithm="grpo", max_steps=4, output_dir=None, model_kwargs=HEADS, **VLLM)
    one, one_rows = _async_worker(tmp_path, "one", config, 1)
    split, rows = _async_worker(tmp_path, "split", {**config, "rollout_workers": 1}, 2)
    assert [r["reward/mean"] for r in rows] == [r["reward/mean"] for r in one_rows]
    assert len({r["reward/mean"] for r in rows}) > 1
    assert max(float((one[k] - split[k]).abs().max()) for k in one) <= 1e-5
