import math

import gymnasium as gym
import numpy as np
import pytest
from turngym.credit import assign_credit, get_estimator, list_estimators
from turngym.credit.grpo import group_normalize, revisit_fraction

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


def _keyed(keys, reward=0.0, first="s0"):
    turns = tuple(Turn((1,), (2,), (1,), (-1.0,), "a", "o", info={"state_key": k})
                  for k in keys)
    return Trajectory(turns, reward, reward > 0, StopReason.MAX_TURNS, "task", "g",
                      info={"state_key": first})


def test_revisit_penalty_counts_turns_that_return_to_a_seen_state():
    # s0 -> s1 (new) -> s1 (stay) -> s0 (back to the reset state) -> s2 (new)
    assert revisit_fraction(_keyed(["s1", "s1", "s0", "s2"])) == pytest.approx(0.5)
    assert revisit_fraction(_keyed(["s1", "s2", "s3"])) == 0.0
    g = TrajectoryGroup((_keyed(["s1", "s2"]), _keyed(["s0", "s0"]), _keyed(["s1", "s1"]),
                         _keyed(["s0", "s0"], reward=1.0)), "task")
    (shaped,) = assign_credit("grpo", [g], {"revisit_penalty": 0.2, "std_normalize": False})
    # shaped rewards 0, -0.2, -0.1, 0.8 -> mean 0.125: the looping win still ranks first
    assert [adv[0] for adv in shaped.turn_advantages] == pytest.approx(
        [-0.125, -0.325, -0.225, 0.675])
    with pytest.raises(ValueError, match=">= 0"):
        assign_credit("grpo", [g], {"revisit_penalty": -0.1})


def test_revisit_penalty_needs_state_keys_but_tolerates_env_errors():
    no_reset = Trajectory(_keyed(["s1"]).turns, 0.0, False, StopReason.MAX_TURNS, "task", "g")
    with pytest.raises(KeyError, match="reset 'state_key'"):
        revisit_fraction(no_reset)
    bare = Trajectory((Turn((1,), (2,), (1,), (-1.0,), "a", "o"),), 0.0, False,
                      StopReason.MAX_TURNS, "task", "g", info={"state_key": "s0"})
    with pytest.raises(KeyError, match="every step"):
        revisit_fraction(bare)
    crashed = Trajectory(_keyed(["s1"]).turns + (Turn((1,), (2,), (1,), (-1.0,), "a", "o",
                                                     info={"env_error": "boom"}),),
                         0.0, False, StopReason.ERROR, "task", "g", info={"state_key": "s0"})
    assert revisit_fraction(crashed) == 0.5


def test_revisit_penalty_on_real_text_world_episodes():
    """The env's own state keys: the oracle's winning path never revisits; standing still,
    no-op commands and walking back all do."""

    def play(env, actions, seed):
        _, info0 = env.reset(seed=seed)
        turns, won = [], False
        for a in actions(env):
            obs, r, term, trunc, info = env.step(a)
            turns.append(Turn((1,), (2,), (1,), (-1.0,), a, obs, r, info))
            won = won or term
            if term or trunc:
                break
        return Trajectory(tuple(turns), float(won), won, StopReason.MAX_TURNS, "t", "g",
                          info={"state_key": info0["state_key"]})

    env = gym.make("turngym/TextWorld-v0").unwrapped

    def oracle(e):
        for _ in range(30):
            yield e.oracle_action()

    win = play(env, oracle, seed=5)
    assert win.success and revisit_fraction(win) == 0.0

    def loop(e):
        places = [c for c in e.world.admissible() if c.startswith("go to ")]
        yield places[0]
        yield places[0]      # "Nothing happens.": already there
        yield "look"
        yield "inventory"
        yield places[1]      # new place
        yield places[0]      # back where it was: same world state
    lp = play(env, loop, seed=5)
    assert [bool(t.info["valid_action"]) for t in lp.turns][:2] == [True, False]
    assert revisit_fraction(lp) == pytest.approx(4 / 6)


def test_signal_fractions_count_flat_groups_and_zero_advantage_turns():
    """The step metrics behind "advantage collapse": a group whose outcomes are all equal
    gives outcome GRPO nothing to train on; the counts are over turns, not trajectories."""
    from turngym.trainers.credit import signal_fractions
    from turngym.trainers.distributed import World
    mixed = TrajectoryGroup(tuple(_traj(r, n, i) for i, (r, n) in enumerate(
        [(1.0, 2), (0.0, 3)])), "task")  # 5 turns with a signal
    flat = TrajectoryGroup(tuple(_traj(0.0, 3, i) for i in range(4)), "task")  # 12 turns
    groups = [mixed, flat]
    got = signal_fractions(World.local(), groups, assign_credit("grpo", groups))
    assert got == {"flat_outcome_group_frac": 0.5, "zero_adv_turn_frac": 12 / 17}
    assert signal_fractions(World.local(), [], []) == {"flat_outcome_group_frac": 0.0,
                                                       "zero_adv_turn_frac": 0.0}


def test_signal_fractions_read_token_credit_and_extra_rows():
    """An estimator crediting below the turn (branch contrast) may leave the turn-level
    advantage 0 where its tokens are not; its branch rows train too."""
    from turngym.trainers.credit import signal_fractions
    from turngym.trainers.distributed import World
    from turngym.types import CreditAssignment
    g = TrajectoryGroup(tuple(_traj(0.0, 2, i) for i in range(2)), "task")  # flat group
    branch = _traj(1.0, 1, 9)
    c = CreditAssignment(((0.0, 0.0), (0.0, 0.0)),
                         (((0.5,), (0.0,)), None),  # turn 0 of traj 0 has credit
                         extra=((branch, (0.7,)),))
    c.validate(g)
    got = signal_fractions(World.local(), [g], [c])
    assert got == {"flat_outcome_group_frac": 1.0, "zero_adv_turn_frac": 3 / 5}
