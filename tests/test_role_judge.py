"""Role-typed judge credit (TRIAGE): segmentation, oracle roles, bounded sign-keeping
corrections, and an LLM judge over a real OpenAI-compatible server on loopback."""

import socket

import httpx
import numpy as np
import pytest
from conftest import SMALL_WIKI

from turngym.agents.openai_server import ChatModel, serve_in_thread
from turngym.credit import CreditContext, assign_credit
from turngym.credit.llm_judge import SYSTEM_PROMPT, OpenAIJudge, parse_role, segment_prompt
from turngym.credit.roles import OracleJudge, Role, segments_of
from turngym.envs.search.env import SearchQAEnv
from turngym.envs.textworld import TextWorldEnv
from turngym.types import StopReason, Trajectory, TrajectoryGroup, Turn


def play(env, seed, actions, valid_format=None):
    """A Trajectory of ``actions`` played in ``env`` (no tokens: judges read text)."""
    obs, info0 = env.reset(seed=seed)
    info0 = dict(info0, first_observation=obs, task_seed=seed)
    turns, total, won = [], 0.0, False
    for k, a in enumerate(actions):
        ok = True if valid_format is None else valid_format[k]
        obs, r, term, trunc, info = env.step(a if ok else "")
        info = dict(info, valid_format=ok)
        turns.append(Turn((), (), (), (), a, obs, float(r), info))
        total += r
        won = won or bool(info.get("won"))
        if term or trunc:
            break
    return Trajectory(tuple(turns), total, won, StopReason.WON if won else StopReason.MAX_TURNS,
                      str(info0["task_id"]), "g", 0, info0)


def test_segments_cut_at_env_facing_actions():
    env = TextWorldEnv(split="train")
    tr = play(env, 0, ["look", "x", "y", "inventory", "z"], [True, False, False, True, False])
    segs = segments_of(tr)
    assert [(s.start, s.end) for s in segs] == [(0, 1), (1, 4), (4, 5)]
    assert segs[1].actions == ("x", "y", "inventory")
    assert segs[0].task == tr.info["first_observation"]


def test_oracle_roles_in_the_text_world():
    env = TextWorldEnv(split="train", max_turns=50)
    env.reset(seed=4)
    expert = []
    while not env.world.state.won:
        a = env.oracle_action()
        expert.append(a)
        env.step(a)
    tr = play(env, 4, ["look", "jump around"] + expert)
    roles, errors = OracleJudge().label(segments_of(tr))
    assert errors == 0
    assert roles[1] is Role.NO_PROGRESS_INFRASTRUCTURE  # "Nothing happens."
    assert roles[-1] is Role.DECISIVE_PROGRESS  # the winning action
    progress = [len(t.info["progress"]) for t in tr.turns]
    for k, r in enumerate(roles):
        before = progress[k - 1] if k else len(tr.info["progress"])
        if r is Role.DECISIVE_PROGRESS:
            assert progress[k] > before or tr.turns[k].info["won"]


def test_oracle_roles_in_search_qa():
    env = SearchQAEnv(split="test", dataset=SMALL_WIKI, retriever={"kind": "bm25"})
    env.reset(seed=0)
    ex = env.example
    good = [f"<search> {q} </search>" for q in ex.oracle_queries]
    tr = play(env, 0, ["<search> weather tomorrow </search>", good[0], good[0],
                       "<answer> certainly wrong </answer>"])
    roles, _ = OracleJudge().label(segments_of(tr))
    assert roles[1] is Role.DECISIVE_PROGRESS  # retrieved the first gold passage
    assert roles[2] is Role.NO_PROGRESS_INFRASTRUCTURE  # the same search again
    assert roles[3] is Role.REGRESSION  # a wrong final answer
    tr2 = play(env, 0, good + [f"<answer> {ex.golden_answers[0]} </answer>"])
    assert OracleJudge().label(segments_of(tr2))[0][-1] is Role.DECISIVE_PROGRESS


class FixedJudge:
    def __init__(self, roles):
        self.roles = roles

    def label(self, segments):
        return [self.roles[i % len(self.roles)] for i in range(len(segments))], 0


def _group(rewards, turns=3):
    trajs = []
    for i, r in enumerate(rewards):
        ts = tuple(Turn((), (), (), (), "a", "o", 0.0, {"valid_format": True})
                   for _ in range(turns))
        trajs.append(Trajectory(ts, r, r > 0, StopReason.WON, "t", "g", 0, {}))
    return TrajectoryGroup(tuple(trajs), "t")


def test_corrections_are_bounded_and_keep_the_outcome_sign():
    g = _group([1.0, 0.0, 0.0, 1.0])
    judge = FixedJudge([Role.DECISIVE_PROGRESS, Role.REGRESSION, Role.USEFUL_EXPLORATION])
    ctx = CreditContext(judge=judge)
    grpo = np.concatenate(assign_credit("grpo", [g])[0].turn_advantages)
    for beta in (0.3, 5.0):
        res = assign_credit("role_judge", [g], {"role_weight": beta, "min_keep": 0.1}, ctx)[0]
        adv = np.concatenate(res.turn_advantages)
        assert np.all(np.sign(adv) == np.sign(grpo))  # outcome stays the direction
        assert np.all(np.abs(adv - grpo) <= beta * 1.0 + 1e-9)  # bounded by role_weight
    res = assign_credit("role_judge", [g], {"role_weight": 0.3}, ctx)[0]
    row0 = np.array(res.turn_advantages[0]) - grpo[0]
    np.testing.assert_allclose(row0, [0.3, -0.3, 0.075])
    assert res.metrics["role/decisive_progress"] == pytest.approx(4 / 12)
    assert res.metrics["env_facing_turns_per_episode"] == 3
    flat = _group([0.0, 0.0])
    a = assign_credit("role_judge", [flat], {"role_weight": 0.5, "zero_outcome": "roles"}, ctx)[0]
    assert a.turn_advantages[0] == (0.5, -0.5, 0.125)
    z = assign_credit("role_judge", [flat], {}, ctx)[0]  # default: no outcome, no update
    assert all(x == 0 for row in z.turn_advantages for x in row)
    with pytest.raises(ValueError, match="unknown roles"):
        assign_credit("role_judge", [g], {"role_values": {"heroic": 1.0}}, ctx)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        assign_credit("role_judge", [g], {"role_values": {"regression": -3}}, ctx)


def test_parse_role_is_strict_about_roles_and_lenient_about_spacing():
    assert parse_role('{"role": "regression", "reason": "x"}') is Role.REGRESSION
    assert parse_role('noise {" role ": " useful_exploration "} more') is Role.USEFUL_EXPLORATION
    assert parse_role('{"role": "heroic"}') is None
    assert parse_role("no json here") is None
    assert parse_role('{"role": ') is None


def fit_judge_model(tok, prompts: list[str], target: str):
    """A tiny chat model on ``tok`` fitted (a few seconds) to answer each of ``prompts``
    (as the judge's user message) with ``target``."""
    import torch

    from turngym.agents.tiny import build_tiny_model
    from turngym.trainers.batching import TokenRow
    from turngym.trainers.sft import sft_train

    torch.manual_seed(0)
    model = build_tiny_model(tok, 32, 1, 2, seed=0)
    rows = []
    for p in prompts:
        text = tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT},
                                        {"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        ans = list(tok(target, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        rows.append(TokenRow(ids + ans, [0.0] * len(ids) + [1.0] * len(ans),
                             [0.0] * (len(ids) + len(ans)), [0.0] * (len(ids) + len(ans))))
    sft_train(model, rows * 8, 3, 1e-2, 8, 65536, tok.pad_token_id, warmup_steps=2)
    return model.eval()


def _judge_model(target: str):
    """A tiny model fitted (a few seconds) to answer every judge prompt with ``target``."""
    from turngym.agents.tiny import build_tiny_tokenizer

    env = TextWorldEnv(split="train")
    trs = [play(env, s, ["look", "inventory", "go to cabinet 1"]) for s in range(4)]
    prompts = [segment_prompt(s) for tr in trs for s in segments_of(tr)]
    tok = build_tiny_tokenizer([SYSTEM_PROMPT, target] + prompts, fuse_entities=False)
    return fit_judge_model(tok, prompts, target), tok, trs


@pytest.fixture(scope="module")
def served_judge():
    model, tok, trs = _judge_model('{"role": "useful_exploration"}')
    server, url = serve_in_thread(ChatModel(model, tok))
    yield url, trs, tok
    server.stop()


def test_llm_judge_over_real_http(served_judge):
    url, trs, _ = served_judge
    judge = OpenAIJudge(url, retries=0, max_workers=2)
    segs = [s for tr in trs for s in segments_of(tr)]
    roles, errors = judge.label(segs)
    assert errors == 0 and all(r is Role.USEFUL_EXPLORATION for r in roles)
    g = TrajectoryGroup((trs[0],), trs[0].task_id)
    res = assign_credit("role_judge", [g], {}, CreditContext(judge=judge))[0]
    assert res.metrics["role/useful_exploration"] == 1.0 and res.metrics["judge_errors"] == 0


def test_server_contract_and_judge_fallbacks(served_judge):
    url, trs, tok = served_judge
    models = httpx.get(f"{url}/models").json()
    assert models["data"][0]["id"] == "turngym-local"
    r = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user",
                                                                  "content": "hi"}],
                                                    "max_tokens": 4, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] <= 4
    for bad in ({"messages": []}, {"messages": [{"role": "user"}]},
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}):
        r = httpx.post(f"{url}/chat/completions", json=bad)
        assert r.status_code == 400 and "message" in r.json()["error"]
    # a model that never answers in JSON: every segment falls back and is counted
    from turngym.agents.tiny import build_tiny_model
    garbage = build_tiny_model(tok, 16, 1, 2, seed=3).eval()
    server, url2 = serve_in_thread(ChatModel(garbage, tok))
    try:
        segs = segments_of(trs[0])
        roles, errors = OpenAIJudge(url2, retries=1, backoff=0.01, max_tokens=8).label(segs)
        assert errors == len(segs) and all(r is Role.NO_PROGRESS_INFRASTRUCTURE for r in roles)
    finally:
        server.stop()
    # a judge server that is down: fallbacks, counted, no exception
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = OpenAIJudge(f"http://127.0.0.1:{port}/v1", retries=1, backoff=0.01,
                       fallback_role="regression")
    roles, errors = down.label(segments_of(trs[0]))
    assert errors == len(roles) and set(roles) == {Role.REGRESSION}
