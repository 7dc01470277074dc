"""Run by tests/trainers/test_rl_vllm.py under torchrun: a short toy-task GRPO run with the vLLM
engine, then each process checks its own engine and writes ``<out_dir>/vllm-<rank>.json``:
the prompt rows it generated for at each step, whether its engine holds the latest weights, and
the largest gap between its engine's log-probs and the trainer's on a fresh sample."""

import json
import sys

import torch

from rlhfkit import distributed
from rlhfkit.models.policy import forward_response
from rlhfkit.rollout.engines import engine_ready
from rlhfkit.tasks.toy import toy_trainer


def main(config_path, out_dir):
    config = json.loads(open(config_path).read())
    trainer = toy_trainer(**config)
    sampled, versions, sample, generate = [], [], trainer.sample_prompts, trainer.engine.generate

    def recording_sample():
        sampled.append(sample())
        return sampled[-1]

    def recording_generate(*args, **kwargs):  # which weights the engine held when it generated
        versions.append([trainer.engine.synced_version, trainer.weights_version])
        return generate(*args, **kwargs)

    trainer.sample_prompts, trainer.engine.generate = recording_sample, recording_generate
    trainer.train()
    rows = sampled[-1]
    with engine_ready(trainer.engine, trainer.models, trainer.weights_version, {}):  # the last update is synced here
        rollout = trainer.engine.generate([trainer.prompt_ids[i] for i in rows], 2, trainer.sampling, seed=99)
    with torch.no_grad(), distributed.gathered(trainer.models.policy):
        T = rollout.response_mask.shape[1]
        mine = forward_response(trainer.models.policy, rollout.input_ids, rollout.attention_mask, T,
                                trainer.args.temperature).logprobs
    gap = (mine - rollout.logprobs)[rollout.response_mask.bool()].abs().max().item()
    with open(f"{out_dir}/vllm-{distributed.rank()}.json", "w") as f:
        json.dump({"rows": sampled, "versions": versions, "gap": gap, "world": distributed.world()}, f)
    distributed.finished()  # as Run.finish ends: no process tears its gloo group down while another still works


if __name__ == "__main__":
    main(*sys.argv[1:])
