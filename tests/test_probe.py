"""Exact-prefix continuations and the credit-quality probe."""

import json

import numpy as np
import pytest

from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
from turngym.agents.branching import branch_point, continue_from
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.probe import agreement, mc_true_advantages, rankdata, spearman


def _pool():
    return EnvPool(lambda: TextWorldEnv(split="train", max_turns=6))


def test_greedy_continuation_reproduces_the_rest_of_the_trajectory(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    cfg = RolloutConfig(max_turns=5, max_new_tokens=6, greedy=True)
    groups = rollout(policy, prompter, _pool(), [3, 4], 1, cfg)
    for g in groups:
        traj = g.trajectories[0]
        for t in range(traj.num_turns):
            bp = branch_point(traj, t)
            assert list(bp.context) == traj.token_ids()[: traj.response_spans()[t][0]]
            cont = continue_from(policy, prompter, _pool(), [bp], cfg)[0]
            assert [x.response_ids for x in cont.turns] == [x.response_ids for x in traj.turns[t:]]
            assert [x.observation for x in cont.turns] == [x.observation for x in traj.turns[t:]]
            assert cont.stop_reason == traj.stop_reason
            assert cont.outcome_reward == traj.outcome_reward
    with pytest.raises(ValueError, match="outside"):
        branch_point(traj, traj.num_turns)


def test_mc_advantages_are_zero_for_a_deterministic_policy(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=6, greedy=True)
    groups = rollout(policy, prompter, _pool(), [5], 2, cfg)
    truth = mc_true_advantages(policy, prompter, _pool(), groups, cfg, 2, progress=False)
    for g, rows in zip(groups, truth):
        for traj, adv in zip(g, rows):
            assert adv.shape == (traj.num_turns,)
            np.testing.assert_allclose(adv, 0.0)


def test_mc_advantages_of_a_sampling_policy_telescope(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=1)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=6, temperature=1.0)
    groups = rollout(policy, prompter, _pool(), [6, 7], 2, cfg)
    truth = mc_true_advantages(policy, prompter, _pool(), groups, cfg, 3, progress=False)
    for g, rows in zip(groups, truth):
        for traj, adv in zip(g, rows):
            v0 = traj.outcome_reward - adv.sum()  # V(s_0) recovered by telescoping
            assert 0.0 <= v0 <= 1.0 and np.all(np.abs(adv) <= 1.0)


def test_rank_statistics():
    a = np.array([3.0, 1.0, 2.0, 2.0])
    np.testing.assert_allclose(rankdata(a), [4.0, 1.0, 2.5, 2.5])
    x = np.random.default_rng(0).normal(size=50)
    assert spearman(x, 2 * x + 1) == pytest.approx(1.0)
    assert spearman(x, -x ** 3) == pytest.approx(-1.0)
    assert spearman(x, np.zeros(50)) == 0.0
    m = agreement(np.array([1.0, -1.0, 0.5, 2.0]), np.array([0.2, -0.3, -0.1, 0.0]))
    assert m["sign_agreement"] == pytest.approx(2 / 3) and m["nonzero_turns"] == 3
    scipy_stats = pytest.importorskip("scipy.stats")
    y = np.round(np.random.default_rng(1).normal(size=50), 1)
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)


def test_probe_cli_writes_json_and_plot(tmp_path, tiny_stack):
    from turngym.cli import main
    from turngym.trainers.checkpoint import save_model_dir

    tok, model, _ = tiny_stack
    save_model_dir(tmp_path / "m", model, tok, {"phase": "test"})
    code = main(["probe", "--config", "quickstart", "--checkpoint", str(tmp_path / "m"),
                 "--tasks", "2", "--group-size", "2", "--continuations", "2",
                 "--out", str(tmp_path / "probe"), "agent.max_turns=3",
                 "agent.system_prompt=You are a household agent.",
                 "agent.max_turns=3", "--estimators", "grpo,step_groups,info_gain"])
    assert code == 0
    res = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert set(res["modules"]) == {"grpo", "step_groups"}
    assert "gold_answer" in res["skipped"]["info_gain"]  # text world has no gold answers
    for m in res["modules"].values():
        assert -1.0 <= m["spearman"] <= 1.0 and m["turns"] > 0
        lo, hi = m["spearman_ci95"]
        assert lo <= hi and -1.0 <= lo and hi <= 1.0
    assert res["turns"] > 0 and res["true_adv_se_mean"] >= 0.0
    assert (tmp_path / "probe" / "probe.png").stat().st_size > 1000


def test_token_level_credit_is_averaged_per_turn():
    from turngym.trainers.probe import turn_level
    from turngym.types import CreditAssignment

    c = CreditAssignment(((1.0, 1.0), (0.5,)), (((0.0, 2.0, 4.0), ()), None))
    np.testing.assert_allclose(turn_level(c), [2.0, 1.0, 0.5])


def test_mc_standard_errors_and_bootstrap_intervals():
    from turngym.trainers.probe import MCTruth, bootstrap_agreement, split_half_ceiling
    rng = np.random.default_rng(0)
    # 6 groups x 2 trajectories x 5 turns, 32 continuations per state
    outcomes, final, est = [], [], []
    for g in range(6):
        og, fg, eg = [], [], []
        for i in range(2):
            p = rng.random(5)  # V of each state, jumping around
            og.append((rng.random((5, 32)) < p[:, None]).astype(float))
            fg.append(1.0)
            eg.append(np.diff(np.append(p, 1.0)) + rng.normal(0, 0.01, 5))
        outcomes.append(og)
        final.append(fg)
        est.append(eg)
    truth = MCTruth(outcomes, final)
    se = truth.standard_errors()
    o = outcomes[0][0]
    expect = np.sqrt((o.std(1, ddof=1) / np.sqrt(32)) ** 2
                     + np.append(o.std(1, ddof=1)[1:] / np.sqrt(32), 0.0) ** 2)
    np.testing.assert_allclose(se[0][0], expect)
    good = bootstrap_agreement(est, truth, n_boot=200)
    noise = [[rng.normal(size=5) for _ in g] for g in est]
    bad = bootstrap_agreement(noise, truth, n_boot=200)
    assert good["spearman_ci95"][0] <= good["spearman"] <= good["spearman_ci95"][1]
    assert good["spearman_ci95"][0] > bad["spearman_ci95"][1]  # a real estimate is separable
    assert bad["spearman_ci95"][0] < 0 < bad["spearman_ci95"][1]  # noise straddles zero
    assert -1.0 <= split_half_ceiling(truth) <= 1.0


def test_continuations_cut_off_by_env_errors_are_left_out_of_the_truth():
    """An errored continuation is no outcome: V(s) is the mean of the others, its SE
    counts only them, and a state with none left has no truth (NaN, skipped by the
    agreement) instead of counting as a failure."""
    from turngym.trainers.probe import MCTruth, bootstrap_agreement
    nan = np.nan
    o = np.array([[1.0, nan, 1.0, 0.0],    # 3 continuations left: V = 2/3
                  [nan, nan, nan, nan],    # none left: no V
                  [0.0, 0.0, 1.0, 1.0]])   # V = 1/2
    truth = MCTruth([[o]], [[1.0]])
    v = truth.values()[0][0]
    np.testing.assert_allclose(v[[0, 2, 3]], [2 / 3, 0.5, 1.0])
    assert np.isnan(v[1]) and truth.errors() == 5
    adv = truth.advantages()[0][0]
    assert np.isnan(adv[0]) and np.isnan(adv[1]) and adv[2] == pytest.approx(0.5)
    se = truth.standard_errors()[0][0]
    sd2 = np.std([0.0, 0.0, 1.0, 1.0], ddof=1) / np.sqrt(4)
    assert np.isnan(se[0]) and se[2] == pytest.approx(sd2)  # the terminal value is exact
    # only the turn with a truth is compared: a perfect estimate there agrees fully
    res = agreement(np.array([5.0, -5.0, 0.5]), adv)
    assert res["turns"] == 1 and res["sign_agreement"] == 1.0
    boot = bootstrap_agreement([[np.array([5.0, -5.0, 0.5])]], truth, n_boot=50)
    assert boot["sign_agreement"] == 1.0


def test_mc_truth_marks_continuations_the_env_cut_off(tiny_stack, monkeypatch):
    from test_branch_contrast import rollout_then_break

    from turngym.trainers.probe import mc_truth
    policy, prompter, pool, cfg, g = rollout_then_break(tiny_stack, monkeypatch, 2, 3)
    truth = mc_truth(policy, prompter, pool, [g], cfg, 2, progress=False)
    n_states = sum(t.num_turns for t in g)
    assert truth.errors() == 2 * n_states  # none counted as a failure (0.0)
    assert all(np.isnan(o).all() for o in truth.outcomes[0])


def test_bootstrap_intervals_skip_replicates_without_any_truth():
    """A resample drawing only states whose continuations all hit env errors has no
    statistic; it is left out of the interval (counted), never turned into a NaN CI."""
    from turngym.trainers.probe import MCTruth, bootstrap_agreement
    nan = np.nan
    lost = np.full((2, 3), nan)  # a trajectory none of whose states kept a continuation
    rng = np.random.default_rng(0)
    kept = (rng.random((4, 3)) < np.array([0.2, 0.5, 0.4, 0.9])[:, None]).astype(float)
    truth = MCTruth([[lost], [kept]], [[0.0], [1.0]])
    est = [[np.array([1.0, -1.0])], [np.array([0.3, -0.1, 0.5, 0.1])]]
    boot = bootstrap_agreement(est, truth, n_boot=200)
    assert np.isfinite(boot["spearman_ci95"]).all()
    assert np.isfinite(boot["sign_agreement_ci95"]).all()
    assert 0 < boot["boot_replicates_without_truth"] < 200  # about a quarter draw [lost, lost]


def test_the_noise_ceiling_is_what_a_perfect_estimate_reaches_against_the_full_truth():
    """The split-half r correlates two half-size truths; a perfect estimate (the true
    values) agrees with the full-size truth better than that -- sqrt(2r/(1+r)) -- so r
    itself is no ceiling (it used to be reported as one)."""
    from turngym.trainers.probe import noise_ceiling, spearman
    rng = np.random.default_rng(0)
    v = rng.normal(size=20000)  # true per-turn advantages
    halves = [v + rng.normal(scale=1.5, size=v.size) for _ in range(2)]  # c/2 each
    full = (halves[0] + halves[1]) / 2  # the truth from all c continuations
    r = spearman(halves[0], halves[1])
    perfect = spearman(v, full)
    assert perfect > r + 0.1
    assert noise_ceiling(r) == pytest.approx(perfect, abs=0.02)
    assert noise_ceiling(-0.2) == 0.0 and np.isnan(noise_ceiling(float("nan")))
