"""Bounded-history (window) rollouts: each turn's prompt is the task + the last k turns +
the current observation, one training row per turn, token-in-token-out, exactly
resumable, and every estimator, the demos, the trainer and the probe work on it."""

import numpy as np
import pytest
from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
from turngym.agents.branching import branch_point, branch_point_at, continue_from
from turngym.agents.observation import ObservationView
from turngym.agents.transcript import Transcript
from turngym.credit import CreditContext, GoldScorer, assign_credit
from turngym.credit.scoring import naive_score
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.batching import rows_from_groups, trajectory_rows
from turngym.trainers.credit import Brancher
from turngym.trainers.demos import collect_demos, demo_rows

from turngym.types import ContextMode

pytestmark = pytest.mark.fast

W = ContextMode.WINDOW


def _cfg(**kw):
    base = dict(max_turns=7, max_new_tokens=6, context_mode=W, window_turns=2)
    base.update(kw)
    return RolloutConfig(**base)


def _pool():
    return EnvPool(lambda: TextWorldEnv(split="train", max_turns=7))


class Scripted:
    """Replays fixed action texts (tokenised as the demos tokenise them) + eos."""

    def __init__(self, tok, texts):
        self.tok = tok
        self.stop_token_ids = (tok.eos_token_id,)
        self.script = [list(tok(t, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
                       for t in texts]
        self.calls = 0

    def generate(self, prompts, params):
        from turngym.agents.policy import Sample
        ids = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return [Sample(tuple(ids), tuple([-0.1] * len(ids)), True) for _ in prompts]

    def score(self, sequences):
        return [[0.0] * len(s) for s in sequences]

    def decode(self, ids):
        return self.tok.decode([i for i in ids if i != self.tok.eos_token_id])


def test_transcript_window_is_the_full_context_with_older_turns_cut(tiny_stack):
    tok, _, prompter = tiny_stack
    full = Transcript(prompter, ContextMode.FULL, 0, "task text")
    win = Transcript(prompter, W, 2, "task text")
    head = full.prompt()
    exchanges = []
    for t in range(5):
        resp = [5 + t, 6 + t, tok.eos_token_id]
        obs = f"observation number {t}"
        before = len(full.prompt())
        full.add(resp, obs)
        win.add(resp, obs)
        exchanges.append(full.prompt()[before:])
        assert win.prompt() == head + [x for ex in exchanges[-2:] for x in ex]
    assert len(win.history()) == 6 and win.history()[0] == tuple(head)


def test_shown_extras_only_on_the_current_observation(tiny_stack):
    tok, _, prompter = tiny_stack
    win = Transcript(prompter, W, 3, "your task", "your task | inventory")
    assert win.prompt() == prompter.initial_ids("your task | inventory")
    win.add([5, tok.eos_token_id], "you arrive at cabinet 1 .",
            "you arrive at cabinet 1 . | go to drawer 1")
    win.add([6, tok.eos_token_id], "you open the drawer 1 .",
            "you open the drawer 1 . | take apple 1 from drawer 1")
    text = prompter.render_ids(win.prompt())
    assert "take apple 1 from drawer 1" in text  # the current observation as shown
    assert "go to drawer 1" not in text and "inventory" not in text  # history plain
    assert text.count("cabinet 1") == 1 and "your task" in text


def test_window_rollout_prompts_are_bounded_and_token_exact(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    groups = rollout(policy, prompter, _pool(), [1, 2], 3, _cfg(temperature=1.5))
    for g in groups:
        for tr in g:
            assert tr.context_mode is W
            # the last turn's exchange is recorded only when the episode went on
            assert len(tr.history) in (tr.num_turns, tr.num_turns + 1)
            head = list(tr.history[0])
            for t, turn in enumerate(tr.turns):
                if t == 0:
                    continue
                # head + the plain exchanges of turns t-2 .. t-2, then turn t-1 as shown
                older = [x for ex in tr.history[max(1, t - 1):t] for x in ex]
                shown = list(tr.turns[t - 1].response_ids) + prompter.observation_ids(
                    tr.turns[t - 1].observation, tr.turns[t - 1].response_ids)
                assert list(turn.prompt_ids) == head + older + shown
            seqs = tr.sequences()
            assert len(seqs) == tr.num_turns  # one training sequence per turn
            with pytest.raises(ValueError, match="sequences"):
                tr.token_ids()


def test_greedy_window_continuation_reproduces_the_trajectory(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    cfg = _cfg(greedy=True)
    (g,) = rollout(policy, prompter, _pool(), [3], 1, cfg)
    traj = g.trajectories[0]
    assert traj.num_turns >= 4
    for t in range(traj.num_turns):
        cont = continue_from(policy, prompter, _pool(), [branch_point(traj, t)], cfg)[0]
        assert [x.prompt_ids for x in cont.turns] == [x.prompt_ids for x in traj.turns[t:]]
        assert [x.response_ids for x in cont.turns] == [x.response_ids for x in traj.turns[t:]]
        assert cont.outcome_reward == traj.outcome_reward
    # mid-response: keep 2 tokens of turn 2's response, re-sample the rest (greedy: same)
    bp = branch_point_at(traj, 2, 2)
    cont = continue_from(policy, prompter, _pool(), [bp], cfg)[0]
    first = cont.turns[0]
    assert first.prompt_ids == traj.turns[2].prompt_ids + traj.turns[2].response_ids[:2]
    assert first.response_ids == traj.turns[2].response_ids[2:]
    assert [x.prompt_ids for x in cont.turns[1:]] == [x.prompt_ids for x in traj.turns[3:]]


def test_demo_rows_equal_what_the_rollout_shows(tiny_stack):
    """A policy replaying the expert's demo sees exactly the demo rows' prompts."""
    tok, _, prompter = tiny_stack
    (demo,) = collect_demos(lambda: TextWorldEnv(split="train", max_turns=30), 1, 0.0, seed=3,
                            max_turns=30, view=ObservationView(admissible=True))
    fmt = "<action> {action} </action>"
    rows = demo_rows([demo], prompter, tok, fmt, 10_000, context_mode=W, window_turns=2)
    assert len(rows) == len(demo.steps)
    pol = Scripted(tok, [fmt.format(action=a) for a, _, _ in demo.steps])
    pool = EnvPool(lambda: TextWorldEnv(split="train", max_turns=30))
    # the same task: collect_demos draws its task seed from Random(seed)
    import random
    task = random.Random(3).randrange(2**31 - 1)
    (g,) = rollout(pol, prompter, pool, [task], 1,
                   _cfg(max_turns=30, max_new_tokens=12, show_admissible=True))
    tr = g.trajectories[0]
    assert tr.success and tr.num_turns == len(demo.steps)
    for row, turn in zip(rows, tr.turns):
        n = len(turn.prompt_ids)
        assert row.ids[:n] == list(turn.prompt_ids)
        assert row.ids[n:] == list(turn.response_ids)
        assert row.mask == [0.0] * n + [1.0] * len(turn.response_ids)


@pytest.mark.parametrize("name", ["grpo", "step_groups", "role_judge", "branch_contrast"])
def test_estimators_and_trainer_rows_in_window_mode(tiny_stack, name):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=1)
    cfg = _cfg(temperature=1.5)
    pool = _pool()
    groups = rollout(policy, prompter, pool, [1, 2], 4, cfg)
    from turngym.credit.roles import OracleJudge
    ctx = CreditContext(policy=policy, judge=OracleJudge(),
                        brancher=Brancher(policy, prompter, pool, cfg))
    credits = assign_credit(name, groups, {"budget": 3} if name == "branch_contrast" else {}, ctx)
    rows = rows_from_groups(groups, credits)
    n_turns = sum(t.num_turns for g in groups for t in g) + sum(
        b.num_turns for c in credits for b, _ in c.extra)
    assert len(rows) == n_turns  # one row per turn, branches included
    for r in rows:
        resp = [i for i, m in enumerate(r.mask) if m]
        assert resp and resp == list(range(resp[0], len(r.ids)))  # loss only on the response


def test_gold_scores_in_window_mode_equal_naive_per_turn_scoring(tiny_stack):
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=2)
    (g,) = rollout(policy, prompter, _pool(), [5], 2, _cfg(temperature=1.5))
    scorer = GoldScorer(model, tok)
    trajs = [t.with_(info={**t.info, "gold_answer": ["apple 1"]}) for t in g]
    packed = scorer.turn_start_scores(trajs)
    for tr, per_t in zip(trajs, packed):
        for t, turn in enumerate(tr.turns):
            naive = naive_score(model, turn.prompt_ids, [len(turn.prompt_ids)],
                                scorer.answer_ids("apple 1"))[0]
            np.testing.assert_allclose(per_t[t][0], naive, atol=1e-5)


def test_trajectory_rows_window_mode_one_row_per_turn(tiny_stack):
    tok, model, prompter = tiny_stack
    (g,) = rollout(HFPolicy(model, tok, generator_seed=0), prompter, _pool(), [1], 1,
                   _cfg(temperature=1.5))
    tr = g.trajectories[0]
    rows = trajectory_rows(tr, [float(k) for k in range(tr.num_turns)])
    for k, (row, turn) in enumerate(zip(rows, tr.turns)):
        assert row.ids == list(turn.prompt_ids + turn.response_ids)
        assert set(row.adv[len(turn.prompt_ids):]) == {float(k)}
        assert row.logprobs[len(turn.prompt_ids):] == list(turn.logprobs)
