import math

import numpy as np
import pytest

from turngym.credit import assign_credit, get_estimator, list_estimators
from turngym.credit.grpo import group_normalize
from turngym.types import StopReason, Trajectory, TrajectoryGroup, Turn

pytestmark = pytest.mark.fast


def _traj(reward, n_turns, i):
    turns = tuple(Turn((1,), (2,), (1,), (-1.0,), "a", "o") for _ in range(n_turns))
    return Trajectory(turns, reward, reward > 0, StopReason.WON, "task", "g", info={"i": i})


def test_grpo_matches_hand_computed_values():
    # rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3)
    g = TrajectoryGroup(tuple(_traj(r, n, i) for i, (r, n) in enumerate(
        [(1.0, 2), (0.0, 3), (0.0, 1), (1.0, 4)])), "task")
    (res,) = assign_credit("grpo", [g], {"eps": 0.0})
    s = math.sqrt(1 / 3)
    expect = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]
    for adv, e, traj in zip(res.turn_advantages, expect, g):
        assert len(adv) == traj.num_turns  # broadcast to every turn
        assert all(a == pytest.approx(e) for a in adv)


def test_grpo_without_std_and_population_std():
    r = np.array([3.0, 1.0, 2.0])
    assert group_normalize(r, std_normalize=False).tolist() == pytest.approx([1.0, -1.0, 0.0])
    pop = group_normalize(r, eps=0.0, ddof=0)
    assert pop.tolist() == pytest.approx((r - 2.0) / r.std())


def test_uniform_group_and_singleton_give_zero_advantage():
    g = TrajectoryGroup(tuple(_traj(1.0, 2, i) for i in range(4)), "task")
    (res,) = assign_credit("grpo", [g])
    assert all(a == 0.0 for adv in res.turn_advantages for a in adv)
    assert group_normalize(np.array([5.0])).tolist() == [0.0]


def test_registry_lookup_errors_are_clear():
    assert "grpo" in list_estimators()
    with pytest.raises(KeyError, match="registered"):
        get_estimator("nope")


def test_invalid_penalty_ranks_failed_rollouts_by_wasted_turns():
    def traj(valid_flags, reward=0.0):
        turns = tuple(Turn((1,), (2,), (1,), (-1.0,), "a", "o", info={"valid_action": v})
                      for v in valid_flags)
        return Trajectory(turns, reward, reward > 0, StopReason.MAX_TURNS, "task", "g")

    g = TrajectoryGroup((traj([True, True]), traj([False, False]), traj([True, False])), "task")
    (plain,) = assign_credit("grpo", [g])
    assert all(a == 0.0 for adv in plain.turn_advantages for a in adv)
    (shaped,) = assign_credit("grpo", [g], {"invalid_penalty": 0.5, "std_normalize": False})
    # shaped rewards 0, -0.5, -0.25 -> mean -0.25
    assert [adv[0] for adv in shaped.turn_advantages] == pytest.approx([0.25, -0.25, 0.0])
