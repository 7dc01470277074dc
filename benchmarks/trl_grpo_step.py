"""TRL's GRPO step on the work ``benchmarks/rl_step.py`` times, for a ratio measured on one machine.

    pip install trl==1.16.0            # in an environment of its own (it is not an rlhfkit dependency)
    python benchmarks/trl_grpo_step.py --prompts 4 --group-size 4 --new-tokens 32

SmolLM2-135M-Instruct (the same GGUF-converted Hugging Face directory rlhfkit uses), float32, the
same arithmetic prompts and rewards, ``beta=0`` (no reference, as ``rl_step.py --kl-coef 0``), one
generation and one optimizer step per step, HF ``generate`` (TRL's vLLM modes need a GPU). The step
time is the mean wall time of ``--steps`` training steps after ``--warmup``, from TRL's own callback
hooks. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhfkit.models.sources import resolve_model_dir, smollm2_gguf
    from rlhfkit.rewards import get_reward_function
    from rlhfkit.tasks.arithmetic import make_rows

    model_dir = str(resolve_model_dir(smollm2_gguf()))
    rows = make_rows(256, 0)
    data = Dataset.from_list(rows)  # prompt: chat messages, answer: the number
    rewards = [get_reward_function(name) for name in ("math_answer", "answer_format")]
    for fn, name in zip(rewards, ("math_answer", "answer_format")):
        fn.__name__ = name

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.start)

    timer = Timer()
    batch = a.prompts * a.group_size
    config = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, num_generations=a.group_size,
                        max_completion_length=a.new_tokens, learning_rate=1e-6, beta=0.0, max_steps=a.warmup + a.steps,
                        logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
                        gradient_accumulation_steps=1, steps_per_generation=1, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=rewards, args=config, train_dataset=data, callbacks=[timer])
    torch.manual_seed(0)
    trainer.train()
    steps = timer.times[a.warmup:]
    print(json.dumps({"framework": "trl", "batch": f"{a.prompts}x{a.group_size}x{a.new_tokens}",
                      "step_s": sum(steps) / len(steps), "steps": steps}), flush=True)


if __name__ == "__main__":
    main()
