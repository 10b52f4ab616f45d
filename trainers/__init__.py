"""Trainers: warm-start SFT, PPO-clip/GRPO policy gradient, checkpoints, metrics, eval."""
