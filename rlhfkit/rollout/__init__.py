"""Generation engines behind one small interface (``RolloutEngine``); their registry (what
``RLConfig.rollout_engine`` may name) is the config layer's: ``rlhfkit.config.engines``.

The names below load on first use (PEP 562), so importing the package loads neither torch nor
transformers."""

import importlib

_HOMES = {
    "HFEngine": "hf",
    "Rollout": "base",
    "RolloutEngine": "base",
    "SamplingParams": "base",
    "build_rollout": "base",
    "concat_rollouts": "base",
    "decode_completions": "base",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "build_rollout",
    "concat_rollouts",
    "decode_completions",
]
