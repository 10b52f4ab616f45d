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

import random
import string
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

PRINTABLE = frozenset(string.printable)


def text_space(max_length: int) -> gym.spaces.Text:
    """A gymnasium Text space admitting any printable ASCII (incl. newlines)."""
    return gym.spaces.Text(max_length=max_length, min_length=0, charset="".join(sorted(PRINTABLE)))


def sanitize(text: str, max_length: int) -> str:
    """Maps text into the printable charset and length the spaces declare."""
    clean = "".join(c if c in PRINTABLE else "?" for c in text)
    return clean[:max_length]


# ---------------------------------------------------------------------------------------
# Optional capabilities.  An env (``env.unwrapped``) opts into a trainer feature by
# implementing the method; trainers and credit modules ask ``isinstance(env, Protocol)``
# and never probe with ``hasattr``.  Each Protocol says which feature needs it.
# ---------------------------------------------------------------------------------------


@runtime_checkable
class HasOracle(Protocol):
    """An expert for warm-start demonstrations (``warmstart.enabled``)."""

    def oracle_action(self) -> str:
        """The expert's next action in the current state (a full action string as the
        env's ``step`` takes it, e.g. ``"go to cabinet 1"``)."""
        ...


@runtime_checkable
class HasVocabulary(Protocol):
    """Words the env can print; tiny word-level tokenizers are fit on them."""

    def vocabulary(self) -> list[str]: ...


@runtime_checkable
class HasEntityPhrases(Protocol):
    """Multi-word names (``"kredas hufel"``) a tiny tokenizer may fuse into one token."""

    def entity_phrases(self) -> list[str]: ...


@runtime_checkable
class HasLMCorpus(Protocol):
    """Text for a language-modelling pass before SFT (``warmstart.lm_epochs > 0``)."""

    def lm_corpus(self) -> Iterable[str]: ...


@runtime_checkable
class HasRenaming(Protocol):
    """Interchangeable names for warm-start augmentation (``warmstart.rename > 0``):
    ``renamer(rng, texts)`` draws one consistent renaming for the texts of one
    demonstration and returns it as a text -> text function; applied to each of them it
    gives a demonstration the env could have produced up to names, so a policy learns to
    copy names rather than memorise them."""

    def renamer(self, rng: random.Random, texts: Sequence[str]) -> Callable[[str], str]: ...


@runtime_checkable
class Snapshottable(Protocol):
    """A cheap copy of the env state; ``restore`` returns to it exactly (a fast path next
    to :meth:`TextEnv.replay`, which always works)."""

    def snapshot(self) -> Any: ...

    def restore(self, snap: Any) -> None: ...


@runtime_checkable
class BatchedSteps(Protocol):
    """One rollout turn's expensive work for many envs at once (e.g. one retriever call
    for every search query).  A classmethod; ``step`` must still work alone, and the
    rollout treats a failure here as "not prefetched"."""

    @classmethod
    def prepare_steps(cls, envs: Sequence[Any], actions: Sequence[str]) -> None: ...


class TextEnv(gym.Env):
    """Common plumbing: text spaces and replay (every text env is prefix-resumable)."""

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
