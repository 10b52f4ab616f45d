"""Segments and role labels for role-typed credit (TRIAGE).

A trajectory is cut at its environment-facing actions: every turn whose output
reached the env as an action closes a segment, and turns the env never saw
(malformed output) join the segment of the next real action.  A judge gives
each segment one of four roles:

* ``decisive_progress``: the task moved measurably closer to done (a subgoal, a
  gold passage, the right answer);
* ``useful_exploration``: nothing solved, but a new state or new information;
* ``no_progress_infrastructure``: bookkeeping, repeats, invalid or no-op actions;
* ``regression``: the task moved further away (a wrong final answer, an undone
  subgoal).

:class:`OracleJudge` labels from the env's privileged info (``progress``,
``won``, ``state_key``, ``answered``); it needs no model and measures how
accurate another judge is (``turngym judge-eval``, and the ``spot_check`` knob of
``role_judge``; segments without that info are told by :func:`has_oracle_info`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from ..types import Trajectory


class Role(str, enum.Enum):
    DECISIVE_PROGRESS = "decisive_progress"
    USEFUL_EXPLORATION = "useful_exploration"
    NO_PROGRESS_INFRASTRUCTURE = "no_progress_infrastructure"
    REGRESSION = "regression"


ROLE_NAMES = tuple(r.value for r in Role)


@dataclass(frozen=True)
class Segment:
    """Turns ``[start, end)`` of trajectory ``traj``; the last one is env-facing unless
    the trajectory ended on malformed output."""

    traj_index: int
    start: int
    end: int
    task: str
    actions: tuple[str, ...]
    observation_before: str
    observation_after: str
    info_before: Mapping[str, Any]
    info_after: Mapping[str, Any]
    seen_state_keys: frozenset  # states visited before this segment


def _env_facing(turn) -> bool:
    return bool(turn.info.get("valid_format", True))


def segments_of(traj: Trajectory, traj_index: int = 0) -> list[Segment]:
    out, start = [], 0
    seen = {traj.info.get("state_key")}
    task = str(traj.info.get("first_observation", ""))
    for t, turn in enumerate(traj.turns):
        if _env_facing(turn) or t == traj.num_turns - 1:
            before = traj.turns[start - 1] if start > 0 else None
            out.append(Segment(
                traj_index, start, t + 1, task,
                tuple(x.action_text for x in traj.turns[start:t + 1]),
                before.observation if before else task, turn.observation,
                before.info if before else traj.info, turn.info, frozenset(seen)))
            seen.update(x.info.get("state_key") for x in traj.turns[start:t + 1])
            start = t + 1
    return out


class Judge(Protocol):
    def label(self, segments: Sequence[Segment]) -> tuple[list[Role], int]:
        """Roles for the segments and the number of judge errors (fallback labels)."""
        ...


class OracleJudge:
    """Labels from privileged env info; deterministic, no model."""

    def label(self, segments: Sequence[Segment]) -> tuple[list[Role], int]:
        return [oracle_role(s) for s in segments], 0


ORACLE_INFO_KEYS = ("progress", "state_key")


def has_oracle_info(s: Segment) -> bool:
    """Whether the env gave what :func:`oracle_role` reads: task progress and a state key
    after the segment (the text worlds and search QA do; an env without them would get
    "no progress" for everything, which is no reference to measure a judge against)."""
    return all(k in s.info_after for k in ORACLE_INFO_KEYS)


def oracle_role(s: Segment) -> Role:
    after, before = s.info_after, s.info_before
    if "env_error" in after:  # the env raised: nothing was learnt about the task
        return Role.NO_PROGRESS_INFRASTRUCTURE
    if after.get("won"):
        return Role.DECISIVE_PROGRESS
    if after.get("answered"):
        return Role.REGRESSION  # answered, and wrongly
    p0, p1 = len(before.get("progress") or ()), len(after.get("progress") or ())
    if p1 > p0:
        return Role.DECISIVE_PROGRESS
    if p1 < p0:
        return Role.REGRESSION
    valid = bool(after.get("valid_action", True)) and bool(after.get("valid_format", True))
    if valid and after.get("state_key") not in s.seen_state_keys:
        return Role.USEFUL_EXPLORATION
    return Role.NO_PROGRESS_INFRASTRUCTURE
