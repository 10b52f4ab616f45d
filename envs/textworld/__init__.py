"""ALFWorld-like household text world, generated procedurally offline."""

from .catalog import TASK_TYPES, lexicon
from .engine import NOTHING, World
from .env import TextWorldEnv
from .generator import SPLITS, Task, WorldConfig, sample_task
from .oracle import next_action, noisy_action, solve

__all__ = ["TASK_TYPES", "lexicon", "NOTHING", "World", "TextWorldEnv", "SPLITS", "Task",
           "WorldConfig", "sample_task", "next_action", "noisy_action", "solve"]
