"""The toy RL task of the tests and README: a tiny random Llama learns to write the letter 'a'.

The reward is the share of 'a' characters in the completion, so the optimum ('aaaa…') is known
and any preset that learns at all raises it within a few dozen steps on a CPU.
"""

from __future__ import annotations

import time
from typing import Any

from ..config import PRESETS, RLConfig

PROMPTS = [{"prompt": p} for p in ["abc", "hello", "xyz 12", "qq", "the cat", "go", "12+3=", "hi there"]]


def fraction_of_a(prompts, completions, **columns):
    """Share of 'a' characters in each completion (0 for an empty one)."""
    return [c.count("a") / max(1, len(c)) for c in completions]


def letter_teacher(tokenizer, letter: str = "a", bias: float = 4.0, seed: int = 1):
    """A teacher for the toy task: a tiny random model whose output layer favours ``letter`` (a bias of
    ``bias`` on it), so it writes mostly that letter — what on-policy distillation moves the student toward."""
    from .tiny import tiny_causal_lm, with_biased_head

    return with_biased_head(tiny_causal_lm(tokenizer, seed=seed), tokenizer.convert_tokens_to_ids(letter), bias)


def toy_trainer(algorithm: str, model_kwargs: dict | None = None, callbacks=None, teacher=None, **overrides):
    """An ``RLTrainer`` on the toy task with settings that learn in ~30 steps; ``model_kwargs`` go to
    ``tiny_causal_lm`` (vLLM's CPU attention wants a head size of 32 or more: ``{"heads": 2}``),
    ``callbacks`` to the trainer; ``teacher`` to it as ``teacher_model`` (default: ``letter_teacher``
    when the run distils: the ``distill`` preset, or ``distillation_coef`` > 0)."""
    from ..trainers import RLTrainer
    from .tiny import char_tokenizer, tiny_causal_lm

    tok = char_tokenizer()
    distils = overrides.get("distillation_coef", PRESETS[algorithm]["distillation_coef"]) > 0
    if teacher is None and distils:
        teacher = letter_teacher(tok)
    group_based = PRESETS[algorithm]["group_size"] > 1
    args: dict[str, Any] = dict(
        algorithm=algorithm,
        learning_rate=3e-3,
        max_new_tokens=8,
        max_steps=30,
        log_every=0,
        seed=0,
        prompts_per_step=4 if group_based else 16,
    )
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, seed=0, **(model_kwargs or {})),
        [fraction_of_a],
        RLConfig(**args),
        train_dataset=PROMPTS,
        processing_class=tok,
        callbacks=callbacks,
        teacher_model=teacher,
    )


ALGORITHMS = ("ppo", "grpo", "reinforce", "rloo", "dr_grpo", "reinforce_plus_plus", "gspo", "cispo", "dapo")


def reward_curves(algorithms=ALGORITHMS, window: int = 5) -> None:
    """Train each preset on the toy task and print its mean reward per ``window`` steps."""
    for algorithm in algorithms:
        start = time.perf_counter()
        history = toy_trainer(algorithm).train()
        points = [
            sum(r["reward/mean"] for r in history[i : i + window]) / window for i in range(0, len(history), window)
        ]
        curve = " -> ".join(f"{p:.2f}" for p in points)
        print(f"{algorithm:<10} {curve}   ({time.perf_counter() - start:.1f}s)", flush=True)


if __name__ == "__main__":
    import transformers

    transformers.utils.logging.disable_progress_bar()
    reward_curves()
