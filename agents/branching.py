"""Resume episodes at an exact prefix and sample continuations.

A *branch point* is (task seed, the env actions taken so far, the exact token
context the policy saw).  The env is rebuilt by deterministic reset + replay of
the actions through the same gymnasium wrapper stack (so step limits count the
same), and the policy continues from the identical token prefix: tokens go in as
they were sampled, nothing is re-tokenised.  In window mode the point also carries
the trajectory's history exchanges, from which the continuation builds its later
windows exactly as the original rollout would have.  Used by the credit-quality
probe (Monte-Carlo values of states) and by branch-contrast credit.

An env that raises while replaying (a retriever gone away) ends that continuation as
an error episode (``StopReason.ERROR``, no turns), as it would end a rollout; callers
leave those out of their values.  A replay that ends the episode early means the env is
not deterministic under reset(seed) + replay: :class:`ReplayDiverged` is raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..types import ContextMode, StopReason, Trajectory
from .constraints import ADMISSIBLE_KEY
from .policy import Policy
from .prompting import ChatPrompter
from .rollout import Episode, EnvPool, RolloutConfig, open_episode, run_episodes, to_trajectory
from .transcript import Transcript


@dataclass(frozen=True)
class BranchPoint:
    task_seed: int
    actions: tuple[str, ...]
    context: tuple[int, ...]  # token ids up to (excluding) the next response token
    turn: int  # index of the next turn
    prior_reward: float = 0.0
    group_id: str = ""
    task_id: str = ""
    # tokens of the interrupted response already in ``context`` (mid-response branch):
    # the env receives them + the continuation as one action
    response_prefix: tuple[int, ...] = ()
    context_mode: ContextMode = ContextMode.FULL
    history: tuple[tuple[int, ...], ...] = ()  # WINDOW: Trajectory.history[:turn + 1]
    invalid_streak: int = 0  # malformed turns in a row just before ``turn``


def branch_point(traj: Trajectory, turn: int) -> BranchPoint:
    """The state trajectory ``traj`` was in just before its turn ``turn`` responded."""
    return branch_point_at(traj, turn, 0)


def branch_point_at(traj: Trajectory, turn: int, offset: int) -> BranchPoint:
    """A branch inside turn ``turn``'s response: the policy keeps its first ``offset``
    tokens and re-samples token ``offset`` and everything after it (``offset`` 0: the
    whole turn is re-sampled)."""
    if not 0 <= turn < traj.num_turns:
        raise ValueError(f"turn {turn} outside a trajectory of {traj.num_turns} turns")
    resp = traj.turns[turn].response_ids
    if not 0 <= offset < max(1, len(resp)):
        raise ValueError(f"offset {offset} outside turn {turn}'s {len(resp)} response tokens")
    prefix = tuple(resp[:offset])
    return BranchPoint(int(traj.info["task_seed"]),
                       tuple(t.action_text for t in traj.turns[:turn]),
                       traj.context_before(turn) + prefix, turn,
                       float(sum(t.reward for t in traj.turns[:turn])),
                       traj.group_id, traj.task_id, prefix, traj.context_mode,
                       traj.history[: turn + 1] if traj.windowed else (),
                       int(traj.turns[turn - 1].info.get("invalid_streak", 0)) if turn else 0)


def continue_from(policy: Policy, prompter: ChatPrompter, pool: EnvPool,
                  points: Sequence[BranchPoint], cfg: RolloutConfig, policy_version: int = 0,
                  progress: Callable[[int], None] | None = None) -> list[Trajectory]:
    """One continuation per point (repeat a point for several).  Each returned
    trajectory holds only the new turns; its outcome includes ``prior_reward``."""
    envs = pool.take(len(points))
    episodes = []
    try:
        for env, bp in zip(envs, points):
            if ContextMode(bp.context_mode) is not cfg.context_mode:
                raise ValueError(f"branch point in {bp.context_mode} mode, rollout config in "
                                 f"{cfg.context_mode} mode")
            transcript = (Transcript.resume_full(prompter, bp.context)
                          if cfg.context_mode is ContextMode.FULL else
                          Transcript.resume_window(prompter, cfg.window_turns, bp.history,
                                                   bp.context))
            try:
                e = _replay(env, bp, prompter, cfg)
            except _EnvFailed as failed:  # as in a rollout: it ends this episode only
                e = Episode(env, bp.task_seed, bp.group_id, transcript, done=True,
                            stop=StopReason.ERROR, info0={"env_error": repr(failed.__cause__)})
            e.transcript = transcript
            e.task_id = bp.task_id or e.task_id
            e.start_turn, e.response_prefix = bp.turn, list(bp.response_prefix)
            e.total_reward = bp.prior_reward
            e.invalid_streak = bp.invalid_streak  # max_invalid_streak cuts as it would have
            episodes.append(e)
        run_episodes(policy, prompter, episodes, cfg, progress)
    finally:
        pool.give(envs)
    return [to_trajectory(e, policy_version) for e in episodes]


class ReplayDiverged(ValueError):
    """Replaying a branch point's actions did not reach its state (the env is not
    deterministic under reset(seed) + replay): a bug to report, never an episode."""


class _EnvFailed(Exception):
    """The env itself raised (reset or step) while a prefix was replayed."""


def _replay(env, bp: BranchPoint, prompter: ChatPrompter, cfg: RolloutConfig) -> Episode:
    try:
        obs, info = env.reset(seed=int(bp.task_seed))
    except Exception as exc:  # any failure of the env itself, never of our own code
        raise _EnvFailed from exc
    e = open_episode(env, bp.task_seed, bp.group_id, prompter, cfg, obs, info)
    for a in bp.actions:
        try:
            _, _, term, trunc, info = env.step(a)
        except Exception as exc:
            raise _EnvFailed from exc
        e.commands = tuple(info.get(ADMISSIBLE_KEY) or ())
        if term or trunc:
            raise ReplayDiverged(f"replaying {len(bp.actions)} actions of task "
                                 f"{bp.task_seed} ended the episode early")
    return e
