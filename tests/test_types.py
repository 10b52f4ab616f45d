import pytest

from turngym.types import (CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn,
                           group_by_group_id)

pytestmark = pytest.mark.fast


def _turn(p, r):
    return Turn(tuple(p), tuple(r), (1,) * len(r), (-0.5,) * len(r), "look", "obs")


def test_turn_rejects_misaligned_fields():
    with pytest.raises(ValueError):
        Turn((1,), (2, 3), (1,), (-1.0, -1.0), "a", "o")


def test_trajectory_sequence_mask_and_spans():
    t = Trajectory((_turn([1, 2, 3], [4, 5]), _turn([6], [7, 8, 9])), 1.0, True, StopReason.WON,
                   "t", "g")
    assert t.token_ids() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert t.loss_mask() == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert t.response_spans() == [(3, 5), (6, 9)]
    assert t.boundary_positions() == [5, 9]


def test_group_rejects_foreign_task_and_empty():
    a = Trajectory((_turn([1], [2]),), 0.0, False, StopReason.MAX_TURNS, "a", "g")
    b = Trajectory((_turn([1], [2]),), 0.0, False, StopReason.MAX_TURNS, "b", "g")
    with pytest.raises(ValueError):
        TrajectoryGroup((a, b), "a")
    with pytest.raises(ValueError):
        TrajectoryGroup((), "a")


def test_credit_validate_checks_turn_counts():
    a = Trajectory((_turn([1], [2]), _turn([3], [4])), 0.0, False, StopReason.MAX_TURNS, "a", "g")
    g = TrajectoryGroup((a,), "a")
    CreditAssignment(((0.1, 0.2),)).validate(g)
    with pytest.raises(ValueError):
        CreditAssignment(((0.1,),)).validate(g)


def test_group_by_group_id_keeps_order():
    trajs = [Trajectory((_turn([1], [2]),), float(i), False, StopReason.MAX_TURNS, f"t{i % 2}",
                        f"g{i % 2}") for i in range(4)]
    groups = group_by_group_id(trajs)
    assert [g.task_id for g in groups] == ["t0", "t1"]
    assert [t.outcome_reward for t in groups[0]] == [0.0, 2.0]
