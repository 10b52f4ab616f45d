"""``turngym/TextWorld-v0``: the ALFWorld-like household env."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from ..base import TextEnv, sanitize
from .catalog import lexicon
from .engine import World
from .generator import SPLITS, Task, WorldConfig, sample_task
from .names import name_corpus, renamer
from .oracle import next_action, noisy_action


def make_world_config(world: WorldConfig | dict | None) -> WorldConfig:
    if world is None:
        return WorldConfig()
    if isinstance(world, WorldConfig):
        return world
    known = {f.name for f in fields(WorldConfig)}
    unknown = set(world) - known
    if unknown:
        raise ValueError(f"unknown world options {sorted(unknown)}; known: {sorted(known)}")
    world = dict(world)
    if "task_types" in world:
        world["task_types"] = tuple(world["task_types"])
    return WorldConfig(**world)


class TextWorldEnv(TextEnv):
    """Household tasks in ALFWorld's grammar.

    ``reset(seed=i)`` starts task number ``i`` of the split (so ``seed`` names
    the task); ``options={"task_index": i}`` does the same explicitly.  Reward is
    1 on success and 0 otherwise; an episode ends on success or after
    ``max_turns`` actions (truncation; ALFWorld's limit is 50).

    ``info`` carries privileged keys for credit modules only: ``admissible_commands``,
    ``progress`` (subgoal facts), ``state_key``, ``task_type``, ``won``; and
    ``inventory`` (what the ``inventory`` command would print, free of a turn), which
    ``agent.show_inventory`` shows the agent.

    Once an episode has terminated or been truncated, ``step`` raises until ``reset``
    (as the other turngym envs do; stepping on would keep paying the win's reward).
    """

    def __init__(self, split: str = "train", max_turns: int = 50,
                 world: WorldConfig | dict | None = None, render_mode: str | None = None):
        super().__init__(render_mode)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.split = split
        self.max_turns = max_turns
        self.world_config = make_world_config(world)
        self.world: World | None = None

    @property
    def task(self) -> Task:
        if self.world is None:
            raise RuntimeError("call reset() first")
        return self.world.task

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        index = options.get("task_index", seed)
        if index is None:
            index = int(self.np_random.integers(0, 2**31 - 1))
        self.world = World(sample_task(self.world_config, self.split, int(index)))
        obs = sanitize(self.world.intro(), self.max_observation_length)
        self._last_obs = obs
        return obs, self._info(valid=True)

    def step(self, action: str):
        if self.world is None:
            raise RuntimeError("call reset() before step()")
        if self.world.state.won or self.world.state.steps >= self.max_turns:
            raise RuntimeError("episode is over (terminated or truncated); call reset()")
        if not isinstance(action, str):
            action = str(action)
        feedback, valid = self.world.step(action[: self.max_action_length])
        won = self.world.state.won
        reward = 1.0 if won else 0.0
        truncated = not won and self.world.state.steps >= self.max_turns
        obs = sanitize(feedback, self.max_observation_length)
        self._last_obs = obs
        return obs, reward, won, truncated, self._info(valid=valid)

    def _info(self, valid: bool) -> dict[str, Any]:
        w = self.world
        assert w is not None
        return {
            "task_id": w.task.task_id,
            "task_type": w.task.task_type,
            "valid_action": valid,
            "won": w.state.won,
            "admissible_commands": w.admissible(),
            "inventory": w.inventory(),
            "progress": w.progress(),
            "state_key": w.state_key(),
            "steps": w.state.steps,
        }

    # ---------------------------------------------------------------- expert
    def oracle_action(self, rng=None, epsilon: float = 0.0) -> str:
        """Expert action for warm-start demos; with prob. ``epsilon`` a random admissible one."""
        if self.world is None:
            raise RuntimeError("call reset() first")
        if epsilon > 0 and rng is not None:
            return noisy_action(self.world, rng, epsilon)
        return next_action(self.world)

    @staticmethod
    def vocabulary() -> list[str]:
        """Words this env can print (tokenizer fitting for tiny models)."""
        return lexicon() + ["go", "to", "open", "close", "take", "from", "move", "heat", "cool",
                            "clean", "with", "use", "examine", "inventory", "look", "put", "in",
                            "on", "hot", "some", "two", "them", "it", "and", "under", "the"]

    @staticmethod
    def lm_corpus() -> list[str]:
        """Every name of the catalog in the engine's phrasing, other slots at random
        (``warmstart.lm_epochs``; see ``names.py``): the words a pretrained LM would know,
        with no layout or task in them."""
        return name_corpus()

    @staticmethod
    def renamer(rng: random.Random, texts: Sequence[str]) -> Callable[[str], str]:
        """One consistent, order-keeping renaming of the receptacle types and name
        numbers in ``texts`` (``warmstart.rename``; see ``names.py``)."""
        return renamer(rng, texts)

    def snapshot(self):
        if self.world is None:
            raise RuntimeError("call reset() first")
        return self.world.state.copy()

    def restore(self, snap) -> None:
        if self.world is None:
            raise RuntimeError("call reset() with the same task before restore()")
        self.world.state = snap.copy()
