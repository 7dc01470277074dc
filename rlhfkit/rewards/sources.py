"""The reward sources of a run, from what the user passes: callables, registered names or import
paths (``functions.get_reward_function``), reward-model directories or Hub ids and ``ScalarModel`` objects
(``reward_model.RewardModelFunction``), combined with their weights into one ``RewardFunctions``."""

from __future__ import annotations

import os
from pathlib import Path

from ..data.encode import encode_pair
from ..models import ScalarModel, freeze, load_tokenizer
from ..models.sources import is_hub_id, quiet_weight_bars
from .functions import REWARD_FUNCTIONS, RewardFunction, RewardFunctions, get_reward_function
from .reward_model import RewardModelFunction


def build_rewards(reward_funcs, reward_weights, tokenizer, device=None) -> RewardFunctions:
    """Reward sources: callables, registered names / import paths, reward models — a directory, a Hub id
    ``owner/name`` that names no registered function (loaded as TRL loads a reward model given by its id:
    a sequence classifier, offline from the Hugging Face cache) — or ``ScalarModel`` objects (scored with
    their own tokenizer, or the policy's for objects)."""
    if reward_funcs is None:
        raise ValueError("reward_funcs is required: reward functions and/or reward-model directories")
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    resolved, names = [], []
    for i, spec in enumerate(funcs):
        fn: RewardFunction
        if isinstance(spec, ScalarModel):
            fn = RewardModelFunction(freeze(spec), tokenizer, encode=encode_pair, name=f"reward_model_{i}")
        elif isinstance(spec, (str, os.PathLike)) and (Path(spec).is_dir() or _names_a_hub_model(spec)):
            with quiet_weight_bars():
                rm = freeze(ScalarModel.from_pretrained(spec)).to(device or "cpu")
            name = (
                Path(spec).name if Path(spec).name != "final" else Path(spec).parent.name
            )  # run/final -> run; owner/x -> x
            fn = RewardModelFunction(rm, load_tokenizer(spec, "reward model"), encode=encode_pair, name=name)
        else:
            fn = get_reward_function(spec)
        resolved.append(fn)
        if isinstance(spec, str) and not isinstance(fn, RewardModelFunction):  # the name the user wrote
            names.append(spec.replace(":", ".").rsplit(".", 1)[-1])
        else:
            names.append(getattr(fn, "__name__", None) or type(fn).__name__)
    return RewardFunctions(resolved, reward_weights, names)


def _names_a_hub_model(spec) -> bool:
    """A string of the form ``owner/name`` that no registered reward function or import path claims."""
    return (
        isinstance(spec, str) and "/" in spec and ":" not in spec and spec not in REWARD_FUNCTIONS and is_hub_id(spec)
    )
