"""Run by tests/distributed/test_supervised.py, under torchrun or as one plain process:

    supervised_worker.py <jobs.json>

``jobs``: a list of [spec, out_dir], trained in turn in this one launch (one import serves them all).
``spec``: ``{"trainer": "sft" | "rm" | "dpo" | "kto", "model": <dir>, "args": {config fields}, "train": rows,
"eval": rows or null, "lora": LoraConfig kwargs (dpo) or absent}``. Trains, then rank 0 writes the full weights to
``<out_dir>/weights.safetensors`` and every process its metrics to ``<out_dir>/history-<rank>.json``.
"""

import json
import sys

from safetensors.torch import save_file

from rlhfkit import distributed
from rlhfkit.trainers.dpo import DPOConfig, DPOTrainer
from rlhfkit.trainers.kto import KTOConfig, KTOTrainer
from rlhfkit.trainers.reward_model import RewardModelConfig, RewardModelTrainer
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer


def main(jobs):
    for spec, out_dir in json.loads(open(jobs).read()):
        train(spec, out_dir)


def train(spec, out_dir):
    if spec["trainer"] == "sft":
        trainer = SFTTrainer(spec["model"], SFTConfig(**spec["args"]), spec["train"], spec.get("eval"))
        module = trainer.model
    elif spec["trainer"] == "dpo":
        peft = None
        if spec.get("lora"):
            from peft import LoraConfig

            peft = LoraConfig(**spec["lora"])
        trainer = DPOTrainer(
            spec["model"], DPOConfig(**spec["args"]), spec["train"], spec.get("eval"), peft_config=peft
        )
        module = trainer.model
    elif spec["trainer"] == "kto":
        trainer = KTOTrainer(spec["model"], KTOConfig(**spec["args"]), spec["train"], spec.get("eval"))
        module = trainer.model
    else:
        trainer = RewardModelTrainer(spec["model"], RewardModelConfig(**spec["args"]), spec["train"], spec.get("eval"))
        module = trainer.scorer  # keys "model.<ScalarModel parameter>"
    history = trainer.train()
    weights = distributed.full_state_dict(module)  # a collective: every process takes part
    if distributed.is_main():  # clone: tied embeddings share storage, which safetensors refuses
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, f"{out_dir}/weights.safetensors")
    with open(f"{out_dir}/history-{distributed.role_rank()}.json", "w") as f:
        json.dump(history, f)
    distributed.finished()  # as Run.finish ends: no process tears its gloo group down while another still works


if __name__ == "__main__":
    main(*sys.argv[1:])
