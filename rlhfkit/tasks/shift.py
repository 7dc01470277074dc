"""The quickstart's synthetic task, with a hidden oracle that plays the human.

A prompt is a short random word over ``a``–``h`` followed by ``=``; the good response shifts every
letter by one (``abc=`` → ``bcd``) and stops. The oracle scores a completion by the share of
positions that match the shifted word, over the longer of the two lengths, so both wrong letters
and not stopping cost. Demonstrations are noisy: each letter is replaced by a random one with
probability ``noise``, so SFT alone learns an imperfect policy that RL can improve.
"""

from __future__ import annotations

import random

LETTERS = "abcdefgh"
SHIFT = {c: LETTERS[(i + 1) % len(LETTERS)] for i, c in enumerate(LETTERS)}


def target(prompt: str) -> str:
    """The ideal response to ``prompt`` (the word before ``=``, every letter shifted by one)."""
    return "".join(SHIFT[c] for c in prompt.rstrip("=") if c in SHIFT)


def oracle_score(prompt: str, completion: str) -> float:
    """Matching positions / max(len(target), len(completion)), in [0, 1]."""
    want = target(prompt)
    if not want and not completion:
        return 1.0
    hits = sum(a == b for a, b in zip(want, completion))
    return hits / max(len(want), len(completion))


def oracle_reward(prompts, completions, **columns) -> list[float]:
    """``oracle_score`` in TRL's reward-function shape (the "human" of the quickstart): prompts and
    completions as text, or as chat messages (the prompt's last message, the completion's assistant turn)."""
    from ..data.encode import completion_text

    return [oracle_score(completion_text(p), completion_text(c)) for p, c in zip(prompts, completions)]


def make_prompts(n: int, seed: int, min_len: int = 3, max_len: int = 6) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(LETTERS) for _ in range(rng.randint(min_len, max_len))) + "=" for _ in range(n)]


def make_sft_rows(n: int, seed: int, noise: float = 0.3) -> list[dict]:
    """Noisy demonstrations ``{"prompt", "completion"}``: each letter wrong with prob ``noise``."""
    rng = random.Random(seed + 1)
    rows = []
    for prompt in make_prompts(n, seed):
        completion = "".join(rng.choice(LETTERS) if rng.random() < noise else c for c in target(prompt))
        rows.append({"prompt": prompt, "completion": completion})
    return rows


def label_pairs(prompts: list[str], completions_a: list[str], completions_b: list[str]) -> list[dict]:
    """Oracle-labelled preference pairs; ties and identical completions are dropped."""
    rows = []
    for p, a, b in zip(prompts, completions_a, completions_b):
        sa, sb = oracle_score(p, a), oracle_score(p, b)
        if a and b and a != b and sa != sb:
            chosen, rejected = (a, b) if sa > sb else (b, a)
            rows.append({"prompt": p, "chosen": chosen, "rejected": rejected})
    return rows


def corrupt(word: str, rng: random.Random, noise: float) -> str:
    """``word`` with each letter replaced with prob ``noise``, and sometimes a letter dropped or added."""
    out = "".join(rng.choice(LETTERS) if rng.random() < noise else c for c in word)
    roll = rng.random()
    if roll < noise / 3 and len(out) > 1:
        out = out[:-1]
    elif roll > 1 - noise / 3:
        out += rng.choice(LETTERS)
    return out


def make_synthetic_pairs(n: int, seed: int) -> list[dict]:
    """Oracle-labelled pairs of corrupted ideal responses at random noise levels: broad coverage of
    good and bad completions, so the reward model also judges what the RL policy may drift to."""
    rng = random.Random(seed + 2)
    prompts = make_prompts(n, seed + 3)
    a = [corrupt(target(p), rng, rng.random()) for p in prompts]
    b = [corrupt(target(p), rng, rng.random()) for p in prompts]
    return label_pairs(prompts, a, b)


def write_task_files(out_dir, seed: int = 0) -> dict[str, str]:
    """The shift task as files for the recipes: a tiny untrained model, SFT demonstrations,
    oracle-labelled preference pairs and RL prompts (train and eval). Returns name -> path."""
    import json
    from pathlib import Path

    from .tiny import char_tokenizer, save_tiny_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "sft.jsonl": make_sft_rows(2000, seed),
        "pairs.jsonl": make_synthetic_pairs(4000, seed),
        "prompts.jsonl": [{"prompt": p} for p in make_prompts(2000, seed + 3)],
        "eval_prompts.jsonl": [{"prompt": p} for p in make_prompts(128, seed + 2)],
    }
    paths = {}
    for name, rows in files.items():
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[name] = str(out / name)
    paths["model"] = save_tiny_model(
        out / "model", char_tokenizer(alphabet=LETTERS + "="), hidden_size=64, layers=2, seed=seed
    )
    return paths


def _register() -> None:
    from ..rewards import REWARD_FUNCTIONS, register_reward_function

    if "shift_oracle" not in REWARD_FUNCTIONS:
        register_reward_function("shift_oracle")(oracle_reward)


_register()
