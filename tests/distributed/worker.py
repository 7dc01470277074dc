"""Run by the distributed tests, under torchrun or as one plain process:

worker.py update <cases.json>
    for each [experience.pt, config.json, out.safetensors] of the list, in turn (one launch, one
    import, serves every case): one RL update of that fixed batch of experience by a fresh trainer
    with that config; this process trains on its share of the rows, rank 0 writes the full weights
    and, beside them (out.json), the metrics the update logged
worker.py train <config.json> <out_dir>
    a toy-task run; every process writes, before any gathering, a sha256 of each parameter as it
    holds it (its own replica under DDP, its shard under FSDP) to <out_dir>/weights-<rank>.json
worker.py generate <config.json> <out_dir>
    process r samples r + 1 times from the policy (FSDP2 gathered, as the agent loop does when
    one process's episodes end a turn before another's), then all meet at a barrier; each writes
    what it sampled to <out_dir>/generated-<rank>.json
worker.py jobs <jobs.json>
    each [command, *args] of the list (train or generate), in turn, in this one launch
"""

import hashlib
import json
import sys

import torch
from safetensors.torch import save_file

from rlhfkit import distributed
from rlhfkit.models.activations import ActivationCost
from rlhfkit.models.memory import SAFETY
from rlhfkit.rl.experience import Experience
from rlhfkit.rollout import Rollout
from rlhfkit.tasks.toy import toy_trainer

FIELDS = ("mask", "old_logprobs", "ref_logprobs", "old_values", "advantages", "returns", "is_weights")
ROLLOUT = ("input_ids", "attention_mask", "response_mask", "has_eos", "prompt_index")


def load_experience(path, rows):
    data = torch.load(path, weights_only=True)
    logprobs = data["logprobs"][rows] if "logprobs" in data else None  # an engine's own log-probs
    rollout = Rollout(*(data[k][rows] for k in ROLLOUT[:4]), int(data["prompt_len"]), data["prompt_index"][rows])
    rollout.logprobs = logprobs
    exp = Experience(rollout, *(data[k][rows] if k in data else None for k in FIELDS))
    exp.correct_in_loss = bool(data.get("correct_in_loss", False))
    return exp


def full_weights(trainer) -> dict:
    out = {f"policy.{k}": v for k, v in distributed.full_state_dict(trainer.models.policy).items()}
    if trainer.models.critic_module is not None:
        out.update({f"critic.{k}": v for k, v in distributed.full_state_dict(trainer.models.critic_module).items()})
    return out


def set_adam_eps(trainer, eps: float | None):
    """AdamW's eps set to ``eps`` on a training process (see COMPARABLE_ADAM_EPS in
    test_distributed.py); None: left as built. Returns ``trainer``."""
    for group in trainer.run.optimizer.param_groups if eps is not None and not distributed.is_generator() else []:
        group["eps"] = eps
    return trainer


def update(cases):
    for experience, config, out in json.loads(open(cases).read()):
        update_one(experience, config, out)
    distributed.finished()  # as Run.finish ends: no process tears its gloo group down while another still works


def update_one(experience, config, out):
    config = json.loads(open(config).read())
    eps = config.pop("adam_eps", None)
    above = config.pop("checkpoint_above_tokens", None)
    config.pop("engine_noise", None)  # the experience's (test_distributed._experience)
    trainer = set_adam_eps(toy_trainer(**config), eps)
    if above is not None:  # a pass of more than that many tokens (rows x width) checkpoints under 'auto':
        # a fixed cost of 1 byte a token (not the probe's fit, whose count the equivalence does not test)
        plan = trainer.models.memory
        plan.cost = ActivationCost(off=(0.0, 1.0, 0.0), on=(0.0, 0.1, 0.0), layers=2)
        plan.free = lambda: above / SAFETY
    B = torch.load(experience, weights_only=True)["mask"].shape[0]
    share = B // distributed.role_size()
    rows = torch.arange(distributed.role_rank() * share, (distributed.role_rank() + 1) * share)
    logged = {k: float(v) for k, v in trainer.update(load_experience(experience, rows)).items()}
    metrics = logged | trainer.models.memory.metrics()
    if above is not None:  # each process's own share: they decide for themselves
        sys.stderr.write(f"checkpointed_frac[{distributed.role_rank()}]={metrics['perf/checkpointed_frac']}\n")
    weights = full_weights(trainer)
    if distributed.is_main():
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, out)
        open(out.removesuffix(".safetensors") + ".json", "w").write(json.dumps(logged))  # the update's metrics


VARYING = ("xyz 12", "hello")


def some_prompts_vary(prompts, completions, **kwargs):
    """Scores 0, 1/4, 2/4, 3/4 for the completions of a group of 4 of a VARYING prompt, whatever they
    are (variance guaranteed), 0 for every other prompt (groups dynamic sampling drops)."""
    return [(i % 4) / 4 if p in VARYING else 0.0 for i, p in enumerate(prompts)]


class StopOnOneRank:
    """A ``TrainerCallback`` that asks to stop at ``step`` on process ``rank`` only."""

    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step

    def on_step_end(self, args, state, control, **kwargs):
        if distributed.role_rank() == self.rank and state.global_step == self.step:
            control.should_training_stop = True


def _trainer(config: dict):
    """The toy trainer; ``lora_r`` in the config trains a LoRA adapter of that rank, ``reward``
    names a reward function of this module to use instead of the toy task's, ``stop: [rank, step]``
    adds a callback that stops the run at that step on that process only."""
    stop = config.pop("stop", None)
    if stop is not None:
        return toy_trainer(callbacks=[StopOnOneRank(*stop)], **config)
    reward = config.pop("reward", None)
    if reward is not None:
        from rlhfkit import RLConfig, RLTrainer
        from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
        from rlhfkit.tasks.toy import PROMPTS

        tok = char_tokenizer()
        args = RLConfig(**{"learning_rate": 3e-3, "max_new_tokens": 8, "log_every": 0, "seed": 0, **config})
        return RLTrainer(
            tiny_causal_lm(tok, seed=0), [globals()[reward]], args, train_dataset=PROMPTS, processing_class=tok
        )
    lora_r = config.pop("lora_r", 0)
    if not lora_r:
        return toy_trainer(**config)
    from peft import LoraConfig

    from rlhfkit import RLConfig, RLTrainer
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
    from rlhfkit.tasks.toy import PROMPTS, fraction_of_a

    tok = char_tokenizer()
    lora = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    args = RLConfig(**{"learning_rate": 1e-2, "max_new_tokens": 8, "log_every": 0, **config})
    return RLTrainer(
        tiny_causal_lm(tok, seed=0),
        [fraction_of_a],
        args,
        train_dataset=PROMPTS,
        processing_class=tok,
        peft_config=lora,
    )


def local_digests(trainer) -> dict[str, str]:
    """sha256 of the bytes of every trained parameter as this process holds it: no collective, so
    processes whose copies diverged give different digests."""
    modules = {"policy": trainer.models.policy, "critic": trainer.models.critic_module}
    out = {}
    for prefix, module in modules.items():
        for name, p in distributed.unwrap(module).named_parameters() if module is not None else []:
            t = p.detach()
            t = t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: this process's shard
            data = t.cpu().contiguous().flatten().view(torch.uint8).numpy()
            out[f"{prefix}.{name}"] = hashlib.sha256(data).hexdigest()
    return out


def train(config, out_dir):
    trainer = _trainer(json.loads(open(config).read()))
    trainer.train()
    with open(f"{out_dir}/weights-{distributed.role_rank()}.json", "w") as f:
        json.dump(local_digests(trainer), f)


def generate(config, out_dir):
    trainer = _trainer(json.loads(open(config).read()))
    prompts = [trainer.sampler.prompt_ids[0]]
    sampled = []
    with distributed.gathered(trainer.models.policy):
        for _ in range(distributed.role_rank() + 1):  # a different number of generate calls on each process
            sampled.append(trainer.sampler.engine.generate(prompts, 2, trainer.sampler.sampling).response_ids.tolist())
    distributed.role_barrier()
    with open(f"{out_dir}/generated-{distributed.role_rank()}.json", "w") as f:
        json.dump(sampled, f)


def jobs(path):
    for command, *args in json.loads(open(path).read()):
        COMMANDS[command](*args)
    distributed.finished()  # as Run.finish ends: no process tears its gloo group down while another still works


COMMANDS = {"update": update, "train": train, "generate": generate, "jobs": jobs}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
