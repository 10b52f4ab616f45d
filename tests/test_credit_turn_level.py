"""Turn-level credit: packed gold-answer scoring, IGPO, TRACE, GiGPO step groups."""

import random

import numpy as np
import pytest

from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
from turngym.credit import CreditContext, assign_credit, requirements
from turngym.credit.scoring import GoldScorer, naive_score, response_starts
from turngym.credit.step_groups import acting_state_keys
from turngym.credit.td_log_ratio import td_rewards, values_from_logprobs
from turngym.types import StopReason, Trajectory, TrajectoryGroup, Turn

WORDS = "alpha beta gamma delta search answer the of in city born red blue".split()


@pytest.fixture(scope="module")
def lm():
    tok = build_tiny_tokenizer([" ".join(WORDS)], WORDS)
    return tok, build_tiny_model(tok, 32, 2, 2, seed=0).eval()


def _traj(rng, T, vocab, reward=0.0, gold=("alpha beta", "city"), keys=None, rewards=None):
    turns = []
    for t in range(T):
        p = tuple(rng.randrange(6, vocab) for _ in range(rng.randrange(3, 9)))
        r = tuple(rng.randrange(6, vocab) for _ in range(rng.randrange(2, 6)))
        info = {"state_key": keys[t + 1]} if keys else {}
        turns.append(Turn(p, r, (1,) * len(r), (0.0,) * len(r), "a", f"obs{t}",
                          rewards[t] if rewards else 0.0, info))
    info = {"gold_answer": list(gold)}
    if keys:
        info["state_key"] = keys[0]
    return Trajectory(tuple(turns), reward, reward > 0, StopReason.ANSWERED, "task", "g", 0, info)


def test_packed_scoring_equals_naive_per_boundary(lm):
    tok, model = lm
    rng = random.Random(0)
    trajs = [_traj(rng, rng.randrange(1, 6), len(tok)) for _ in range(9)]
    scorer = GoldScorer(model, tok, max_batch_tokens=150)  # forces several batches
    pos = [response_starts(t) for t in trajs]
    packed = scorer.score([t.token_ids() for t in trajs], pos, [t.info["gold_answer"] for t in trajs])
    for t, p, out in zip(trajs, pos, packed):
        assert len(out) == t.num_turns
        for j, ans in enumerate(t.info["gold_answer"]):
            naive = naive_score(model, t.token_ids(), p, scorer.answer_ids(ans))
            for k in range(len(p)):
                np.testing.assert_allclose(out[k][j], naive[k], atol=1e-5)
    with pytest.raises(ValueError, match="outside"):
        scorer.score([trajs[0].token_ids()], [[10**6]], [["alpha"]])


def test_packed_scoring_under_bf16_autocast_tracks_fp32(lm):
    """The 4-D mask path also runs when linear layers compute in bf16 (model.autocast)."""
    tok, model = lm
    rng = random.Random(1)
    trajs = [_traj(rng, rng.randrange(1, 5), len(tok)) for _ in range(5)]
    pos = [response_starts(t) for t in trajs]
    golds = [t.info["gold_answer"] for t in trajs]
    exact = GoldScorer(model, tok).score([t.token_ids() for t in trajs], pos, golds)
    bf16 = GoldScorer(model, tok, precision="bfloat16").score([t.token_ids() for t in trajs], pos, golds)
    diffs = [float(np.abs(a - b).max()) for ta, tb in zip(exact, bf16)
             for ka, kb in zip(ta, tb) for a, b in zip(ka, kb)]
    assert 0 < max(diffs) < 0.1


class TableScorer:
    """Scores from a table: ``table[i][k]`` is the mean gold log-prob of trajectory i
    at turn k, for every token of every answer."""

    def __init__(self, table):
        self.table = table
        self.calls = 0

    def answer_mask(self, answer):
        return np.ones(2, dtype=bool)

    def turn_start_scores(self, trajs):
        self.calls += 1
        return [[[np.full(2, v)] for v in self.table[i]] for i in range(len(trajs))]


def _group(T_list, rewards, rng=None):
    rng = rng or random.Random(1)
    return TrajectoryGroup(tuple(_traj(rng, T, 40, r) for T, r in zip(T_list, rewards)), "task")


def test_info_gain_rewards_normalisation_and_returns():
    g = _group([3, 2], [1.0, 0.0])
    table = [[-3.0, -2.0, -0.5], [-2.0, -2.5]]  # log-probs at each turn start
    ctx = CreditContext(scorer=TableScorer(table))
    res = assign_credit("info_gain", [g], {"score": "logprob", "gamma": 1.0,
                                           "std_normalize": False}, ctx)[0]
    # raw rewards: traj0 IG = [1.0, 1.5], outcome 1.0; traj1 IG = [-0.5], outcome 0.0
    raw = np.array([1.0, 1.5, 1.0, -0.5, 0.0])
    norm = raw - raw.mean()
    expect0 = [norm[0:3].sum(), norm[1:3].sum(), norm[2]]
    expect1 = [norm[3:5].sum(), norm[4]]
    np.testing.assert_allclose(res.turn_advantages[0], expect0)
    np.testing.assert_allclose(res.turn_advantages[1], expect1)
    # prob scores, clipping, discount
    res2 = assign_credit("info_gain", [g], {"score": "prob", "clip_negative": True, "gamma": 0.0,
                                            "std_normalize": False}, ctx)[0]
    p = np.exp(table[0])
    raw2 = np.array([p[1] - p[0], p[2] - p[1], 1.0, 0.0, 0.0])  # traj1 IG clipped to 0
    np.testing.assert_allclose(res2.turn_advantages[0], (raw2 - raw2.mean())[:3])
    assert res.metrics["ig_positive_frac"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="needs CreditContext.scorer"):
        assign_credit("info_gain", [g], {}, CreditContext())
    assert requirements("info_gain") == ("scorer",)


def test_td_log_ratio_telescopes_and_redundant_calls_earn_zero():
    mean_lp = np.array([-4.0, -2.0, -2.0, -1.0, -1.0])  # calls 2 and 4 change nothing
    v = values_from_logprobs(mean_lp, eps=1e-3)
    r = td_rewards(v)
    assert v[0] == 0.0
    assert r[1] == 0.0 and r[3] == 0.0 and r[-1] == 0.0
    assert r.sum() == pytest.approx(v[-1] - v[0])
    assert r[0] > 0 and r[2] > 0  # moving toward the gold answer is rewarded
    g = _group([5, 3], [1.0, 0.0])
    table = [list(mean_lp), [-3.0, -3.5, -3.5]]
    ctx = CreditContext(reference_scorer=TableScorer(table))
    res = assign_credit("td_log_ratio", [g], {"normalize_td": False, "td_weight": 1.0}, ctx)[0]
    grpo = np.array([1.0, 0.0]) - 0.5
    grpo = grpo / (np.std([1.0, 0.0], ddof=1) + 1e-6)
    np.testing.assert_allclose(np.array(res.turn_advantages[0]) - grpo[0], r, atol=1e-9)
    v1 = values_from_logprobs(np.array(table[1]))
    np.testing.assert_allclose(np.array(res.turn_advantages[1]) - grpo[1], td_rewards(v1))
    assert td_rewards(v1)[0] < 0  # a call that made the answer less likely is penalised
    ret = assign_credit("td_log_ratio", [g], {"normalize_td": False, "td_weight": 1.0,
                                              "returns": True}, ctx)[0]
    np.testing.assert_allclose(np.array(ret.turn_advantages[0]) - grpo[0], v[-1] - v)
    assert requirements("td_log_ratio") == ("reference_scorer",)


def test_td_log_ratio_with_a_real_frozen_model(lm):
    tok, model = lm
    rng = random.Random(3)
    g = TrajectoryGroup(tuple(_traj(rng, T, len(tok), r) for T, r in [(4, 1.0), (2, 0.0),
                                                                        (3, 0.0)]), "task")
    ctx = CreditContext(reference_scorer=GoldScorer(model, tok))
    res = assign_credit("td_log_ratio", [g], {"normalize_td": False, "td_weight": 0.0}, ctx)[0]
    # td_weight 0: exactly GRPO
    grpo = assign_credit("grpo", [g])[0]
    np.testing.assert_allclose(np.concatenate(res.turn_advantages),
                               np.concatenate(grpo.turn_advantages))
    assert res.metrics["value_final_mean"] != 0.0


def _brute_step_adv(group, gamma, eps=1e-6, ddof=0):
    """O(N^2) reference: compare every turn with every other turn."""
    items = []
    for i, tr in enumerate(group):
        rs = [t.reward for t in tr.turns]
        keys = acting_state_keys(tr)
        for t in range(tr.num_turns):
            ret = sum(gamma ** (k - t) * rs[k] for k in range(t, len(rs)))
            items.append((i, t, keys[t], ret))
    out = {}
    for i, t, key, ret in items:
        same = [r for _, _, k, r in items if k == key]
        if len(same) < 2 or np.std(same) == 0:
            out[i, t] = 0.0
        else:
            out[i, t] = (ret - np.mean(same)) / (np.std(same, ddof=ddof) + eps)
    return out


def test_step_groups_match_bruteforce_and_share_only_equal_states():
    rng = random.Random(5)
    trajs = []
    for i in range(8):
        T = rng.randrange(2, 7)
        keys = [rng.choice("ABCDE") for _ in range(T + 1)]
        rewards = [0.0] * (T - 1) + [float(rng.random() < 0.5)]
        trajs.append(_traj(rng, T, 40, rewards[-1], keys=keys, rewards=rewards))
    g = TrajectoryGroup(tuple(trajs), "task")
    episode = assign_credit("grpo", [g])[0]
    for ddof in (1, 0):  # sample std (default, as the episode part) and population std
        res = assign_credit("step_groups", [g], {"gamma": 0.9, "step_weight": 0.5,
                                                 "ddof": ddof})[0]
        brute = _brute_step_adv(g, 0.9, ddof=ddof)
        ep = episode if ddof == 1 else assign_credit("grpo", [g], {"ddof": 0})[0]
        for i, tr in enumerate(g):
            for t in range(tr.num_turns):
                expect = ep.turn_advantages[i][t] + 0.5 * brute[i, t]
                assert res.turn_advantages[i][t] == pytest.approx(expect, abs=1e-9)
    assert 0 < res.metrics["grouped_turn_frac"] <= 1


def test_step_groups_need_state_keys():
    g = _group([2, 2], [1.0, 0.0])
    with pytest.raises(KeyError, match="state_key"):
        assign_credit("step_groups", [g], {})
