"""The whole trajectory protocol in one file.

Everything that flows from rollout to credit to trainer is one of these frozen
dataclasses.  They hold token ids exactly as sampled (token-in-token-out: the
trainer never re-tokenises decoded text), so the sequence a trainer scores is
bit-identical to the one the policy produced.

Layout of one trajectory as a flat token sequence::

    turn 0: [prompt_ids (system + first observation)] [response_ids]
    turn 1: [prompt_ids (observation delta)]          [response_ids]
    ...

``prompt_ids`` of turn t > 0 holds only the *new* context tokens appended
before that turn's response (the chat-formatted observation), so storing a
trajectory is O(total tokens), not O(turns^2).  Loss mask is 0 on every prompt
token and ``response_mask`` on response tokens.

That is the full-history context mode (:attr:`ContextMode.FULL`).  In the
bounded-history mode (:attr:`ContextMode.WINDOW`, verl-agent's step-independent
rollout) every turn has a prompt of its own -- the first observation (the task),
then the last k turns' responses and the observations they produced, the last one
being the current observation -- and ``prompt_ids`` holds that whole prompt::

    turn t: [prompt_ids (head + last k exchanges)] [response_ids]     one row per turn

Both modes are read through the same methods: :meth:`Trajectory.sequences` gives
the token sequences a trainer scores (one for FULL, one per turn for WINDOW) and
:meth:`Trajectory.context_before` the exact tokens the policy saw before a turn.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Sequence

__all__ = [
    "ContextMode",
    "TokenSequence",
    "StopReason",
    "Turn",
    "Trajectory",
    "TrajectoryGroup",
    "CreditAssignment",
]


class StopReason(str, enum.Enum):
    """Why a trajectory ended."""

    ANSWERED = "answered"  # the agent gave a final answer (QA / tool tasks)
    WON = "won"  # the environment reports the goal reached
    MAX_TURNS = "max_turns"  # turn budget of the rollout or env step limit hit
    INVALID = "invalid"  # too many consecutive malformed outputs
    CONTEXT = "context"  # the token budget of the context window ran out
    ERROR = "error"  # the environment raised; the episode was cut off
    TERMINATED = "terminated"  # env ended for another reason (e.g. failure state)


class ContextMode(str, enum.Enum):
    """How the policy's context is built across turns (see the module doc)."""

    FULL = "full"  # one growing context: every earlier turn stays in it
    WINDOW = "window"  # each turn: the task + the last k turns + the current observation


@dataclass(frozen=True)
class TokenSequence:
    """One token sequence of a trajectory as a trainer scores it.

    Attributes:
        ids: the tokens, exactly as the policy saw and sampled them.
        turns: indices of the turns whose responses lie in ``ids``.
        spans: ``[start, end)`` of each of those turns' responses in ``ids``.
    """

    ids: tuple[int, ...]
    turns: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Turn:
    """One agent action and the environment's answer to it.

    Attributes:
        prompt_ids: context tokens appended before this response (see module doc).
        response_ids: tokens the policy sampled, ending with a stop token if it stopped.
        response_mask: 1 where the token is trained on, 0 where not (same length
            as ``response_ids``).
        logprobs: sampling log-probabilities of ``response_ids`` (behaviour policy).
        action_text: the parsed action sent to the env ("" when unparseable).
        observation: the env's text answer (shown to the agent in the next turn).
        reward: env reward for this step.
        info: env info of this step plus agent-side flags (``valid_format``,
            ``valid_action``, ``state_key``, ...).  Privileged keys stay here
            and never reach the prompt.
        choices: under constrained decoding (``agent.constrain_actions``), the token
            sequences the response was restricted to (a prefix trie; the response is
            one path of it): scorers restrict each token's distribution the same way
            (:func:`turngym.agents.constraints.allowed_per_position`).  Empty when the
            response was sampled from the whole vocabulary.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    action_text: str
    observation: str
    reward: float = 0.0
    info: Mapping[str, Any] = field(default_factory=dict)
    choices: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"response_ids ({n}), response_mask ({len(self.response_mask)}) and "
                f"logprobs ({len(self.logprobs)}) must have equal length"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class Trajectory:
    """A whole episode of one rollout."""

    turns: tuple[Turn, ...]
    outcome_reward: float
    success: bool
    stop_reason: StopReason
    task_id: str
    group_id: str
    policy_version: int = 0
    info: Mapping[str, Any] = field(default_factory=dict)
    context_mode: ContextMode = ContextMode.FULL
    # WINDOW mode only: element 0 is the first prompt as later windows show it, element
    # j + 1 is turn j's exchange (its response + the observation it produced) as later
    # windows show it; what a continuation from turn t needs to build its next windows.
    history: tuple[tuple[int, ...], ...] = ()

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def windowed(self) -> bool:
        return self.context_mode is ContextMode.WINDOW

    def sequences(self) -> list[TokenSequence]:
        """The sequences a trainer scores: the whole episode (FULL) or one per turn
        (WINDOW).  Every response token lies in exactly one of them."""
        if not self.windowed:
            spans = tuple(self.response_spans())
            return [TokenSequence(tuple(self.token_ids()), tuple(range(self.num_turns)), spans)]
        return [TokenSequence(t.prompt_ids + t.response_ids, (k,),
                              ((len(t.prompt_ids), t.num_tokens),))
                for k, t in enumerate(self.turns)]

    def context_before(self, turn: int) -> tuple[int, ...]:
        """The exact tokens the policy saw before turn ``turn`` responded."""
        if not 0 <= turn < self.num_turns:
            raise ValueError(f"turn {turn} outside a trajectory of {self.num_turns} turns")
        if self.windowed:
            return self.turns[turn].prompt_ids
        return tuple(self.token_ids()[: self.response_spans()[turn][0]])

    def token_ids(self) -> list[int]:
        """The flat token sequence the policy saw and produced (full-history mode; in
        window mode use :meth:`sequences`)."""
        if self.windowed:
            raise ValueError("a window-mode trajectory has one sequence per turn; "
                             "use Trajectory.sequences()")
        out: list[int] = []
        for t in self.turns:
            out.extend(t.prompt_ids)
            out.extend(t.response_ids)
        return out

    def loss_mask(self) -> list[int]:
        """1 on trained response tokens, 0 on every prompt/observation token."""
        out: list[int] = []
        for t in self.turns:
            out.extend([0] * len(t.prompt_ids))
            out.extend(t.response_mask)
        return out

    def response_spans(self) -> list[tuple[int, int]]:
        """[start, end) of each turn's response in :meth:`token_ids`."""
        spans, pos = [], 0
        for t in self.turns:
            pos += len(t.prompt_ids)
            spans.append((pos, pos + len(t.response_ids)))
            pos += len(t.response_ids)
        return spans

    def boundary_positions(self) -> list[int]:
        """Token index just after each turn's response (where the next context starts)."""
        return [end for _, end in self.response_spans()]

    def with_(self, **changes: Any) -> "Trajectory":
        return replace(self, **changes)


@dataclass(frozen=True)
class TrajectoryGroup:
    """G rollouts of the same task (same seed): the unit credit modules normalise over."""

    trajectories: tuple[Trajectory, ...]
    task_id: str

    def __post_init__(self) -> None:
        if not self.trajectories:
            raise ValueError("a TrajectoryGroup needs at least one trajectory")
        bad = {t.task_id for t in self.trajectories} - {self.task_id}
        if bad:
            raise ValueError(f"group {self.task_id!r} holds trajectories of other tasks: {bad}")

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    def outcome_rewards(self) -> list[float]:
        return [t.outcome_reward for t in self.trajectories]


@dataclass(frozen=True)
class CreditAssignment:
    """What a credit module returns for one group.

    Attributes:
        turn_advantages: for each trajectory, one advantage per turn.
        token_advantages: optional per-token override for a trajectory's
            response tokens (one entry per turn, aligned with ``response_ids``),
            used by estimators whose credit segments do not follow turns.
        metrics: scalars for logging (means over the group).
        extra: additional trajectories to train on with their turn advantages (e.g.
            branch continuations: their shared prefix is prompt, so loss mask 0).
    """

    turn_advantages: tuple[tuple[float, ...], ...]
    token_advantages: tuple[tuple[tuple[float, ...], ...] | None, ...] | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    extra: tuple[tuple["Trajectory", tuple[float, ...]], ...] = ()

    def validate(self, group: TrajectoryGroup) -> None:
        if len(self.turn_advantages) != len(group):
            raise ValueError("one advantage row per trajectory expected")
        for adv, traj in list(zip(self.turn_advantages, group)) + [(a, t) for t, a in self.extra]:
            if len(adv) != traj.num_turns:
                raise ValueError(
                    f"trajectory with {traj.num_turns} turns got {len(adv)} advantages"
                )
        if self.token_advantages is not None:
            if len(self.token_advantages) != len(group):
                raise ValueError("one token-advantage entry (or None) per trajectory expected, "
                                 f"got {len(self.token_advantages)} for {len(group)}")
            for toks, traj in zip(self.token_advantages, group):
                if toks is not None and [len(x) for x in toks] != [len(t.response_ids)
                                                                    for t in traj.turns]:
                    raise ValueError("token advantages must match every turn's response")


    def check_finite(self, estimator: str) -> None:
        """Raises if any advantage is NaN or infinite (named after ``estimator``)."""
        rows = [("turn", a) for a in self.turn_advantages]
        rows += [("extra", a) for _, a in self.extra]
        for toks in self.token_advantages or ():
            rows += [("token", x) for x in (toks or ()) if x is not None]
        for kind, vals in rows:
            if any(not math.isfinite(v) for v in vals):
                raise FloatingPointError(
                    f"credit estimator {estimator!r} produced a non-finite {kind} advantage "
                    f"({list(vals)[:8]}...); refusing to train on it")

def group_by_group_id(trajectories: Sequence[Trajectory]) -> list[TrajectoryGroup]:
    """Groups trajectories by ``group_id`` keeping first-seen order."""
    buckets: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        buckets.setdefault(t.group_id, []).append(t)
    return [TrajectoryGroup(tuple(v), v[0].task_id) for v in buckets.values()]
