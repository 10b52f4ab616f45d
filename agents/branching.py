"""Resume episodes at an exact prefix and sample continuations.

A *branch point* is (task seed, the env actions taken so far, the exact token
context the policy saw).  The env is rebuilt by deterministic reset + replay of
the actions through the same gymnasium wrapper stack (so step limits count the
same), and the policy continues from the identical token prefix: tokens go in as
they were sampled, nothing is re-tokenised.  Used by the credit-quality probe
(Monte-Carlo values of states) and by branch-contrast credit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..types import Trajectory
from .policy import Policy
from .prompting import ChatPrompter
from .rollout import EnvPool, RolloutConfig, _clean_info, _Episode, run_episodes, to_trajectory


@dataclass(frozen=True)
class BranchPoint:
    task_seed: int
    actions: tuple[str, ...]
    context: tuple[int, ...]  # token ids up to (excluding) the next response
    turn: int  # index of the next turn
    prior_reward: float = 0.0
    group_id: str = ""
    task_id: str = ""
    # tokens of the interrupted response already in ``context`` (mid-response branch):
    # the env receives them + the continuation as one action
    response_prefix: tuple[int, ...] = ()


def branch_point(traj: Trajectory, turn: int) -> BranchPoint:
    """The state trajectory ``traj`` was in just before its turn ``turn`` responded."""
    if not 0 <= turn < traj.num_turns:
        raise ValueError(f"turn {turn} outside a trajectory of {traj.num_turns} turns")
    start = traj.response_spans()[turn][0]
    return BranchPoint(int(traj.info["task_seed"]),
                       tuple(t.action_text for t in traj.turns[:turn]),
                       tuple(traj.token_ids()[:start]), turn,
                       float(sum(t.reward for t in traj.turns[:turn])),
                       traj.group_id, traj.task_id)


def branch_point_at(traj: Trajectory, position: int) -> BranchPoint:
    """A branch *inside* a response: the context is ``token_ids()[:position]``, where
    ``position`` indexes a response token of some turn; the policy re-samples that
    token and everything after it."""
    for t, (start, end) in enumerate(traj.response_spans()):
        if start <= position < end:
            bp = branch_point(traj, t)
            ids = traj.token_ids()
            return BranchPoint(bp.task_seed, bp.actions, tuple(ids[:position]), t,
                               bp.prior_reward, bp.group_id, bp.task_id,
                               tuple(ids[start:position]))
    raise ValueError(f"token {position} is not a response token of the trajectory")


def continue_from(policy: Policy, prompter: ChatPrompter, pool: EnvPool,
                  points: Sequence[BranchPoint], cfg: RolloutConfig, policy_version: int = 0,
                  progress: Callable[[int], None] | None = None) -> list[Trajectory]:
    """One continuation per point (repeat a point for several).  Each returned
    trajectory holds only the new turns; its outcome includes ``prior_reward``."""
    envs = pool.take(len(points))
    episodes = []
    try:
        for env, bp in zip(envs, points):
            obs, info = env.reset(seed=bp.task_seed)
            info0 = _clean_info(info, cfg.keep_admissible)
            info0["first_observation"] = obs
            for a in bp.actions:
                obs, _, term, trunc, info = env.step(a)
                if term or trunc:
                    raise ValueError(f"replaying {len(bp.actions)} actions of task "
                                     f"{bp.task_seed} ended the episode early")
            ctx = list(bp.context)
            e = _Episode(env, bp.task_seed, bp.group_id, ctx, list(ctx),
                         bp.task_id or str(info0.get("task_id", bp.task_seed)), info0=info0,
                         start_turn=bp.turn, response_prefix=list(bp.response_prefix))
            e.total_reward = bp.prior_reward
            episodes.append(e)
        run_episodes(policy, prompter, episodes, cfg, progress)
    finally:
        pool.give(envs)
    return [to_trajectory(e, policy_version) for e in episodes]
