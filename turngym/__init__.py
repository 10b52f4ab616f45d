"""turngym: agentic-RL gym for multi-turn LLM agents with turn-level credit assignment."""

from . import envs as _envs  # noqa: F401  (registers the bundled gymnasium envs)
from .types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn

__version__ = "0.1.0"
__all__ = ["Turn", "Trajectory", "TrajectoryGroup", "CreditAssignment", "StopReason"]
