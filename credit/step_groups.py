"""GiGPO step groups: episode-level GRPO plus a step-level advantage from turns that
acted in the *same* environment state across the rollout group.

Each turn t of trajectory i acted in state ``key_{i,t}`` (the env's history-free
``state_key`` before the action: the reset info's for t = 0, turn t-1's after).
Its step return is ``R_{i,t} = sum_{k>=t} gamma^(k-t) r_{i,k}`` over env rewards.
Turns sharing a key form a step group (anchor state); within it::

    A^step_{i,t} = (R_{i,t} - mean_group R) / (std_group R + eps)   (0 for singleton groups)
    A_{i,t}      = A^GRPO_i + step_weight * A^step_{i,t}

Grouping is one ``np.unique`` + ``bincount`` pass over all turns of the group: no
pairwise comparisons.

Knobs (:class:`StepGroupsParams`): ``gamma`` (0.95), ``step_weight`` (1.0),
``std_normalize`` (True), ``eps`` (1e-6), ``ddof`` (1).  Both the episode and the
step part use the sample std (``ddof=1``, as verl-agent's GiGPO): with the population
std the step part's scale would depend on the step-group size relative to the
episode part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..types import CreditAssignment, Trajectory, TrajectoryGroup
from .grpo import group_normalize
from .registry import CreditContext, register_estimator
from .turn_utils import discounted_returns, flatten, segment_normalize, unflatten


def acting_state_keys(traj: Trajectory) -> list[str]:
    """The state each turn acted in (needs ``state_key`` in reset and step infos)."""
    first = traj.info.get("state_key")
    if first is None or any("state_key" not in t.info for t in traj.turns[:-1]):
        raise KeyError(f"trajectory of task {traj.task_id!r} lacks 'state_key' infos; "
                       "step groups need an env that reports one")
    keys = [str(first)] + [str(t.info["state_key"]) for t in traj.turns[:-1]]
    return keys[: traj.num_turns]


@dataclass(frozen=True)
class StepGroupsParams:
    gamma: float = 0.95
    step_weight: float = 1.0
    std_normalize: bool = True
    eps: float = 1e-6
    ddof: int = 1  # sample std in both parts (see the module doc)


@register_estimator("step_groups", params=StepGroupsParams)
def step_groups(group: TrajectoryGroup, p: StepGroupsParams,
                ctx: CreditContext | None = None) -> CreditAssignment:
    trajs = list(group)
    rewards, offsets = flatten([[t.reward for t in tr.turns] for tr in trajs])
    returns = discounted_returns(rewards, offsets, p.gamma)
    # keys are scoped to the task so two tasks never share an anchor state
    keys = np.array([f"{tr.task_id}\x00{k}" for tr in trajs for k in acting_state_keys(tr)],
                    dtype=object)
    step_adv, size = segment_normalize(returns, keys, p.std_normalize, p.eps, p.ddof)
    episode = group_normalize(np.array(group.outcome_rewards()), p.std_normalize, p.eps, p.ddof)
    adv = np.repeat(episode, np.diff(offsets)) + p.step_weight * step_adv
    metrics = {"step_group_size_mean": float(size.mean()) if size.size else 0.0,
               "grouped_turn_frac": float((size > 1).mean()) if size.size else 0.0,
               "reward_mean": float(np.mean(group.outcome_rewards()))}
    return CreditAssignment(unflatten(adv, offsets), metrics=metrics)
