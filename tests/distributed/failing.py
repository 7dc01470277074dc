"""A reward function that raises on rank 1 only (the failing-rank test)."""

import os


def fail_on_rank_1(prompts, completions, **columns):
    if os.environ.get("RANK") == "1":
        raise RuntimeError("boom on rank 1")
    return [c.count("a") / max(1, len(c)) for c in completions]
