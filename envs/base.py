"""Base class of turngym text environments.

A text env is a plain ``gymnasium.Env`` whose observations and actions are
strings.  It knows nothing about tokens, prompts or trainers.  Two extra
contracts serve credit assignment:

* prefix-resumable: ``reset(seed)`` is deterministic and :meth:`replay`
  reproduces the state reached by any action list exactly;
* privileged information (gold answers, subgoal progress, ``state_key``)
  travels in ``info`` only, never in the observation.
"""

from __future__ import annotations

import string
from typing import Any, Sequence

import gymnasium as gym

PRINTABLE = frozenset(string.printable)


def text_space(max_length: int) -> gym.spaces.Text:
    """A gymnasium Text space admitting any printable ASCII (incl. newlines)."""
    return gym.spaces.Text(max_length=max_length, min_length=0, charset="".join(sorted(PRINTABLE)))


def sanitize(text: str, max_length: int) -> str:
    """Maps text into the printable charset and length the spaces declare."""
    clean = "".join(c if c in PRINTABLE else "?" for c in text)
    return clean[:max_length]


class TextEnv(gym.Env):
    """Common plumbing: text spaces, snapshot/restore, replay."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    max_observation_length = 8192
    max_action_length = 2048

    def __init__(self, render_mode: str | None = None):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"unsupported render_mode {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = text_space(self.max_observation_length)
        self.action_space = text_space(self.max_action_length)
        self._last_obs = ""

    # subclasses implement snapshot/restore when cheap; replay always works
    def snapshot(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no snapshot fast path; use replay")

    def restore(self, snap: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no snapshot fast path; use replay")

    def replay(self, seed: int, actions: Sequence[str], options: dict | None = None
               ) -> tuple[str, dict]:
        """Resets with ``seed`` and replays ``actions``; returns the last (obs, info)."""
        obs, info = self.reset(seed=seed, options=options)
        for a in actions:
            obs, _, terminated, truncated, info = self.step(a)
            if terminated or truncated:
                break
        return obs, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None
