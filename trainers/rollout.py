"""Rollout phase: one RL step's task groups from the current policy.

Task seeds and the sampler stream of step ``k`` are a pure function of (run seed, k),
so a resumed run and a run compared against it see the same tasks and random draws.
"""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, RolloutConfig, rollout
from ..types import TrajectoryGroup
from .distributed import World


def step_tasks(cfg: DictConfig, step: int, world: World) -> tuple[list[int], int]:
    """(this rank's task seeds, the sampler seed) of RL step ``step``."""
    rng = np.random.default_rng([cfg.seed, step])
    sampler_seed = int(rng.integers(2**62)) + world.rank
    hi = cfg.rl.task_pool if cfg.rl.task_pool else 2**31 - 1
    seeds = world.shard(rng.integers(0, hi, size=cfg.rl.tasks_per_step).tolist())
    return seeds, sampler_seed


def collect_groups(policy, prompter: ChatPrompter, pool: EnvPool, rcfg: RolloutConfig,
                   cfg: DictConfig, step: int, world: World) -> list[TrajectoryGroup]:
    """``rl.group_size`` episodes of each of this rank's tasks for step ``step``."""
    seeds, sampler_seed = step_tasks(cfg, step, world)
    policy.generator.manual_seed(sampler_seed)
    if not seeds:
        return []
    return rollout(policy, prompter, pool, seeds, cfg.rl.group_size, rcfg, policy_version=step)
