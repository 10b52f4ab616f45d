"""Branch contrast (CBPO): exact-prefix branches, budget and decays, sign-keeping CBV
rescaling, non-overlapping segments, extra branch trajectories with masked prefixes."""

import numpy as np
import pytest

from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
from turngym.agents.branching import branch_point_at, continue_from
from turngym.credit import CreditContext, assign_credit
from turngym.credit.branch_contrast import contrast_value, select_nodes
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.batching import rows_from_groups
from turngym.types import StopReason


def _setup(tiny_stack, seeds=(1, 2), group=4, temperature=1.5):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    pool = EnvPool(lambda: TextWorldEnv(split="train", max_turns=5))
    cfg = RolloutConfig(max_turns=4, max_new_tokens=6, temperature=temperature)
    groups = rollout(policy, prompter, pool, list(seeds), group, cfg)
    calls = []

    def brancher(points):
        calls.append(list(points))
        return continue_from(policy, prompter, pool, points, cfg)
    return policy, prompter, pool, cfg, groups, brancher, calls


def test_mid_response_branch_keeps_the_exact_prefix(tiny_stack):
    policy, prompter, pool, cfg, groups, _, _ = _setup(tiny_stack)
    traj = groups[0].trajectories[0]
    s, e = traj.response_spans()[-1]
    o = max(1, (e - s) // 2) if e - s > 1 else 0
    q = s + o
    bp = branch_point_at(traj, traj.num_turns - 1, o)
    assert list(bp.context) == traj.token_ids()[:q]
    assert list(bp.response_prefix) == traj.token_ids()[s:q]
    cont = continue_from(policy, prompter, pool, [bp] * 3, cfg)
    for c in cont:
        assert c.turns[0].prompt_ids == tuple(traj.token_ids()[:q])  # identical prefix
    with pytest.raises(ValueError, match="outside"):
        branch_point_at(traj, 0, e - s + 5)
    with pytest.raises(ValueError, match="outside"):
        branch_point_at(traj, traj.num_turns, 0)


def test_greedy_branch_at_a_token_reproduces_the_parent(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    pool = EnvPool(lambda: TextWorldEnv(split="train", max_turns=5))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6, greedy=True)
    traj = rollout(policy, prompter, pool, [3], 1, cfg)[0].trajectories[0]
    s, e = traj.response_spans()[1]
    cont = continue_from(policy, prompter, pool, [branch_point_at(traj, 1, e - 1 - s)], cfg)[0]
    full = list(cont.turns[0].prompt_ids) + list(cont.turns[0].response_ids)
    assert full == traj.token_ids()[:e]  # the re-sampled tail equals the original
    assert [t.observation for t in cont.turns] == [t.observation for t in traj.turns[1:]]


def test_budget_and_decays():
    # per trajectory, per turn: entropies of the response tokens
    ents = [[np.array([5, 4.9, 4.8]), np.array([0, 1.0])], [np.array([3, 2.9, 0.5])]]
    # no decay: the three highest-entropy tokens, all on trajectory 0, turn 0
    assert select_nodes(ents, 3, 8, 1.0, 1.0, 2) == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]
    # path decay spreads nodes across trajectories
    picked = select_nodes(ents, 3, 8, 0.5, 1.0, 0)
    assert {i for i, _, _ in picked} == {0, 1}
    # node decay 0: no two nodes within the window (response tokens) on one trajectory
    picked = select_nodes(ents, 4, 8, 1.0, 0.0, 1)
    flat = {(0, 0): 0, (0, 1): 3, (1, 0): 0}
    for i in (0, 1):
        qs = sorted(flat[i, t] + o for j, t, o in picked if j == i)
        assert all(b - a > 1 for a, b in zip(qs, qs[1:]))
    assert len(select_nodes(ents, 100, 8, 1.0, 1.0, 0)) == 5 + 3 - 1  # zero entropy: never
    assert contrast_value(np.array([1.0, 0, 0, 1]), "std") == 0.5
    assert contrast_value(np.array([1.0, 0, 0]), "range") == 1.0


def test_branch_contrast_credit_end_to_end(tiny_stack):
    policy, prompter, pool, cfg, groups, brancher, calls = _setup(tiny_stack)
    ctx = CreditContext(policy=policy, brancher=brancher)
    params = {"budget": 5, "branches_per_node": 2, "entropy_topk": 4}
    res = assign_credit("branch_contrast", groups, params, ctx)
    for g, c in zip(groups, res):
        n_nodes = int(c.metrics["nodes"])
        assert n_nodes <= 5 and c.metrics["branches"] == 2 * n_nodes
        assert len(c.extra) == 2 * n_nodes
        # token advantages cover every response token exactly once
        for traj, toks in zip(g, c.token_advantages):
            assert [len(x) for x in toks] == [len(t.response_ids) for t in traj.turns]
        for b, adv in c.extra:
            assert len(adv) == b.num_turns
    assert sum(len(x) for x in calls) == sum(int(c.metrics["branches"]) for c in res)
    rows = rows_from_groups(groups, res)
    n_parent = sum(len(g) for g in groups)
    assert len(rows) == n_parent + sum(len(c.extra) for c in res)
    # branch rows train only the re-sampled tokens: the shared prefix is prompt (mask 0)
    extra_rows, k = [], 0
    for g, c in zip(groups, res):  # rows: a group's parents, then its branches
        k += len(g)
        extra_rows += list(zip(rows[k:k + len(c.extra)], [b for b, _ in c.extra]))
        k += len(c.extra)
    assert len(extra_rows) == len(rows) - n_parent
    for r, b in extra_rows:
        n_prefix = len(b.turns[0].prompt_ids)
        assert r.ids[:n_prefix] == list(b.turns[0].prompt_ids)
        assert not any(r.mask[:n_prefix])
        assert sum(r.mask) == sum(len(t.response_ids) for t in b.turns)


def test_cbv_rescaling_keeps_signs_and_segments_follow_nodes(tiny_stack, monkeypatch):
    policy, prompter, pool, cfg, groups, brancher, _ = _setup(tiny_stack, seeds=(1,), group=3)
    g = groups[0]
    import turngym.credit.branch_contrast as bc

    # fixed nodes and scripted branch outcomes make the expected numbers exact
    nodes = []
    for i, tr in enumerate(g):
        nodes.append((i, 0, 0))
    monkeypatch.setattr(bc, "select_nodes", lambda *a, **k: nodes)
    outcomes = iter([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])

    def scripted(points):
        out = continue_from(policy, prompter, pool, points, cfg)
        return [b.with_(outcome_reward=next(outcomes)) for b in out]
    res = assign_credit("branch_contrast", [g], {"branches_per_node": 2},
                        CreditContext(policy=policy, brancher=scripted))[0]
    rs = [np.array([g.trajectories[i].outcome_reward, *[[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]][n]])
          for n, (i, _, _) in enumerate(nodes)]
    cbv = np.array([r.std() for r in rs])
    w = cbv / cbv[cbv > 0].mean()
    for n, (i, _, _) in enumerate(nodes):
        r = rs[n]
        # the outcome part's normalisation (sample std, ddof 1), rescaled by the contrast
        a = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if r.std() > 0 else np.zeros(3)
        branch_adv = [adv[0] for b, adv in res.extra[2 * n:2 * n + 2]]
        assert branch_adv == pytest.approx(a[1:] * w[n])
        assert np.all(np.sign(branch_adv) == np.sign(a[1:]))  # CBV keeps the sign
        toks = np.concatenate(res.token_advantages[i])
        if r.std() > 0:
            assert np.all(np.sign(toks) == np.sign(a[0])) or a[0] == 0
        else:  # no contrast at this node: the outcome advantage stays
            assert np.allclose(toks, res.turn_advantages[i][0])


class NoSession:
    """The same model behind the bare Policy protocol (no KV sessions)."""

    def __init__(self, policy):
        self.p = policy
        self.stop_token_ids = policy.stop_token_ids

    def generate(self, prompts, params):
        return self.p.generate(prompts, params)

    def score(self, seqs):
        return self.p.score(seqs)

    def decode(self, ids):
        return self.p.decode(ids)


def test_branch_budget_without_kv_sessions(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = NoSession(HFPolicy(model, tok, generator_seed=0))
    pool = EnvPool(lambda: TextWorldEnv(split="train", max_turns=5))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6, greedy=True)
    traj = rollout(policy, prompter, pool, [3], 1, cfg)[0].trajectories[0]
    s, e = traj.response_spans()[0]
    cont = continue_from(policy, prompter, pool, [branch_point_at(traj, 0, e - 1 - s)], cfg)[0]
    # the re-sampled tail is cut to what is left of the response budget
    assert len(cont.turns[0].response_ids) == 1
    assert list(cont.turns[0].prompt_ids) + list(cont.turns[0].response_ids) == \
        traj.token_ids()[:e]


def test_entropy_screen_reads_the_distribution_the_branches_sample_from(tiny_stack):
    """CBPO picks branch nodes by the entropy of the distribution that produced each token:
    at sampling temperature T that is softmax(logits / T), not the T = 1 one; the trainer's
    context carries the rollouts' temperature to the screen."""
    import torch

    from turngym.credit.scoring import response_entropies
    from turngym.trainers.credit import Brancher, credit_context
    tok, model, prompter = tiny_stack
    policy, _, pool, cfg, groups, _, _ = _setup(tiny_stack, temperature=0.5)
    traj = groups[0].trajectories[0]
    at_t = response_entropies(model, [traj], tok.pad_token_id, temperature=0.5)[0]
    at_1 = response_entropies(model, [traj], tok.pad_token_id)[0]
    ids = torch.tensor([traj.token_ids()])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits / 0.5, -1)
    want = -(lp.exp() * lp).sum(-1)  # entropy of the distribution at each position
    s, e = traj.response_spans()[0]
    assert np.allclose(at_t[0], want[s - 1:e - 1].numpy(), atol=1e-4)
    assert np.abs(at_t[0] - at_1[0]).max() > 0.01
    ctx = credit_context("branch_contrast", None, policy, model, None, tok,
                         Brancher(policy, prompter, pool, cfg))
    assert ctx.sampling_temperature == 0.5
    seen = []
    import turngym.credit.branch_contrast as bc
    real = bc.response_entropies

    def spy(*a, **kw):
        seen.append(kw.get("temperature"))
        return real(*a, **kw)
    bc.response_entropies = spy
    try:
        assign_credit("branch_contrast", groups[:1], {"budget": 1}, ctx)
    finally:
        bc.response_entropies = real
    assert seen == [0.5]


class FlakyTextWorld(TextWorldEnv):
    """A text world whose backend goes away on demand: every step then raises."""
    broken = False

    def step(self, action):
        if FlakyTextWorld.broken:
            raise ConnectionError("backend gone away")
        return super().step(action)


def rollout_then_break(tiny_stack, monkeypatch, group: int, max_turns: int):
    """One group of rollouts on task 1 of a healthy FlakyTextWorld, whose backend then
    goes away: (policy, prompter, pool, cfg, the group)."""
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    pool = EnvPool(lambda: FlakyTextWorld(split="train", max_turns=5))
    cfg = RolloutConfig(max_turns=max_turns, max_new_tokens=6, temperature=1.5)
    monkeypatch.setattr(FlakyTextWorld, "broken", False)
    (g,) = rollout(policy, prompter, pool, [1], group, cfg)
    monkeypatch.setattr(FlakyTextWorld, "broken", True)
    return policy, prompter, pool, cfg, g


def test_an_env_failing_while_a_branch_replays_ends_only_that_branch(tiny_stack, monkeypatch):
    """The env raising while a prefix is replayed (a retriever down mid-step) is an error
    continuation, as it would be in a rollout -- not an exception that kills the RL step --
    and branch contrast neither scores nor trains such branches."""
    policy, prompter, pool, cfg, g = rollout_then_break(tiny_stack, monkeypatch, 3, 4)
    assert all(t.num_turns >= 2 for t in g)
    out = continue_from(policy, prompter, pool, [branch_point_at(g.trajectories[0], 1, 0)], cfg)
    (b,) = out
    assert b.stop_reason is StopReason.ERROR and b.num_turns == 0
    assert "backend gone away" in b.info["env_error"]

    nodes = [(i, 1, 0) for i in range(len(g))]
    import turngym.credit.branch_contrast as bc
    monkeypatch.setattr(bc, "select_nodes", lambda *a, **k: nodes)
    seen = []

    def brancher(points):
        res = continue_from(policy, prompter, pool, points, cfg)
        seen.extend(res)
        return res
    res = assign_credit("branch_contrast", [g], {"branches_per_node": 2},
                        CreditContext(policy=policy, brancher=brancher))[0]
    assert len(seen) == 6 and all(s.stop_reason is StopReason.ERROR for s in seen)
    assert res.extra == () and res.metrics["error_branches"] == 6.0
    assert res.metrics["branches"] == 0.0
    # no node kept a branch, so no contrast: every token keeps the outcome advantage
    for traj, toks, adv in zip(g, res.token_advantages, res.turn_advantages):
        assert np.allclose(np.concatenate([np.asarray(x) for x in toks]), adv[0])


def test_without_std_normalisation_node_segments_are_not_std_scaled(tiny_stack, monkeypatch):
    """std_normalize=false (Dr. GRPO's mean-only advantages) holds after a branch node as
    before it: a parent's advantage never changes scale at a node for a reason unrelated to
    credit."""
    policy, prompter, pool, cfg, groups, brancher, _ = _setup(tiny_stack, seeds=(1,), group=3)
    g = groups[0]
    import turngym.credit.branch_contrast as bc
    monkeypatch.setattr(bc, "select_nodes", lambda *a, **k: [(0, 0, 0)])
    outcomes = iter([1.0, 0.0])

    def scripted(points):
        return [b.with_(outcome_reward=next(outcomes))
                for b in continue_from(policy, prompter, pool, points, cfg)]
    res = assign_credit("branch_contrast", [g], {"branches_per_node": 2, "std_normalize": False},
                        CreditContext(policy=policy, brancher=scripted))[0]
    r = np.array([g.trajectories[0].outcome_reward, 1.0, 0.0])
    assert [adv[0] for _, adv in res.extra] == pytest.approx(r[1:] - r.mean())
    assert np.concatenate(res.token_advantages[0]) == pytest.approx(r[0] - r.mean())
