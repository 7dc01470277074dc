"""Run by the checkpoint tests, under torchrun or as one plain process:

checkpoint_worker.py <jobs.json>
    for each [config, out_dir] of the list, in turn (one launch, one import, serves every run):
    a toy-task run (``resume_from`` in the config resumes it; ``lora_r`` trains a LoRA adapter).
    Rank 0 writes to <out_dir> the full weights and optimizer state (gathered from every process)
    right after each checkpoint (``saved-<step>.safetensors``), right after resuming
    (``loaded.safetensors``) and at the end (``final.safetensors``); every rank writes
    ``loaded-<rank>.json``: the step it resumed at and a digest of its torch RNG state then.
"""

import hashlib
import json
import sys

import torch
from safetensors.torch import save_file

from rlhfkit import distributed


def make_trainer(config: dict):
    from rlhfkit.tasks.toy import toy_trainer

    lora_r = config.pop("lora_r", 0)
    if not lora_r:
        return toy_trainer(**config)
    from rlhfkit import RLConfig, RLTrainer
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
    from rlhfkit.tasks.toy import PROMPTS, fraction_of_a

    tok = char_tokenizer()
    args = RLConfig(**{"learning_rate": 1e-2, "max_new_tokens": 8, "log_every": 0, **config})
    return RLTrainer(
        tiny_causal_lm(tok, seed=0),
        [fraction_of_a],
        args,
        train_dataset=PROMPTS,
        processing_class=tok,
        peft_config=lora_config(lora_r),
    )


def lora_config(r: int):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def rng_digest() -> str:
    return hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()


def full_state(trainer) -> dict[str, torch.Tensor]:
    """Every trained module's weights (``<module>.<fqn>``) and the optimizer's tensors
    (``optimizer.<module>.<fqn>.<name>``), unsharded, on rank 0 (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    container = torch.nn.ModuleDict(trainer.run.modules)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    model, optim = get_state_dict(container, trainer.run.optimizer, options=options)  # empty but on rank 0
    frozen = {
        f"{name}.{n}"
        for name, m in trainer.run.modules.items()  # a tied frozen weight slips through
        for n, p in m.named_parameters(remove_duplicate=False)
        if not p.requires_grad
    }
    out = {k: v for k, v in model.items() if k not in frozen}
    out.update({f"optimizer.{fqn}.{k}": v for fqn, s in optim.get("state", {}).items() for k, v in s.items()})
    return {k: v.detach().cpu().contiguous().clone() for k, v in out.items()}


def dump(trainer, file: str) -> None:
    state = full_state(trainer)
    if distributed.is_main():
        save_file(state, file)


def main(jobs: str) -> None:
    for config, out_dir in json.loads(open(jobs).read()):
        train(config, out_dir)
    distributed.finished()  # as Run.finish ends: no process tears its gloo group down while another still works


def train(config: dict, out_dir: str) -> None:
    trainer = make_trainer(config)
    if config.get("resume_from"):
        with open(f"{out_dir}/loaded-{distributed.role_rank()}.json", "w") as f:
            json.dump({"step": trainer.step, "rng": rng_digest()}, f)
        dump(trainer, f"{out_dir}/loaded.safetensors")
    save = trainer.run.save_checkpoint  # what the run calls every save_steps

    def save_and_dump(path, counters):
        save(path, counters)
        dump(trainer, f"{out_dir}/saved-{trainer.step}.safetensors")

    trainer.run.save_checkpoint = save_and_dump
    trainer.train()
    dump(trainer, f"{out_dir}/final.safetensors")


if __name__ == "__main__":
    main(*sys.argv[1:])
