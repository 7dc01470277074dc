"""rlhfkit: RL post-training of language models (SFT, reward models, PPO / GRPO / REINFORCE / RLOO)."""

__version__ = "0.1.0"
