"""The token context of one episode, in either context mode.

A :class:`Transcript` is fed the episode as it happens -- the first observation,
then for every turn the response token ids and the observation that followed --
and answers what the policy must see before its next response:

* ``ContextMode.FULL``: one growing context (system + first observation, then every
  response and observation).  :meth:`Transcript.pending` gives only the tokens
  added since the last response, so a KV-cached backend prefills just those.
* ``ContextMode.WINDOW``: the first observation (the task), then the last ``k``
  exchanges (a response and the observation it produced), the last of them being the
  current observation.  The window is exactly the full-history context with the older
  exchanges cut out, so chat-template structure is kept and every token in it is one
  the policy sampled or one the prompter encoded from env text: sampled text is never
  decoded and re-tokenised.

Observations come in two renderings: ``shown`` (what the agent sees when it is the
current observation, e.g. with the admissible commands appended) and ``plain``
(how it appears once it is history).  In FULL mode the context keeps observations as
they were shown; in WINDOW mode only the current one carries the extras, so a long
admissible list never piles up in the prompt.

Warm-start demonstrations are built through the same class, so SFT rows and
rollout prompts agree token for token.
"""

from __future__ import annotations

from typing import Sequence

from ..types import ContextMode
from .prompting import ChatPrompter


class Transcript:
    def __init__(self, prompter: ChatPrompter, mode: ContextMode, window_turns: int,
                 first_plain: str, first_shown: str | None = None):
        if mode is ContextMode.WINDOW and window_turns < 1:
            raise ValueError("window mode needs window_turns >= 1")
        self.prompter = prompter
        self.mode = mode
        self.k = window_turns
        self.head_shown = list(prompter.initial_ids(first_shown if first_shown is not None
                                                    else first_plain))
        self.head_plain = (self.head_shown if first_shown in (None, first_plain)
                           else list(prompter.initial_ids(first_plain)))
        self._context = list(self.head_shown)  # FULL: the whole context
        self._pending = list(self.head_shown)  # FULL: tokens not yet seen by the policy
        self.exchanges: list[list[int]] = []  # WINDOW: plain exchanges, oldest first
        self._current: list[int] = []  # WINDOW: the newest exchange as shown
        self._resume_prompt: list[int] | None = None  # WINDOW: the exact prompt to resume at

    # ------------------------------------------------------------------ resume
    @classmethod
    def resume_full(cls, prompter: ChatPrompter, context: Sequence[int]) -> "Transcript":
        """FULL mode at an exact token context (a branch point)."""
        t = cls.__new__(cls)
        t.prompter, t.mode, t.k = prompter, ContextMode.FULL, 0
        t.head_shown = t.head_plain = []
        t._context, t._pending = list(context), list(context)
        t.exchanges, t._current, t._resume_prompt = [], [], None
        return t

    @classmethod
    def resume_window(cls, prompter: ChatPrompter, window_turns: int,
                      history: Sequence[Sequence[int]], prompt: Sequence[int]) -> "Transcript":
        """WINDOW mode before turn ``len(history) - 1``: ``history`` is the plain head and
        the plain exchanges so far (``Trajectory.history[:t + 1]``) and ``prompt`` the
        exact window the policy sees now (any part of an interrupted response included)."""
        if not history:
            raise ValueError("a window-mode resume needs at least the head in its history")
        t = cls.__new__(cls)
        t.prompter, t.mode, t.k = prompter, ContextMode.WINDOW, window_turns
        t.head_plain = list(history[0])
        t.head_shown = list(prompt) if len(history) == 1 else t.head_plain
        t.exchanges = [list(x) for x in history[1:]]
        t._context, t._pending, t._current = [], [], []
        t._resume_prompt = list(prompt)
        return t

    # ------------------------------------------------------------------ queries
    def prompt(self) -> list[int]:
        """Every token the policy sees before its next response."""
        if self.mode is ContextMode.FULL:
            return list(self._context)
        if self._resume_prompt is not None:
            return list(self._resume_prompt)
        if not self.exchanges:
            return list(self.head_shown)
        older = self.exchanges[-self.k:-1] if self.k > 1 else []
        out = list(self.head_plain)
        for x in older:
            out.extend(x)
        out.extend(self._current)
        return out

    def pending(self) -> list[int]:
        """FULL mode: the tokens added since the policy last saw the context."""
        return list(self._pending)

    def history(self) -> tuple[tuple[int, ...], ...]:
        """WINDOW mode: the plain head and plain exchanges (``Trajectory.history``)."""
        return (tuple(self.head_plain),) + tuple(tuple(x) for x in self.exchanges)

    # ------------------------------------------------------------------ updates
    def add(self, response: Sequence[int], plain: str, shown: str | None = None,
            prefix: Sequence[int] = ()) -> None:
        """Records one turn: the response the policy sampled (``prefix``: the part of an
        interrupted response that was already in the prompt) and the observation it
        produced, rendered ``plain`` and ``shown``."""
        full = list(prefix) + list(response)
        obs = self.prompter.observation_ids
        shown_ids = list(obs(shown if shown is not None else plain, full))
        if self.mode is ContextMode.FULL:
            self._context.extend(response)  # the prefix is in the context already
            self._context.extend(shown_ids)
            self._pending = shown_ids
            return
        self._resume_prompt = None
        plain_ids = shown_ids if shown in (None, plain) else list(obs(plain, full))
        self.exchanges.append(full + plain_ids)
        self._current = full + shown_ids
