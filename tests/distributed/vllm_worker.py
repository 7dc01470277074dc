"""Run by tests/trainers/test_rl_vllm.py, under torchrun or as one plain process:

vllm_worker.py check <config.json> <out_dir>
    a short toy-task run with the vLLM engine (``toy_trainer`` with the config's fields), then
    each process checks its own engine and writes ``<out_dir>/vllm-<rank>.json``: the prompt rows
    it generated for at each step, which weights its engine held at each generation, and the
    largest gap between its engine's log-probs and the trainer's on a fresh sample
vllm_worker.py train <jobs.json>
    for each [config, out_dir] of the list, in turn (one launch, one import, serves every run;
    the role groups are made once per process, so every run of one launch has the same
    rollout_workers): a toy-task run (``toy_trainer`` with the config's fields); global rank 0
    writes the policy's full weights to <out_dir>/weights.safetensors and the logged rows to
    <out_dir>/history.json
"""

import json
import sys

import torch
from safetensors.torch import save_file

from rlhfkit import distributed
from rlhfkit.models.policy import forward_response
from rlhfkit.rollout.engines import engine_ready
from rlhfkit.tasks.toy import toy_trainer


def check(config_path, out_dir):
    config = json.loads(open(config_path).read())
    trainer = toy_trainer(**config)
    sampled, versions, sample, generate = [], [], trainer.sampler.sample_prompts, trainer.sampler.engine.generate

    def recording_sample():
        sampled.append(sample())
        return sampled[-1]

    def recording_generate(*args, **kwargs):  # which weights the engine held when it generated
        versions.append([trainer.sampler.engine.synced_version, trainer.weights_version])
        return generate(*args, **kwargs)

    trainer.sampler.sample_prompts, trainer.sampler.engine.generate = recording_sample, recording_generate
    trainer.train()
    rows = sampled[-1]
    with engine_ready(
        trainer.sampler.engine, trainer.models, trainer.weights_version, {}
    ):  # the last update is synced here
        rollout = trainer.sampler.engine.generate(
            [trainer.sampler.prompt_ids[i] for i in rows], 2, trainer.sampler.sampling, seed=99
        )
    with torch.no_grad(), distributed.gathered(trainer.models.policy):
        T = rollout.response_mask.shape[1]
        mine = forward_response(
            trainer.models.policy, rollout.input_ids, rollout.attention_mask, T, trainer.args.temperature
        ).logprobs
    gap = (mine - rollout.logprobs)[rollout.response_mask.bool()].abs().max().item()
    with open(f"{out_dir}/vllm-{distributed.role_rank()}.json", "w") as f:
        json.dump({"rows": sampled, "versions": versions, "gap": gap, "world": distributed.role_size()}, f)
    distributed.finished()  # as Run.finish ends: no process tears its gloo group down while another still works


def train(jobs):
    for config, out_dir in json.loads(open(jobs).read()):
        train_one(config, out_dir)


def train_one(config, out_dir):
    trainer = toy_trainer(**config)
    history = trainer.train()
    if hasattr(trainer.sampler.engine, "close"):  # a vLLM engine: gone before the next run builds its own
        trainer.sampler.engine.close()
    if distributed.is_generator():
        return
    weights = distributed.full_state_dict(trainer.models.policy)  # collective over the trainers
    if distributed.is_main():
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, f"{out_dir}/weights.safetensors")
        with open(f"{out_dir}/history.json", "w") as f:
            json.dump(history, f)


if __name__ == "__main__":
    {"check": check, "train": train}[sys.argv[1]](*sys.argv[2:])
