"""Run by the asynchronous-rollout tests (test_async.py), under torchrun or as one plain process:

async_worker.py train <jobs.json>
    for each [config, out_dir] of the list, in turn (one launch, one import, serves every run;
    the role groups are made once per process, so every run of one launch has the same
    rollout_workers): a toy-task run (worker.py's trainer: ``toy_trainer`` with the config's
    fields, ``lora_r`` for a LoRA adapter, ``adam_eps`` for AdamW's eps); global rank 0 writes the
    policy's full weights (LoRA merged) to <out_dir>/weights.safetensors and the logged rows to
    <out_dir>/history.json
"""

import json
import sys

from safetensors.torch import save_file
from worker import _trainer, set_adam_eps

from rlhfkit import distributed


def train(jobs):
    for config, out_dir in json.loads(open(jobs).read()):
        train_one(config, out_dir)


def train_one(config, out_dir):
    eps = config.pop("adam_eps", None)
    trainer = set_adam_eps(_trainer(config), eps)
    history = trainer.train()
    if distributed.is_generator():
        return
    policy = trainer.models.policy
    if hasattr(policy, "merge_and_unload"):  # LoRA: the weights the adapter gives
        from rlhfkit.rollout.weight_sync import hf_weights

        weights = {k: v.detach().clone() for k, v in hf_weights(policy)}
    else:
        weights = distributed.full_state_dict(policy)  # collective over the trainers
    if distributed.is_main():
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, f"{out_dir}/weights.safetensors")
        with open(f"{out_dir}/history.json", "w") as f:
            json.dump(history, f)


if __name__ == "__main__":
    {"train": train}[sys.argv[1]](*sys.argv[2:])
