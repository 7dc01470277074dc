"""TRL-compatible classes: a TRL script runs with ``from trl import ...`` changed to
``from rlhfkit.trl import ...``.

Each config is TRL 1.16's (``transformers.TrainingArguments`` plus TRL's fields, defaults and
checks); ``to_rlhfkit`` is the one table that maps it to rlhfkit's config, and the trainers run
rlhfkit's own loops. TRL fields rlhfkit does not support are refused in one line naming the field;
none is ignored (``arguments.py``). The docs page "Coming from TRL" lists the mapping.
"""

from .dpo import DPOConfig, DPOTrainer
from .grpo import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from .reward import RewardConfig, RewardTrainer
from .sft import SFTConfig, SFTTrainer

__all__ = ["DPOConfig", "DPOTrainer", "GRPOConfig", "GRPOTrainer", "RLOOConfig", "RLOOTrainer", "RewardConfig",
           "RewardTrainer", "SFTConfig", "SFTTrainer"]
