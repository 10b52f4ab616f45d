"""Knowing the judge: agreement statistics against independent computations, stratified
segment sampling, the judge's prompt template / JSON validation / fallback accounting
against a scripted server, ``turngym judge-eval`` end to end against the real chat server
(``turngym serve``'s app) over a tiny model fitted in the test, and the spot-check
diagnostics of role_judge."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import product

import numpy as np
import pytest

from turngym.credit import CreditContext, assign_credit, make_params
from turngym.credit.agreement import (agreement, bootstrap_ci, cohen_kappa, confusion_matrix,
                                      macro_recall, per_class, reweighted_agreement)
from turngym.credit.judges import SpotCheckedJudge, make_judge
from turngym.credit.llm_judge import (SYSTEM_PROMPT, USER_TEMPLATE, OpenAIJudge, check_template,
                                      parse_role, segment_prompt)
from turngym.credit.roles import ROLE_NAMES, OracleJudge, Role, has_oracle_info, oracle_role, \
    segments_of
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.judge_eval import oracle_pool, sample_indices, score_labels
from turngym.types import StopReason, Trajectory, TrajectoryGroup, Turn

D, E, N, R = ROLE_NAMES


# ------------------------------------------------------------------ statistics
def kappa_by_hand(a, b):
    """Cohen's kappa straight from its definition over two label lists."""
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b)) / n
    labels = set(a) | set(b)
    p_e = sum((a.count(k) / n) * (b.count(k) / n) for k in labels)
    return (p_o - p_e) / (1 - p_e)


@pytest.mark.fast
def test_kappa_matches_the_textbook_example_and_the_definition():
    # two raters, yes/no: 20 both yes, 5 yes/no, 10 no/yes, 15 both no -> p_o .7, p_e .5
    a = [D] * 25 + [E] * 25
    b = [D] * 20 + [E] * 5 + [D] * 10 + [E] * 15
    c = confusion_matrix(a, b, ROLE_NAMES)
    assert c.tolist() == [[20, 5, 0, 0], [10, 15, 0, 0], [0] * 4, [0] * 4]
    assert agreement(c) == pytest.approx(0.7)
    assert cohen_kappa(c) == pytest.approx(0.4)
    rng = np.random.default_rng(3)
    for _ in range(20):  # four classes, random labellings: the matrix form == the definition
        x = [ROLE_NAMES[i] for i in rng.integers(0, 4, 60)]
        y = [ROLE_NAMES[i] if rng.random() < 0.5 else xi
             for i, xi in zip(rng.integers(0, 4, 60), x)]
        assert cohen_kappa(confusion_matrix(x, y, ROLE_NAMES)) == pytest.approx(
            kappa_by_hand(x, y))


@pytest.mark.fast
def test_a_majority_judge_looks_good_on_agreement_and_zero_on_kappa():
    oracle = [N] * 80 + [D] * 10 + [E] * 6 + [R] * 4
    judge = [N] * 100
    c = confusion_matrix(oracle, judge, ROLE_NAMES)
    assert agreement(c) == pytest.approx(0.8)
    assert cohen_kappa(c) == pytest.approx(0.0)
    pc = per_class(c, ROLE_NAMES)
    assert pc[N]["recall"] == 1.0 and pc[D]["recall"] == 0.0 and pc[R]["support"] == 4
    assert pc[D]["precision"] is None and pc[N]["precision"] == pytest.approx(0.8)
    assert macro_recall(c) == pytest.approx(0.25)
    s = score_labels(oracle, judge, n_boot=200)
    assert s["majority_baseline"] == {"role": N, "agreement": 0.8, "kappa": 0.0}
    # perfect and perfectly wrong judges
    assert cohen_kappa(confusion_matrix(oracle, oracle, ROLE_NAMES)) == pytest.approx(1.0)
    swapped = {N: D, D: N, E: R, R: E}
    assert cohen_kappa(confusion_matrix(oracle, [swapped[x] for x in oracle], ROLE_NAMES)) < 0
    assert cohen_kappa(np.zeros((4, 4))) == 0.0
    assert cohen_kappa(confusion_matrix([N] * 5, [N] * 5, ROLE_NAMES)) == 0.0  # p_e = 1
    with pytest.raises(ValueError, match="unknown label"):
        confusion_matrix(["heroic"], [N], ROLE_NAMES)


@pytest.mark.fast
def test_reweighting_and_bootstrap_intervals():
    # recall 1.0 on D, 0.5 on N; a sample with equal counts, a pool that is 90% N
    oracle = [D] * 10 + [N] * 10
    judge = [D] * 10 + [N] * 5 + [E] * 5
    c = confusion_matrix(oracle, judge, ROLE_NAMES)
    assert agreement(c) == pytest.approx(0.75)
    assert reweighted_agreement(c, [0.1, 0.0, 0.9, 0.0]) == pytest.approx(0.1 + 0.9 * 0.5)
    pos = {r: k for k, r in enumerate(ROLE_NAMES)}
    ci = bootstrap_ci([pos[x] for x in oracle], [pos[x] for x in judge], 4, 500, seed=1)
    assert ci["agreement"][0] <= 0.75 <= ci["agreement"][1]
    assert ci["kappa"][0] <= cohen_kappa(c) <= ci["kappa"][1]
    assert ci == bootstrap_ci([pos[x] for x in oracle], [pos[x] for x in judge], 4, 500, seed=1)


@pytest.mark.fast
def test_stratified_sampling_is_seeded_balanced_and_takes_all_of_a_rare_role():
    roles = [N] * 300 + [D] * 60 + [E] * 40 + [R] * 5
    a = sample_indices(roles, 100, seed=0)
    assert a == sample_indices(roles, 100, seed=0) and a != sample_indices(roles, 100, seed=1)
    assert len(a) == len(set(a)) == 100
    got = {r: sum(roles[i] == r for i in a) for r in ROLE_NAMES}
    assert got[R] == 5  # all of the rare role, its unused share given to the others
    assert sorted(got[r] for r in (D, E, N)) == [31, 32, 32]
    nat = sample_indices(roles, 100, seed=0, method="natural")
    assert len(set(nat)) == 100 and sum(roles[i] == N for i in nat) > 50
    assert sample_indices(roles[:7], 100, seed=0) == list(range(7))


# ------------------------------------------------------------------ prompt and parsing
@pytest.mark.fast
def test_parse_role_validates_json_and_normalises_spelling():
    assert parse_role('{"role": "regression", "reason": "wrong {answer}"}') is Role.REGRESSION
    assert parse_role('```json\n{"Role": "Useful exploration"}\n```') is Role.USEFUL_EXPLORATION
    assert parse_role('{"role": "no-progress infrastructure"}') is Role.NO_PROGRESS_INFRASTRUCTURE
    assert parse_role('{"x": {"role": "decisive_progress"}}') is Role.DECISIVE_PROGRESS  # inner
    assert parse_role('{"role": "heroic"} then {"role": "regression"}') is Role.REGRESSION
    for bad in ("decisive_progress", '["decisive_progress"]', '{"role": 3}', "", None,
                '{"role": "decisive_progress"', '{"role": "decisive progress maybe"}'):
        assert parse_role(bad) is None


@pytest.mark.fast
def test_templates_are_checked_and_rendered():
    for bad in ("{task} {secret}", "{task.__class__}", "{task!r}", "{task:>9}", "no fields",
                "{task"):
        with pytest.raises(ValueError, match="user_template"):
            check_template(bad)
    check_template(USER_TEMPLATE)
    env = TextWorldEnv(split="train")
    seg = segments_of(play(env, 0, ["look"]))[0]
    text = segment_prompt(seg, max_chars=40, template="A={actions} B={observation_after}")
    assert text.startswith("A=  look B=") and " ... " in text and len(text) < 120
    for role in ROLE_NAMES:  # the documented prompt defines every role
        assert f"- {role}:" in SYSTEM_PROMPT


# ------------------------------------------------------------------ hand-built episodes
def play(env, seed, actions):
    obs, info0 = env.reset(seed=seed)
    info0 = dict(info0, first_observation=obs)
    turns, won = [], False
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        turns.append(Turn((), (), (), (), a, obs, float(r), dict(info, valid_format=True)))
        won = won or bool(info.get("won"))
        if term or trunc:
            break
    return Trajectory(tuple(turns), float(won), won, StopReason.WON if won else
                      StopReason.MAX_TURNS, str(info0["task_id"]), "g", 0, info0)


def expert_group(seed=4, n=3):
    """A group of text-world episodes: detours, no-ops, and (for the first) the expert's
    winning path, so every oracle role but regression occurs."""
    env = TextWorldEnv(split="train", max_turns=50)
    env.reset(seed=seed)
    expert = []
    while not env.world.state.won:
        a = env.oracle_action()
        expert.append(a)
        env.step(a)
    trajs = [play(env, seed, ["look", "jump around"] + expert)]
    trajs += [play(env, seed, ["look", "inventory", "go to cabinet 1", "look",
                               "go to countertop 1", "open cabinet 1"][: 3 + k])
              for k in range(n - 1)]
    return TrajectoryGroup(tuple(trajs), trajs[0].task_id)


class ScriptedJudge:
    """Labels segment k with ``roles[k % len(roles)]``."""

    def __init__(self, roles):
        self.roles = roles

    def label(self, segments):
        return [self.roles[k % len(self.roles)] for k in range(len(segments))], 0


# ------------------------------------------------------------------ a scripted server
class Scripted:
    """An OpenAI-compatible endpoint answering from a script; records request bodies."""

    def __init__(self, reply):
        self.reply, self.bodies, self.lock = reply, [], threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "scripted"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.bodies.append(body)
                    k = len(outer.bodies)
                status, content = outer.reply(body, k)
                if status != 200:
                    return self._send(status, {"error": {"message": "x"}})
                self._send(200, {"object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}]})

            def _send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.fast
def test_verdicts_count_retries_and_fallback_causes(tmp_path):
    def reply(body, k):
        act = body["messages"][1]["content"].split("ACT=")[1].split("|")[0].strip()
        tries = sum(act in b["messages"][1]["content"] for b in srv.bodies)
        if act == "look":  # garbage first, then valid JSON
            return 200, ("I think it explores" if tries == 1 else
                         '{"role": "useful_exploration", "reason": "new room"}')
        if act == "inventory":  # a server error, then valid JSON
            return (500, "") if tries == 1 else (200, '{"role": "no_progress_infrastructure"}')
        if act == "go to cabinet 1":  # refused: a 4xx is not retried
            return 400, ""
        return 200, "never JSON"
    srv = Scripted(reply)
    prompt = tmp_path / "system.txt"
    prompt.write_text("Custom judge prompt. Roles: decisive_progress, ...")
    try:
        spec = {"kind": "openai", "base_url": srv.url, "retries": 2, "backoff": 0.0,
                "system_prompt_file": str(prompt), "user_template": "ACT={actions}|",
                "fallback_role": "regression"}
        judge = make_judge(spec)
        env = TextWorldEnv(split="train")
        segs = segments_of(play(env, 0, ["look", "inventory", "go to cabinet 1", "dance"]))
        v = judge.verdicts(segs, max_workers=2)
        assert [x.role for x in v] == [Role.USEFUL_EXPLORATION, Role.NO_PROGRESS_INFRASTRUCTURE,
                                       None, None]
        assert [(x.attempts, x.parse_failures, x.http_failures) for x in v] == \
            [(2, 1, 0), (2, 0, 1), (1, 0, 1), (3, 3, 0)]
        assert all(x.latency_s > 0 for x in v) and v[3].reply == "never JSON"
        assert srv.bodies[0]["messages"][0]["content"] == prompt.read_text()
        assert srv.bodies[0]["messages"][1]["content"].startswith("ACT=  ")
        roles, errors = judge.label(segs)  # as training sees it: fallbacks, counted
        assert errors == 2 and roles[2:] == [Role.REGRESSION] * 2
    finally:
        srv.close()


# ------------------------------------------------------------------ spot checks
@pytest.mark.fast
def test_spot_checks_report_oracle_roles_and_running_agreement():
    g = expert_group()
    segs = [s for i, tr in enumerate(g) for s in segments_of(tr, i)]
    truth = [oracle_role(s) for s in segs]
    assert all(has_oracle_info(s) for s in segs) and len(set(truth)) >= 3
    inner = ScriptedJudge([Role.USEFUL_EXPLORATION, Role.NO_PROGRESS_INFRASTRUCTURE])
    judge = SpotCheckedJudge(inner, fraction=0.5, minimum=1, seed=0)
    ctx = CreditContext(judge=judge)
    agree = total = 0
    conf = np.zeros((4, 4), int)
    for step in range(3):
        res = assign_credit("role_judge", [g], {}, ctx)[0]
        m = res.metrics
        k = int(m["spot_checked"])
        assert abs(k - 0.5 * len(segs)) <= 1  # unbiased rounding of the fraction
        labels = inner.label(segs)[0]
        # the checked subset is what the judge recorded; recompute its numbers by hand
        c_step = judge.confusion - conf
        conf = judge.confusion.copy()
        assert c_step.sum() == k
        agree += np.trace(c_step)
        total += k
        assert m["spot_agreement"] == pytest.approx(np.trace(c_step) / k)
        for r, name in enumerate(ROLE_NAMES):
            assert m[f"oracle_role/{name}"] == pytest.approx(c_step[r].sum() / k)
            assert m[f"role/{name}"] == pytest.approx(
                sum(x.value == name for x in labels) / len(labels))
        assert m["judge_agreement"] == pytest.approx(agree / total)
        assert m["judge_kappa"] == pytest.approx(cohen_kappa(conf))
    # the same seed draws the same subsets, another seed others; all of them at fraction 1
    draws = [[SpotCheckedJudge(inner, 0.5, 1, seed=s).choose(segs) for _ in range(1)]
             for s in (0, 0, 1)]
    assert draws[0] == draws[1] != draws[2]
    full = SpotCheckedJudge(OracleJudge(), 1.0).spot_check(segs, truth)
    assert full.indices == tuple(range(len(segs))) and full.metrics()["judge_agreement"] == 1.0


@pytest.mark.fast
def test_spot_checks_skip_envs_without_oracle_info():
    turns = tuple(Turn((), (), (), (), "a", "o", 0.0, {"valid_format": True}) for _ in range(3))
    trajs = tuple(Trajectory(turns, float(i), bool(i), StopReason.WON, "t", "g", 0, {})
                  for i in range(2))
    judge = SpotCheckedJudge(ScriptedJudge([Role.DECISIVE_PROGRESS]), 0.5)
    with pytest.warns(RuntimeWarning, match="nothing to check"):
        m = assign_credit("role_judge", [TrajectoryGroup(trajs, "t")], {},
                          CreditContext(judge=judge))[0].metrics
    assert m["spot_checked"] == 0 and "judge_agreement" not in m and "oracle_role/regression" \
        not in m


@pytest.mark.fast
def test_spot_check_knob_is_typed_and_reaches_training_through_a_real_http_judge():
    ok = make_params("role_judge", {"judge": {"kind": "oracle"}})  # old configs stay valid
    assert ok.judge.kind.value == "oracle" and ok.judge.spot_check == 0.0
    for bad, msg in (({"kind": "oracle", "spot_check": 0.5}, "nothing to check"),
                     ({"kind": "openai", "base_url": "u", "spot_check": 1.5}, r"\[0, 1\]"),
                     ({"kind": "openai", "base_url": "u", "spot_check_min": 0}, ">= 1"),
                     ({"kind": "openai", "base_url": "u", "sytem_prompt": "x"}, "sytem_prompt"),
                     ({"kind": "openai", "base_url": "u", "system_prompt": "a",
                       "system_prompt_file": "b"}, "not both")):
        with pytest.raises(ValueError, match=msg):
            make_params("role_judge", {"judge": bad})
    srv = Scripted(lambda body, k: (200, '{"role": "decisive_progress"}'))
    try:
        from turngym.trainers.credit import make_judge as trainer_judge
        p = make_params("role_judge", {"judge": {"kind": "openai", "base_url": srv.url,
                                                 "spot_check": 1.0}})
        ctx = CreditContext(judge=trainer_judge(p.judge))  # what the trainer builds
        g = expert_group()
        m = assign_credit("role_judge", [g], p, ctx)[0].metrics
        truth = [oracle_role(s) for i, tr in enumerate(g) for s in segments_of(tr, i)]
        share = sum(r is Role.DECISIVE_PROGRESS for r in truth) / len(truth)
        assert m["role/decisive_progress"] == 1.0 and m["spot_checked"] == len(truth)
        assert m["judge_agreement"] == pytest.approx(share)
        assert m["oracle_role/decisive_progress"] == pytest.approx(share)
        assert m["judge_kappa"] == pytest.approx(0.0)  # one answer for everything
    finally:
        srv.close()


# ------------------------------------------------------------------ end to end
def _fit_constant_judge(target: str):
    """A tiny chat model fitted (seconds) to answer judge prompts with ``target``."""
    from test_role_judge import fit_judge_model

    from turngym.agents.tiny import build_tiny_tokenizer

    env = TextWorldEnv(split="train")
    trs = [play(env, s, ["look", "inventory", "go to cabinet 1", "take apple 1"])
           for s in range(6)]
    prompts = [segment_prompt(s) for tr in trs for s in segments_of(tr)]
    tok = build_tiny_tokenizer([SYSTEM_PROMPT, target] + prompts, TextWorldEnv.vocabulary(),
                               fuse_entities=False)
    return fit_judge_model(tok, prompts, target), tok


def test_cli_end_to_end_against_the_real_chat_server(tmp_path, tiny_stack, capsys):
    """Rollouts of a tiny policy on the text world, judged over HTTP by `turngym serve`'s
    server with a model that always says useful_exploration: every number in the report
    follows from the oracle's labels alone, so each is checked exactly."""
    from turngym.agents.openai_server import ChatModel, serve_in_thread
    from turngym.cli import main
    from turngym.trainers.checkpoint import save_model_dir

    tok, model, _ = tiny_stack
    save_model_dir(tmp_path / "policy", model, tok)
    jmodel, jtok = _fit_constant_judge('{"role": "useful_exploration"}')
    server, url = serve_in_thread(ChatModel(jmodel, jtok, name="tiny-judge"))
    try:
        out = tmp_path / "je"
        rc = main(["judge-eval", "--config", "quickstart", "--checkpoint",
                   str(tmp_path / "policy"), "--tasks", "3", "--group-size", "2",
                   "--segments", "16", "--base-url", url, "--max-tokens", "16", "--retries",
                   "0", "--workers", "2", "--out", str(out), "--results",
                   str(tmp_path / "docs" / "judge_x.json"), "--no-progress",
                   "agent.max_turns=6", "threads=1"])
        assert rc == 0
        r = json.loads((out / "judge_eval.json").read_text())
        assert (tmp_path / "docs" / "judge_x.json").read_text() == \
            (out / "judge_eval.json").read_text()
        assert (tmp_path / "docs" / "judge_x.png").read_bytes()[:4] == b"\x89PNG"
        assert (out / "judge_eval.png").stat().st_size > 5000
        assert r["judge"]["served_model"] == "tiny-judge" and r["source"]["episodes"] == 6
        s = r["sampling"]
        assert s["segments"] == r["n"] == min(16, s["pool_segments"])
        assert sum(s["pool_oracle_counts"].values()) == s["pool_segments"]
        c = np.array(r["confusion"])
        assert r["errors"]["fallback"] == 0, r["examples"]
        assert c.sum() == r["n"] and c[:, 1].sum() == r["n"]  # every answer: exploration
        assert c.sum(1).tolist() == [s["sample_oracle_counts"][x] for x in ROLE_NAMES]
        assert r["agreement"] == pytest.approx(s["sample_oracle_counts"][E] / r["n"])
        assert r["kappa"] == pytest.approx(0.0)
        assert r["per_role"][E]["recall"] in (1.0, None)
        assert r["latency_s"]["p50"] > 0 and r["latency_s"]["p95"] >= r["latency_s"]["p50"]
        printed = capsys.readouterr().out
        assert "kappa 0.000" in printed and "written" in printed
        # a policy and a samples file at once is refused
        rc = main(["judge-eval", "--checkpoint", str(tmp_path / "policy"), "--samples",
                   str(tmp_path), "--base-url", url, "--out", str(out)])
        assert rc == 2
    finally:
        server.stop()


def test_cli_reads_a_runs_logged_samples_and_refuses_bad_input(tmp_path, capsys):
    from turngym.cli import main
    from turngym.trainers.samples import SampleLogger

    g = expert_group()
    segs = [s for i, tr in enumerate(g) for s in segments_of(tr, i)]
    creds = assign_credit("grpo", [g])
    SampleLogger(tmp_path, 4, 10_000_000).log(1, [g], creds, "grpo")
    pool, roles, missing = oracle_pool([g])
    assert len(pool) == len(segs) and missing == 0

    def reply(body, k):  # the oracle's answer for the segment, looked up by its prompt
        for s, r in zip(segs, roles):
            if segment_prompt(s) == body["messages"][1]["content"]:
                return 200, json.dumps({"role": r})
        return 200, "?"
    srv = Scripted(reply)
    try:
        rc = main(["judge-eval", "--samples", str(tmp_path), "--base-url", srv.url,
                   "--segments", "100", "--sampling", "natural", "--out",
                   str(tmp_path / "o"), "--no-progress"])
        assert rc == 0
        r = json.loads((tmp_path / "o" / "judge_eval.json").read_text())
        assert r["source"]["kind"] == "samples" and r["n"] == len(segs)
        assert r["agreement"] == 1.0 and r["kappa"] == pytest.approx(1.0)
        assert r["errors"]["fallback"] == 0
    finally:
        srv.close()
    capsys.readouterr()
    for argv, msg in ((["--samples", str(tmp_path / "nope")], "no samples.jsonl"),
                      (["--samples", str(tmp_path)], "base_url"),
                      (["--samples", str(tmp_path), "--base-url", "http://127.0.0.1:9/v1"],
                       "no OpenAI-compatible server"),
                      ([], "one of them")):
        assert main(["judge-eval", "--out", str(tmp_path / "x")] + argv) == 2
        assert msg in capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.parametrize("n,k", list(product([1, 7, 40], [1, 3])))
def test_spot_check_subset_size(n, k):
    g = expert_group()
    segs = [s for i, tr in enumerate(g) for s in segments_of(tr, i)][:n]
    j = SpotCheckedJudge(OracleJudge(), 0.25, minimum=k, seed=5)
    sizes = [len(j.choose(segs)) for _ in range(200)]
    m = len(segs)
    assert all(min(m, k) <= x <= m for x in sizes)
    if m * 0.25 >= k + 1:
        assert np.mean(sizes) == pytest.approx(0.25 * m, abs=0.2)


@pytest.mark.fast
def test_expert_segments_are_seeded_and_cover_the_roles():
    from turngym.config import load_config
    from turngym.trainers.judge_eval import groups_from_expert

    cfg = load_config("quickstart", ["threads=1"])
    a, src = groups_from_expert(cfg, None, 6, 3, seed=0)
    b, _ = groups_from_expert(cfg, None, 6, 3, seed=0)
    assert [[t.action_text for tr in g for t in tr.turns] for g in a] == \
        [[t.action_text for tr in g for t in tr.turns] for g in b]
    assert src["episodes"] == 18 and src["epsilon"] == cfg.warmstart.epsilon
    pool, roles, missing = oracle_pool(a)
    assert missing == 0 and {D, E, N} <= set(roles)
    assert all(tr.success == bool(tr.turns[-1].info.get("won")) for g in a for tr in g)
