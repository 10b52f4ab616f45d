"""Outcome GRPO: the baseline every turn-level method is compared against.

For a group of G rollouts with outcome rewards r_1..r_G::

    A_i = (r_i - mean(r)) / (std(r) + eps)      (std_normalize=True, Dr.GRPO: False)

computed at trajectory level, then broadcast to every turn of trajectory i.
A group whose rewards are all equal carries no signal and gets A = 0 exactly (not
the +-1e-10 that ``r - mean(r)`` leaves for fractional rewards).

Optional shaping (``invalid_penalty`` = lambda, default 0): the reward used is
``r_i - lambda * (fraction of turns of trajectory i whose action the env rejected)``,
so groups in which every rollout fails still rank rollouts that waste fewer turns
(verl-agent penalises invalid actions in the same spirit).

``revisit_penalty`` (mu, default 0) subtracts ``mu * (share of turns after which the
world is in a state it was already in earlier in the episode)``, using the env's
history-free ``state_key`` (reset info and every step info).  A turn that changes nothing
("go to" the place the agent stands at, ``look``, a rejected action) and a loop back to an
earlier state both count; a turn that reaches a new state does not.  Unlike the invalid
penalty it leaves no safe no-op: the only unpenalised turns are ones that change the world
into something new.  With lambda + mu < 1 every win still ranks above every failure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..types import CreditAssignment, TrajectoryGroup
from .registry import CreditContext, register_estimator


@dataclass(frozen=True)
class GRPOParams:
    std_normalize: bool = True  # False: Dr.GRPO (mean-centred only)
    eps: float = 1e-6
    ddof: int = 1  # sample std, as torch.std and verl
    invalid_penalty: float = 0.0  # lambda above; 0.5 made the tiny policy play safe no-ops
    revisit_penalty: float = 0.0  # mu above (needs ``state_key`` infos)

    def __post_init__(self):
        if self.invalid_penalty < 0 or self.revisit_penalty < 0:
            raise ValueError("grpo: invalid_penalty and revisit_penalty must be >= 0")


def group_normalize(rewards: np.ndarray, std_normalize: bool = True, eps: float = 1e-6,
                    ddof: int = 1) -> np.ndarray:
    """Group-relative advantages of a 1-D reward vector; exactly 0 where there is no
    spread."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size <= 1 or np.all(r == r[0]):
        return np.zeros_like(r)
    adv = r - r.mean()
    if std_normalize:
        adv = adv / (r.std(ddof=ddof) + eps)
    return adv


def invalid_fraction(traj) -> float:
    if not traj.turns:
        return 0.0
    return sum(1 for t in traj.turns if not t.info.get("valid_action", True)) / len(traj.turns)


def revisit_fraction(traj) -> float:
    """Share of turns after which the world's ``state_key`` equals one it already had in
    this episode (the reset state included).  A turn the env failed on (``env_error``,
    no key) counts as a revisit: it changed nothing the agent can use."""
    if not traj.turns:
        return 0.0
    first = traj.info.get("state_key")
    if first is None:
        raise KeyError(f"trajectory of task {traj.task_id!r} lacks a reset 'state_key'; "
                       "grpo's revisit_penalty needs an env that reports one")
    seen = {first}
    revisits = 0
    for t in traj.turns:
        key = t.info.get("state_key")
        if key is None:
            if "env_error" not in t.info:
                raise KeyError(f"a turn of task {traj.task_id!r} lacks 'state_key'; grpo's "
                               "revisit_penalty needs an env that reports one every step")
            revisits += 1
        elif key in seen:
            revisits += 1
        else:
            seen.add(key)
    return revisits / len(traj.turns)


@register_estimator("grpo", params=GRPOParams)
def grpo(group: TrajectoryGroup, p: GRPOParams, ctx: CreditContext | None = None
         ) -> CreditAssignment:
    rewards = np.array(group.outcome_rewards(), dtype=np.float64)
    if p.invalid_penalty:
        rewards = rewards - p.invalid_penalty * np.array([invalid_fraction(t) for t in group])
    if p.revisit_penalty:
        rewards = rewards - p.revisit_penalty * np.array([revisit_fraction(t) for t in group])
    adv = group_normalize(rewards, p.std_normalize, p.eps, p.ddof)
    turn_adv = tuple(tuple([float(a)] * t.num_turns) for a, t in zip(adv, group))
    return CreditAssignment(turn_adv, metrics={"reward_mean": float(rewards.mean()),
                                               "reward_std": float(rewards.std())})
