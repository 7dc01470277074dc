"""TRL-compatible classes: a TRL script runs with ``from trl import ...`` changed to
``from rlhfkit.trl import ...``.

Each config is TRL 1.16's (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's config, and the trainers run
rlhfkit's own loops. TRL fields rlhfkit does not support are refused in one line naming the field;
none is ignored (``arguments.py``). The docs page "Coming from TRL" lists the mapping.

A TRL user's habits: the renamed fields are listed in ``rlhfkit/config/trl_names.py`` (the command
line's "did you mean" answers a TRL name with rlhfkit's; ``tests/trl/test_trl_names.py`` checks each
entry against ``to_rlhfkit``); ``trainer.state.log_history`` and callbacks get TRL's metric names
beside rlhfkit's (``metrics.py``, ``callbacks.py``); a rerun writes into an existing ``output_dir``
as TRL does, replacing only rlhfkit's own run files (``output_dir.py``).
"""

from .distillation import DistillationConfig, DistillationTrainer
from .dpo import DPOConfig, DPOTrainer
from .grpo import GRPOConfig, RLOOConfig
from .kto import KTOConfig, KTOTrainer
from .reward import RewardConfig, RewardTrainer
from .rl_trainers import GRPOTrainer, RLOOTrainer
from .sft import SFTConfig, SFTTrainer

__all__ = [
    "DPOConfig",
    "DPOTrainer",
    "DistillationConfig",
    "DistillationTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "KTOConfig",
    "KTOTrainer",
    "RLOOConfig",
    "RLOOTrainer",
    "RewardConfig",
    "RewardTrainer",
    "SFTConfig",
    "SFTTrainer",
]
