"""One optimizer step through TRL 1.16's ``GRPOTrainer`` / ``DPOTrainer`` and through rlhfkit's
drop-in classes (``rlhfkit.trl``), from the same weights, data and config: the same weights after it?

    pip install trl==1.16.0 peft matplotlib gguf math-verify   # an environment of its own
    pip install --no-deps -e .                                  # rlhfkit beside it
    python benchmarks/trl_dropin_step.py                        # one JSON line per case

Each case builds one ``GRPOConfig`` (TRL's class, then the same keyword arguments to rlhfkit's
drop-in class) and runs ``max_steps`` optimizer steps of each trainer on a tiny random Llama saved
to a temporary directory. Sampling is the one thing taken out of both: each trainer's generation
returns the same fixed completions for each prompt (TRL's ``model.generate``, rlhfkit's engine), so
what is compared is everything after it — the batch arithmetic of the config (prompts per generation,
micro-batches, accumulation, passes), rewards, advantages, the loss and its normalisation, gradient
clipping, AdamW and the learning-rate schedule. Printed: the largest absolute and relative weight
difference between the two final models and the largest weight change of the step (so a difference
reads against the step's size). Known differences: TRL divides advantages by ``std + 1e-4``,
rlhfkit by ``std + 1e-6``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings

import torch

PROMPTS = ["abc", "hello", "xyz 12", "qq", "the cat", "go", "12+3=", "hi there"]
CASES = {  # one optimizer step each: the same weights are then expected within float tolerance
    "dapo loss (TRL's default), one micro-step": dict(per_device_train_batch_size=16, num_generations=4, max_steps=1),
    "grpo loss, 2 accumulated micro-steps": dict(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                                                 num_generations=4, max_steps=1, loss_type="grpo"),
    "dr_grpo loss, generation of 4 micro-steps, 4 accumulated": dict(
        per_device_train_batch_size=4, gradient_accumulation_steps=4, steps_per_generation=4, num_generations=4,
        max_steps=1, loss_type="dr_grpo"),
    "dapo loss, 8 completions per prompt, clip-higher": dict(per_device_train_batch_size=16, num_generations=8,
                                                             max_steps=1, epsilon_high=0.28),
}
COMMON = dict(max_completion_length=6, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", seed=0,
              logging_steps=1, save_strategy="no")


def completions(tokenizer, prompt: str, n: int) -> list[list[int]]:
    """``n`` fixed completions of ``prompt``: different lengths ended by EOS, and every third one
    truncated — as long as ``max_completion_length``, without EOS, as a sampler leaves it."""
    limit = COMMON["max_completion_length"]
    texts = [("a" * (1 + (len(prompt) + j) % 4)) + ("b" if j % 2 else "") for j in range(n)]
    ids = [tokenizer(t if j % 3 != 2 else (t * limit)[:limit], add_special_tokens=False)["input_ids"]
           for j, t in enumerate(texts)]
    return [x + [tokenizer.eos_token_id] if j % 3 != 2 else x for j, x in enumerate(ids)]


def fraction_of_a(completions, **kwargs):
    return [c.count("a") / max(1, len(c)) for c in completions]


def trl_step(model_dir: str, kwargs: dict, out: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    seen: dict[str, int] = {}

    def generate(input_ids, attention_mask, **_):
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = tok.decode([i for i, m in zip(ids, mask) if m])
            j = seen.get(prompt, 0)
            seen[prompt] = j + 1
            rows.append(completions(tok, prompt, kwargs["num_generations"] * 64)[j % kwargs["num_generations"]])
        width = max(map(len, rows))
        tail = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, tail.to(input_ids.device)], dim=1)

    model.generate = generate
    config = GRPOConfig(output_dir=out, **COMMON, **kwargs)
    from datasets import Dataset

    trainer = GRPOTrainer(model=model, reward_funcs=fraction_of_a, args=config,
                          train_dataset=Dataset.from_list(_dataset(kwargs)), processing_class=tok)
    trainer.train()
    return {k: v.detach().float().clone() for k, v in trainer.model.state_dict().items()}


def ours_step(model_dir: str, kwargs: dict, out: str, eps: float | None = None) -> dict:
    """rlhfkit's step; ``eps``: the group advantages' epsilon instead of TRL's (which the drop-in sets)."""
    from rlhfkit.rollout.base import build_rollout
    from rlhfkit.trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(output_dir=out, **COMMON, **kwargs)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=fraction_of_a, args=config, train_dataset=_dataset(kwargs))
    if eps is not None:
        trainer.args = trainer.args.replace(advantage_epsilon=eps)
    tok = trainer.tokenizer

    def generate(prompts, n, sampling, seed=None):
        responses = [c for p in prompts for c in completions(tok, tok.decode(p), n)]
        return build_rollout(prompts, responses, n, tok.pad_token_id, tok.eos_token_id)

    trainer.sampler.engine.generate = generate
    trainer.train()
    return {k: v.detach().float().clone() for k, v in trainer.models.policy.state_dict().items()}


def _dataset(kwargs: dict) -> list[dict]:
    """As many prompts as one generation takes (every prompt is seen, whatever the sampler's order)."""
    per_generation = kwargs["per_device_train_batch_size"] * kwargs.get("steps_per_generation",
                                                                        kwargs.get("gradient_accumulation_steps", 1))
    return [{"prompt": p} for p in PROMPTS[:per_generation // kwargs["num_generations"]]]


PAIRS = [{"prompt": p, "chosen": p[::-1] + "a", "rejected": p + "zz"} for p in PROMPTS]
DPO_CASES = {"dpo sigmoid, 2 accumulated micro-steps": dict(per_device_train_batch_size=4,
                                                              gradient_accumulation_steps=2, beta=0.1, max_steps=1),
             "dpo ipo, one micro-step": dict(per_device_train_batch_size=8, beta=0.1, max_steps=1, loss_type="ipo")}
DPO_COMMON = dict(learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", seed=0, logging_steps=1,
                  save_strategy="no", max_length=64)


def dpo_step(trl: bool, model_dir: str, kwargs: dict, out: str) -> dict:
    """One DPO step: TRL's trainer (``trl``) or rlhfkit's drop-in, the model from ``model_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if trl:
        from datasets import Dataset
        from trl import DPOConfig, DPOTrainer

        data = Dataset.from_list(PAIRS)
    else:
        from rlhfkit.trl import DPOConfig, DPOTrainer

        data = PAIRS
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = DPOTrainer(model=model, args=DPOConfig(output_dir=out, **DPO_COMMON, **kwargs), train_dataset=data,
                         processing_class=AutoTokenizer.from_pretrained(model_dir))
    trainer.train()
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def compare(start: dict, theirs: dict, ours: dict, prefix: str = "") -> dict:
    return {f"{prefix}max_abs_diff": max((theirs[k] - ours[k]).abs().max().item() for k in ours),
            f"{prefix}max_rel_diff_of_update": max(
                ((theirs[k] - ours[k]).norm() / (theirs[k] - start[k]).norm().clamp(min=1e-12)).item() for k in ours)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES) + list(DPO_CASES))
    parser.add_argument("--eps", type=float, help="rlhfkit's group-advantage epsilon (default: the drop-in's, TRL's 1e-4)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from rlhfkit.tasks.tiny import save_tiny_model

    for name in [args.case] if args.case else [*CASES, *DPO_CASES]:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = save_tiny_model(f"{tmp}/model", seed=0)
            from transformers import AutoModelForCausalLM

            start = {k: v.float().clone() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}
            if name in DPO_CASES:
                theirs = dpo_step(True, model_dir, DPO_CASES[name], f"{tmp}/trl")
                row = {"case": name, "max_update": max((theirs[k] - start[k]).abs().max().item() for k in theirs)}
                row.update(compare(start, theirs, dpo_step(False, model_dir, DPO_CASES[name], f"{tmp}/ours")))
                print(json.dumps(row), flush=True)
                continue
            theirs = trl_step(model_dir, CASES[name], f"{tmp}/trl")
            row = {"case": name, "max_update": max((theirs[k] - start[k]).abs().max().item() for k in theirs)}
            row.update(compare(start, theirs, ours_step(model_dir, CASES[name], f"{tmp}/ours", args.eps)))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
