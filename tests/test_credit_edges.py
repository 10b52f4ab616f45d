"""Credit edge cases, each from a small hand-built group: exact zeros where a group has
no signal, finite advantages under -inf scores, zero-turn trajectories, env errors,
GiGPO's std convention, gold-tokens-only scoring, and the finite check before the loss."""

import numpy as np
import pytest

from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
from turngym.credit import (CreditContext, assign_credit, list_estimators, register_estimator,
                            unregister_estimator)
from turngym.credit.grpo import group_normalize
from turngym.credit.roles import OracleJudge, Role, oracle_role, segments_of
from turngym.credit.scoring import GoldScorer
from turngym.credit.turn_utils import segment_normalize
from turngym.trainers.credit import drop_errored
from turngym.types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn

pytestmark = pytest.mark.fast


def _turn(key, reward=0.0, **info):
    return Turn((1, 2), (3, 4), (1, 1), (-0.1, -0.1), "look", "obs", reward,
                {"state_key": key, "valid_action": True, **info})


def _traj(outcome, keys=("a", "b", "c"), stop=StopReason.ANSWERED, **info):
    turns = tuple(_turn(k) for k in keys[1:]) if len(keys) > 1 else ()
    return Trajectory(turns, outcome, outcome > 0.5, stop, "t", "g", 0,
                      {"state_key": keys[0], "gold_answer": ["alpha beta"], "task_seed": 0,
                       "first_observation": "task", **info})


class Scores:
    """Gold-answer log-probs from a table; answer tokens: [tag, gold, gold, tag]."""

    def __init__(self, table, mask=(False, True, True, False)):
        self.table, self.mask = table, np.array(mask)

    def answer_mask(self, answer):
        return self.mask

    def turn_start_scores(self, trajs):
        return [[[np.array(x, dtype=np.float64)] for x in self.table[i]]
                for i in range(len(trajs))]


@pytest.mark.parametrize("size", [3, 5, 6])
def test_equal_fractional_rewards_give_exactly_zero(size):
    r = np.full(size, 0.7)
    if size in (3, 6):
        assert (r - r.mean()).any()  # the rounding noise an exact check must remove
    assert np.array_equal(group_normalize(r), np.zeros(size))
    g = TrajectoryGroup(tuple(_traj(0.7) for _ in range(size)), "t")
    ctx = CreditContext(judge=OracleJudge(), scorer=Scores([[[-1.0] * 4] * 2] * size),
                        reference_scorer=Scores([[[-1.0] * 4] * 2] * size))
    for name in ("grpo", "step_groups", "role_judge", "td_log_ratio"):
        (c,) = assign_credit(name, [g], {}, ctx)
        assert all(a == 0.0 for row in c.turn_advantages for a in row), name


def test_step_group_without_spread_is_exactly_zero():
    vals = np.array([0.7, 0.7, 0.7, 0.1, 0.3])
    keys = np.array(["s", "s", "s", "u", "u"], dtype=object)
    out, size = segment_normalize(vals, keys)
    assert np.array_equal(out[:3], np.zeros(3)) and list(size) == [3, 3, 3, 2, 2]
    # sample std (ddof=1) in the step part, as in the episode part
    np.testing.assert_allclose(out[3:], (vals[3:] - 0.2) / (np.std(vals[3:], ddof=1) + 1e-6))
    pop, _ = segment_normalize(vals, keys, ddof=0)
    np.testing.assert_allclose(pop[3:], (vals[3:] - 0.2) / (np.std(vals[3:]) + 1e-6))


def test_minus_infinity_scores_stay_finite_in_trace_and_igpo():
    g = TrajectoryGroup((_traj(1.0), _traj(0.0)), "t")
    ninf = float("-inf")
    table = [[[-1.0, -2.0, -2.0, -1.0], [-1.0, ninf, -0.5, -1.0]],
             [[-1.0, -0.5, ninf, -1.0], [-1.0, -1.0, -1.0, -1.0]]]
    ctx = CreditContext(scorer=Scores(table), reference_scorer=Scores(table))
    for name, params in (("td_log_ratio", {}), ("info_gain", {"score": "logprob"}),
                         ("info_gain", {"score": "prob"})):
        (c,) = assign_credit(name, [g], params, ctx)
        vals = [a for row in c.turn_advantages for a in row]
        assert all(np.isfinite(vals)) and any(vals), (name, params, vals)


def test_gold_tokens_only_scores_the_answer_not_the_tags():
    g = TrajectoryGroup((_traj(1.0), _traj(0.0)), "t")
    # turn 0 -> 1 makes the gold tokens 9x likelier while the tags lose a little
    lp9 = np.log(0.9)
    table = [[[-0.01, np.log(0.1), np.log(0.1), -0.01], [-2.5, lp9, lp9, -2.5]]] * 2
    ctx = CreditContext(scorer=Scores(table))
    gold = assign_credit("info_gain", [g], {"score": "logprob", "normalize": "separate"}, ctx)[0]
    whole = assign_credit("info_gain", [g], {"score": "logprob", "normalize": "separate",
                                             "gold_tokens_only": False}, ctx)[0]
    from turngym.credit.info_gain import InfoGainParams, boundary_values
    from turngym.credit import make_params
    v_gold = boundary_values(g, Scores(table), make_params("info_gain", {"score": "logprob"}))
    v_all = boundary_values(g, Scores(table), make_params("info_gain", {
        "score": "logprob", "gold_tokens_only": False}))
    assert v_gold[0][1] - v_gold[0][0] > 0  # the turn that helped is credited
    assert v_all[0][1] - v_all[0][0] < 0  # ... while the template mean says it hurt
    assert InfoGainParams().gold_tokens_only
    assert gold.metrics["ig_mean"] > 0 > whole.metrics["ig_mean"]


def test_answer_mask_from_real_tokenizer_offsets():
    words = "alpha beta answer".split()
    tok = build_tiny_tokenizer([" ".join(words)], words)
    scorer = GoldScorer(build_tiny_model(tok, 32, 1, 2), tok)
    ids = scorer.answer_ids("alpha beta")
    mask = scorer.answer_mask("alpha beta")
    assert len(mask) == len(ids)
    assert [tok.decode([i]) for i, m in zip(ids, mask) if m] == ["alpha", "beta"]


def test_zero_turn_trajectories_do_not_crash_any_estimator():
    empty = _traj(0.0, keys=("a",))
    g = TrajectoryGroup((empty, _traj(1.0)), "t")
    ctx = CreditContext(judge=OracleJudge(), scorer=Scores([[], [[-1.0] * 4] * 2]),
                        reference_scorer=Scores([[], [[-1.0] * 4] * 2]))
    for name in ("grpo", "step_groups", "role_judge", "info_gain", "td_log_ratio"):
        (c,) = assign_credit(name, [g], {}, ctx)
        assert c.turn_advantages[0] == () and len(c.turn_advantages[1]) == 2, name


def test_env_errors_are_no_progress_and_not_trained_on():
    t = _traj(0.0, stop=StopReason.ERROR)
    bad = Turn((1,), (2,), (1,), (0.0,), "look", "Error: boom", 0.0,
               {"env_error": "RuntimeError('boom')", "state_key": "new", "valid_action": True})
    t = t.with_(turns=t.turns[:1] + (bad,))
    (seg_before, seg_err) = segments_of(t)
    assert oracle_role(seg_err) is Role.NO_PROGRESS_INFRASTRUCTURE  # not "exploration"
    g = TrajectoryGroup((t, _traj(1.0), _traj(0.0)), "t")
    kept, n = drop_errored([g])
    assert n == 1 and len(kept[0]) == 2
    assert drop_errored([TrajectoryGroup((t,), "t")]) == ([], 1)


def test_non_finite_advantages_are_refused_with_the_estimators_name():
    @register_estimator("broken_for_test")
    def broken(group, params, ctx=None):
        return CreditAssignment(tuple(tuple([float("nan")] * t.num_turns) for t in group))
    g = TrajectoryGroup((_traj(1.0), _traj(0.0)), "t")
    try:
        with pytest.raises(FloatingPointError, match="broken_for_test"):
            assign_credit("broken_for_test", [g])
    finally:  # later tests iterate the registry
        unregister_estimator("broken_for_test")
    assert "broken_for_test" not in list_estimators()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_outcome_is_refused_by_every_estimator_never_zeroed(bad):
    """A NaN or infinite reward must stop the update loudly: info_gain used to turn it
    into exactly-zero advantages for the whole group (a "no signal" group, silently)."""
    g = TrajectoryGroup((_traj(bad), _traj(0.0), _traj(1.0)), "t")
    table = [[[-1.0, -2.0, -3.0, -1.0], [-1.0, -0.5, -0.5, -1.0]]] * 3
    ctx = CreditContext(judge=OracleJudge(), scorer=Scores(table),
                        reference_scorer=Scores(table))
    for name in ("grpo", "step_groups", "role_judge", "td_log_ratio", "info_gain"):
        with pytest.raises(FloatingPointError, match=name):
            assign_credit(name, [g], {}, ctx)
    vals, _ = segment_normalize(np.array([bad, 0.0, 1.0, 2.0, 3.0]), np.array([0, 0, 0, 1, 1]))
    assert np.isnan(vals[:3]).all() and np.isfinite(vals[3:]).all()


def test_token_advantages_must_have_one_entry_per_trajectory():
    g = TrajectoryGroup((_traj(1.0), _traj(0.0)), "t")
    rows = tuple((0.0, 0.0) for _ in g)
    with pytest.raises(ValueError, match="one token-advantage entry"):
        CreditAssignment(rows, token_advantages=(None,)).validate(g)
    CreditAssignment(rows, token_advantages=(None, None)).validate(g)
