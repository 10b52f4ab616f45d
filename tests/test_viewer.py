"""Trajectory samples and ``turngym view``: the size-capped logger, the token-free round
trip, recomputed advantages equal to the registered estimators run on the original
groups (every env, every estimator), the probe's MC truth, the CLI, the localhost
server, and the page itself in headless Chromium (Debian's ``chromium``)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import re
import shutil
import threading
from pathlib import Path

import gymnasium as gym
import httpx
import numpy as np
import pytest
from conftest import SMALL_WIKI
from turngym.agents.rollout import clean_info
from turngym.credit.roles import OracleJudge
from turngym.trainers.samples import (
    SampleLogger,
    cheap_info,
    read_samples,
    rebuild_group,
    recompute,
    write_probe_samples,
)

import turngym  # noqa: F401  (registers the envs)
from turngym import credit
from turngym.types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn
from turngym.view import build_view, make_server, render_html, write_view

HOSTILE = ('</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
           '<!-- & \u2028 %SCRIPT% %DATA% %INDEX%')  # the page template's own placeholders


# ------------------------------------------------------------------ real-env groups
def play(env, seed: int, act, max_turns: int) -> Trajectory:
    """One episode of a real env driven by ``act(env, t)``, recorded as the rollout
    loop records it (infos cleaned, reset info with the first observation), without
    tokens."""
    obs, info = env.reset(seed=seed)
    info0 = clean_info(info, False)
    info0["first_observation"] = obs
    turns, total, stop, success = [], 0.0, StopReason.MAX_TURNS, False
    for t in range(max_turns):
        a = act(env, t)
        obs, r, term, trunc, info = env.step(a)
        info = clean_info(info, False)
        info.setdefault("valid_format", True)
        info.setdefault("valid_action", True)
        turns.append(Turn((), (), (), (), a, obs, float(r), info))
        total += float(r)
        if term:
            success = bool(info.get("won"))
            stop = (StopReason.ANSWERED if info.get("answered") else
                    StopReason.WON if success else StopReason.TERMINATED)
            break
        if trunc:
            break
    return Trajectory(tuple(turns), total, success, stop, str(info0["task_id"]), f"g{seed}", 0,
                      info0)


def _oracle(env, t):
    return env.unwrapped.oracle_action()


def _detour(k, then):
    return lambda env, t: env.unwrapped.oracle_action() if t < k else then


def _recover(turns, detour):
    return lambda env, t: detour if t in turns else env.unwrapped.oracle_action()


ENVS = {
    "textworld": (lambda: gym.make("turngym/TextWorld-v0", split="train"), 20,
                  [_oracle, _recover((1, 2), "look"), _detour(1, "fly away"),
                   _detour(2, "look")]),
    "search": (lambda: gym.make("turngym/SearchQA-v0", split="train", dataset=SMALL_WIKI,
                                retriever={"kind": "bm25"}), 4,
               [_oracle, _detour(1, "<answer> nobody </answer>"), _detour(0, "no tags"),
                _oracle]),
    "tool_math": (lambda: gym.make("turngym/ToolMath-v0", split="train"), 4,
                  [_oracle, _detour(1, "<answer> 1 </answer>"),
                   _detour(0, '<tool_call> {"name": "nope"} </tool_call>'), _oracle]),
    "tool_shop": (lambda: gym.make("turngym/ToolShop-v0", split="train"), 6,
                  [_oracle, _detour(1, "<answer> done </answer>"), _detour(0, "hello"),
                   _oracle]),
}


def env_groups(name: str, seeds=(1, 2, 3)) -> list[TrajectoryGroup]:
    make, max_turns, policies = ENVS[name]
    env = make()
    out = []
    for s in seeds:
        trajs = tuple(play(env, s, p, max_turns) for p in policies)
        out.append(TrajectoryGroup(trajs, trajs[0].task_id))
    return out


_GROUPS: dict = {}


def groups_of(name: str) -> list[TrajectoryGroup]:
    if name not in _GROUPS:
        _GROUPS[name] = env_groups(name)
    return _GROUPS[name]


def _rows(c: CreditAssignment) -> list[list[float]]:
    return [list(r) for r in c.turn_advantages]


def _judge_ctx():
    return credit.CreditContext(judge=OracleJudge())


# ------------------------------------------------------------------ the logger
def test_cheap_info_keeps_what_estimators_read_and_drops_bulk():
    info = {"state_key": 12, "progress": ("a", "b"), "valid_action": np.bool_(False),
            "won": False, "steps": np.int64(3), "admissible_commands": ["x"] * 100,
            "long": "y" * 5000, "score": float("nan"), "gold_answer": ["Pagrou"],
            "first_observation": "the task", "nested": {"a": 1}, "task_id": "t-1"}
    out = cheap_info(info)
    assert out == {"state_key": "12", "progress": ["a", "b"], "valid_action": False,
                   "won": False, "steps": 3, "score": None, "gold_answer": ["Pagrou"],
                   "task_id": "t-1"}
    # in a turn, keys repeating the reset info are left out -- but never estimator inputs
    turn = cheap_info(info, {"task_id": "t-1", "state_key": 12, "gold_answer": ["Pagrou"]})
    assert "task_id" not in turn and turn["state_key"] == "12" and "gold_answer" not in turn
    json.dumps(out, allow_nan=False)


def test_logger_keeps_n_groups_per_step_mixed_outcomes_first(tmp_path):
    groups = groups_of("textworld")
    same = TrajectoryGroup(tuple(t for t in groups[0] if t.success), groups[0].task_id)
    pool = [same, groups[1], same, groups[2]]  # indices 1 and 3 have a GRPO signal
    credits = credit.assign_credit("grpo", pool)
    logger = SampleLogger(tmp_path, groups_per_step=2)
    assert logger.log(5, pool, credits, "grpo") > 0
    recs, status = read_samples(tmp_path / "samples.jsonl")
    assert [r["task_id"] for r in recs] == [groups[1].task_id, groups[2].task_id]
    assert [r["slot"] for r in recs] == [0, 1] and {r["groups_at_step"] for r in recs} == {4}
    assert status == {"torn": 0, "capped_at": None}
    assert recs[0]["credit"]["grpo"]["turn"] == _rows(credits[1])
    off = SampleLogger(tmp_path / "off", groups_per_step=0)
    assert off.log(1, pool, credits, "grpo") == 0 and not (tmp_path / "off").exists()
    with pytest.raises(ValueError, match="credit assignments"):
        logger.log(6, pool, credits[:1], "grpo")


def test_byte_cap_writes_a_marker_stops_and_stays_capped_on_resume(tmp_path):
    groups = groups_of("textworld")[1:2]  # the same record size every step
    credits = credit.assign_credit("grpo", groups)
    one = SampleLogger(tmp_path / "probe-size", 1).log(1, groups, credits, "grpo")
    cap = int(2.5 * one)
    logger = SampleLogger(tmp_path, groups_per_step=1, max_bytes=cap)
    sizes = [logger.log(s, groups, credits, "grpo") for s in range(1, 6)]
    path = tmp_path / "samples.jsonl"
    assert sizes[0] == sizes[1] == one and 0 < sizes[2] < one and sizes[3:] == [0, 0]
    assert path.stat().st_size <= cap
    recs, status = read_samples(path)
    assert [r["step"] for r in recs] == [1, 2] and status["capped_at"] == 3
    again = SampleLogger(tmp_path, groups_per_step=1, max_bytes=cap)  # a resumed run
    assert again.capped and again.log(6, groups, credits, "grpo") == 0
    fresh = SampleLogger(tmp_path, groups_per_step=1, max_bytes=cap, fresh=True)
    assert not fresh.capped and not path.exists()
    # room for one step but not for the marker after it: the cap still holds
    for extra in (0, 10, 30, 60):
        d = tmp_path / f"tight{extra}"
        tight = SampleLogger(d, groups_per_step=1, max_bytes=one + extra)
        [tight.log(s, groups, credits, "grpo") for s in (1, 2, 3)]
        assert (d / "samples.jsonl").stat().st_size <= one + extra


def test_torn_line_is_skipped_and_redone_steps_replace_the_old_ones(tmp_path):
    groups = groups_of("textworld")
    credits = credit.assign_credit("grpo", groups)
    logger = SampleLogger(tmp_path, groups_per_step=1)
    for s in (1, 2, 3):
        logger.log(s, groups, credits, "grpo", {"eps": 1e-6})
    path = tmp_path / "samples.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"kind": "group", "step": 4, "traj')  # a crash mid-write
    resumed = SampleLogger(tmp_path, groups_per_step=1)  # resumed from the step-1 checkpoint
    for s in (2, 3):
        resumed.log(s, groups, credits, "grpo", {"eps": 1e-3})
    recs, status = read_samples(path)
    assert status["torn"] == 1
    assert [(r["step"], r["params"]["eps"]) for r in recs] == [(1, 1e-6), (2, 1e-3), (3, 1e-3)]
    # killed after logging step 3 but before its checkpoint: step 3 alone is redone
    again = SampleLogger(tmp_path, groups_per_step=1)
    again.log(3, groups, credits, "grpo", {"eps": 1e-2})
    recs, _ = read_samples(path)
    assert [(r["step"], r["params"]["eps"]) for r in recs] == [(1, 1e-6), (2, 1e-3), (3, 1e-2)]
    for line in path.read_bytes().splitlines()[-2:]:
        json.loads(line)  # the torn line was closed: the appended records are whole


def _append_many(path: str, tag: int) -> None:
    groups = groups_of("textworld")
    credits = credit.assign_credit("grpo", groups)
    logger = SampleLogger(Path(path), groups_per_step=3)
    for s in range(25):
        logger.log(1000 * tag + s, groups, credits, "grpo")


def test_concurrent_appends_from_two_processes_stay_whole_lines(tmp_path):
    groups_of("textworld")  # built before forking
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), k)) for k in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    # a logger that starts while the other's write is in flight may read the file's end
    # as torn and close it with a newline: a blank line, never a broken record
    lines = [x for x in (tmp_path / "samples.jsonl").read_bytes().splitlines() if x.strip()]
    assert len(lines) == 2 * 25 * 3
    recs, status = read_samples(tmp_path / "samples.jsonl")
    assert status["torn"] == 0
    steps = sorted({json.loads(x)["step"] for x in lines})  # every line parses
    assert steps == sorted([1000 + s for s in range(25)] + [2000 + s for s in range(25)])


# ------------------------------------------------------------------ recomputation
@pytest.mark.parametrize("env_name", list(ENVS))
def test_recomputed_advantages_equal_the_estimators_on_the_original_groups(tmp_path, env_name):
    groups = groups_of(env_name)
    assert all(len(set(g.outcome_rewards())) > 1 for g in groups)  # real signal to compare
    cases = [("grpo", {}), ("grpo", {"invalid_penalty": 0.5, "std_normalize": False}),
             ("step_groups", {"gamma": 0.8}), ("role_judge", {"role_weight": 0.3})]
    for k, (name, params) in enumerate(cases):
        try:
            credits = credit.assign_credit(name, groups, params, _judge_ctx())
        except KeyError as exc:  # step_groups on envs without state keys
            assert env_name.startswith("tool") and "state_key" in str(exc)
            continue
        SampleLogger(tmp_path / str(k), groups_per_step=len(groups)).log(
            7, groups, credits, name, params, None, None)
        recs, _ = read_samples(tmp_path / str(k) / "samples.jsonl")
        assert [r["task_id"] for r in recs] == [g.task_id for g in groups]
        for rec, g, c in zip(recs, groups, credits):
            assert rec["credit"][name]["turn"] == _rows(c)  # logged as trained
            again = recompute(rec)
            assert again[name]["turn"] == _rows(c)  # the run's params, from the log alone
            for other in ("grpo", "step_groups", "role_judge"):  # the others: defaults
                p = params if other == name else {}
                try:
                    (direct,) = credit.assign_credit(other, [g], p, _judge_ctx())
                except KeyError:
                    assert "state_key" in again[other]["skipped"]
                    continue
                assert again[other]["turn"] == _rows(direct), other
            assert "needs gold-answer scores" in again["info_gain"]["skipped"]
            assert "env replay" in again["branch_contrast"]["skipped"]
    roles = recompute(recs[0])["role_judge"]["turn"]
    assert any(v != 0 for row in roles for v in row)


def test_rebuilt_group_carries_every_input_the_estimators_read():
    (g,) = groups_of("search")[:1]
    from turngym.trainers.samples import group_record
    rec = json.loads(json.dumps(group_record(g, {}, step=1, estimator="grpo")))
    back = rebuild_group(rec)
    for a, b in zip(g, back):
        assert (a.outcome_reward, a.success, a.stop_reason, a.task_id) == \
            (b.outcome_reward, b.success, b.stop_reason, b.task_id)
        assert b.info["gold_answer"] == list(a.info["gold_answer"])
        assert b.info["first_observation"] == a.info["first_observation"]
        for x, y in zip(a.turns, b.turns):
            assert (x.action_text, x.observation, x.reward) == (y.action_text, y.observation,
                                                                 y.reward)
            for key in ("state_key", "valid_action", "valid_format", "won", "answered"):
                assert y.info.get(key) == (str(x.info[key]) if key == "state_key"
                                           and key in x.info else x.info.get(key)), key
            assert list(y.info.get("progress", [])) == list(x.info.get("progress", []))


def _tool_math_rollouts(tiny_stack, seeds=(1, 2)):
    from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    pool = EnvPool(lambda: gym.make("turngym/ToolMath-v0", split="train"))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6, temperature=1.5, action_parser="raw")
    return rollout(policy, prompter, pool, list(seeds), 3, cfg)


def test_logged_answer_scores_replay_info_gain_and_td_log_ratio_exactly(tmp_path, tiny_stack):
    from turngym.agents.tiny import build_tiny_model
    tok, model, _ = tiny_stack
    groups = _tool_math_rollouts(tiny_stack)
    ref = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=7)
    ctx = credit.CreditContext(scorer=credit.GoldScorer(model, tok),
                               reference_scorer=credit.GoldScorer(ref, tok))
    params = {"reduce": "sum", "gamma": 0.9, "gold_tokens_only": False}
    credits = credit.assign_credit("info_gain", groups, params, ctx)
    SampleLogger(tmp_path, groups_per_step=len(groups)).log(3, groups, credits, "info_gain",
                                                             params, ctx, tok)
    recs, _ = read_samples(tmp_path / "samples.jsonl")
    td = credit.assign_credit("td_log_ratio", groups, {}, ctx)
    for rec, c, t in zip(recs, credits, td):
        assert rec["params"]["reduce"] == "sum"
        again = recompute(rec)
        assert again["info_gain"]["turn"] == _rows(c)
        assert again["td_log_ratio"]["turn"] == _rows(t)
    flat = [v for c in credits for row in c.turn_advantages for v in row]
    assert np.std(flat) > 0  # the scores really shape the advantages


def test_branch_contrast_logs_token_means_and_says_why_it_is_not_recomputed(tmp_path,
                                                                            tiny_stack):
    from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
    from turngym.agents.branching import continue_from
    from turngym.envs.textworld import TextWorldEnv
    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    pool = EnvPool(lambda: TextWorldEnv(split="train", max_turns=5))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6, temperature=1.5)
    groups = rollout(policy, prompter, pool, [1], 3, cfg)
    ctx = credit.CreditContext(policy=policy,
                               brancher=lambda pts: continue_from(policy, prompter, pool, pts,
                                                                  cfg))
    (c,) = credit.assign_credit("branch_contrast", groups,
                                {"budget": 3, "branches_per_node": 2, "entropy_topk": 4}, ctx)
    SampleLogger(tmp_path, 1).log(1, groups, [c], "branch_contrast", {"budget": 3}, None, tok)
    (rec,), _ = read_samples(tmp_path / "samples.jsonl")
    for traj, logged in zip(groups[0], rec["trajectories"]):  # what the model wrote
        for turn, x in zip(traj.turns, logged["turns"]):
            text = tok.decode(list(turn.response_ids), skip_special_tokens=False)
            assert x.get("response", x["action"]).strip() == text.strip()
    entry = rec["credit"]["branch_contrast"]
    assert entry["extra_trajectories"] == len(c.extra) > 0
    for i, traj in enumerate(groups[0]):
        for t in range(traj.num_turns):
            assert entry["token_mean"][i][t] == pytest.approx(np.mean(c.token_advantages[i][t]))
    again = recompute(rec)
    assert "policy model and env replay" in again["branch_contrast"]["skipped"]
    assert again["grpo"]["turn"] == _rows(credit.assign_credit("grpo", groups)[0])
    _, blobs = build_view(tmp_path)
    g = blobs["s1"][0]
    assert g["sets"]["branch_contrast"] == [[round(x, 4) for x in row]
                                            for row in entry["token_mean"]]
    assert "mean of its token advantages" in g["notes"]["branch_contrast"]


# ------------------------------------------------------------------ probe, training runs
TINY = ["warmstart.num_demos=8", "warmstart.epochs=1", "warmstart.batch_size=8",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2", "eval.num_tasks=1",
        "eval.every=0", "checkpoint.every=0", "agent.max_turns=3", "agent.max_new_tokens=12",
        "threads=1"]
RUNS = {
    "textworld": ("quickstart", ["rl.credit.name=step_groups", "env.eval_splits=[valid_seen]",
                                 "agent.max_turns=12"]),
    "search": ("search_grpo", ["rl.credit.name=info_gain", "env.kwargs.retriever.kind=bm25",
                               "warmstart.lm_epochs=0"]
               + [f"env.kwargs.dataset.{k}={v}" for k, v in SMALL_WIKI.items() if k != "kind"]),
    "tool_math": ("tool_math_grpo", ["rl.credit.name=td_log_ratio"]),
}


@pytest.mark.parametrize("env_name", list(RUNS))
def test_training_run_logs_samples_the_viewer_recomputes(tmp_path, env_name):
    from turngym.trainers.pipeline import train

    from turngym.cli import main
    from turngym.config import load_config
    name, extra = RUNS[env_name]
    out = tmp_path / "run"
    cfg = load_config(name, TINY + extra + [f"output_dir={out}", "logging.samples_per_step=1"])
    train(cfg, progress=False)
    recs, status = read_samples(out / "samples.jsonl")
    assert [r["step"] for r in recs] == [1, 2] and status["capped_at"] is None
    est = cfg.rl.credit.name
    for rec in recs:
        assert rec["estimator"] == est and rec["groups_at_step"] == 2
        assert len(rec["trajectories"]) == 2
        if est != "step_groups":  # the answer scorer's inputs were kept
            assert set(rec["scores"]) == {"policy" if est == "info_gain" else "reference"}
        logged = rec["credit"][est]["turn"]
        again = recompute(rec)[est]["turn"]
        assert np.allclose(again, logged, atol=1e-9, rtol=0) if logged else again == logged
    html_path = tmp_path / "view.html"
    assert main(["view", str(out), "--out", str(html_path)]) == 0
    assert "d-s2" in html_path.read_text()


def test_probe_writes_per_turn_mc_truth_the_viewer_shows(tmp_path, tiny_stack):
    from turngym.trainers.checkpoint import save_model_dir
    from turngym.trainers.probe import run_probe

    from turngym.config import load_config
    tok, model, _ = tiny_stack
    save_model_dir(tmp_path / "m", model, tok)
    cfg = load_config("quickstart", ["agent.max_turns=3", "agent.max_new_tokens=6", "threads=1",
                                     "agent.system_prompt=You are a household agent."])
    res = run_probe(cfg, str(tmp_path / "m"), "valid_seen", tasks=2, group_size=2,
                    continuations=2, estimators=["grpo", "step_groups", "role_judge"],
                    out_dir=str(tmp_path / "probe"), progress=False)
    recs, _ = read_samples(tmp_path / "probe" / "probe_samples.jsonl")
    assert len(recs) == 2 and {r["source"] for r in recs} == {"probe"}
    for rec in recs:
        assert set(rec["credit"]) == set(res["modules"])
        assert [len(r) for r in rec["mc_advantage"]] == [len(t["turns"])
                                                         for t in rec["trajectories"]]
        assert [len(r) for r in rec["mc_se"]] == [len(r) for r in rec["mc_advantage"]]
    index, blobs = build_view(tmp_path / "probe")
    assert [s["key"] for s in index["steps"]] == ["probe"]
    g = blobs["probe"][0]
    assert g["mc"] == [[round(x, 4) for x in row] for row in recs[0]["mc_advantage"]]
    assert g["sources"]["grpo"] == "logged" and set(g["mc_spearman"]) >= {"grpo"}
    assert all(x is None or x >= 0 for row in g["mc_se"] for x in row)


# ------------------------------------------------------------------ the page, the CLI
def _write_run(run: Path, env_name: str = "textworld", steps=(1, 2), hostile: bool = False):
    groups = groups_of(env_name)[:2]
    if hostile:
        t0 = groups[0].trajectories[1]
        turns = (dataclasses.replace(t0.turns[0], observation=HOSTILE),) + t0.turns[1:]
        groups = [TrajectoryGroup((groups[0].trajectories[0], dataclasses.replace(
            t0, turns=turns)) + groups[0].trajectories[2:], groups[0].task_id)] + groups[1:]
    credits = credit.assign_credit("step_groups", groups)
    logger = SampleLogger(run, groups_per_step=2)
    for s in steps:
        logger.log(s, groups, credits, "step_groups", {})
    return groups


def _embedded(page: str, element_id: str):
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page,
                  re.DOTALL)
    return json.loads(m.group(1))


def test_view_cli_writes_one_self_contained_page(tmp_path):
    from turngym.cli import main
    groups = _write_run(tmp_path / "run", hostile=True)
    out = tmp_path / "page.html"
    assert main(["view", str(tmp_path / "run"), "--out", str(out)]) == 0
    page = out.read_text()
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<script[^>]*\bsrc=", page) and "<link" in page
    assert re.findall(r'<link[^>]*href="([^"]*)"', page) == ["data:,"]
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    # hostile env text cannot close the data element or open markup
    assert page.count("</script>") == 1 + 2 + 1  # index, two steps, the script
    assert "<img" not in page and "<!-- &" not in page
    index = _embedded(page, "index")
    assert [s["key"] for s in index["steps"]] == ["s1", "s2"] and index["trained"] == \
        ["step_groups"]
    step = _embedded(page, "d-s2")
    assert step[0]["rollouts"][1]["turns"][0]["observation"] == HOSTILE
    assert [len(r["turns"]) for r in step[0]["rollouts"]] == [t.num_turns for t in groups[0]]
    assert main(["view", str(tmp_path / "run"), "--step", "2", "--out",
                 str(tmp_path / "one.html")]) == 0
    assert [s["key"] for s in _embedded((tmp_path / "one.html").read_text(), "index")[
        "steps"]] == ["s2"]


def test_view_cli_refuses_what_it_cannot_show(tmp_path, capsys):
    from turngym.cli import main
    assert main(["view", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty")]) == 2
    assert "samples_per_step" in capsys.readouterr().err
    _write_run(tmp_path / "run", steps=(1, 2, 3, 7))
    assert main(["view", str(tmp_path / "run"), "--step", "5"]) == 2
    assert "logged steps: 1-3, 7" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "run"), "--probe", str(tmp_path / "empty")]) == 2
    assert "no probe samples" in capsys.readouterr().err


def test_serve_answers_the_page_and_nothing_else(tmp_path):
    _write_run(tmp_path / "run")
    path, _ = write_view(tmp_path / "run")
    server = make_server(path, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        base = f"http://127.0.0.1:{port}"
        r = httpx.get(base + "/")
        assert r.status_code == 200 and r.content == path.read_bytes()
        assert r.headers["content-type"].startswith("text/html")
        assert httpx.get(base + "/view.html?x=1").status_code == 200
        for bad in ("/samples.jsonl", "/../samples.jsonl", "/%2e%2e/samples.jsonl",
                    "//etc/passwd", "/view.html/../samples.jsonl"):
            assert httpx.get(base + bad).status_code == 404, bad
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------ headless Chromium
CHROMIUM = shutil.which("chromium")
try:
    import playwright.sync_api as _pw
except ImportError:  # pragma: no cover - the dev extra installs it
    _pw = None
browser_only = pytest.mark.skipif(
    CHROMIUM is None or _pw is None,
    reason="needs Debian's chromium (apt-get install -y chromium) and playwright "
           "(pip install playwright; no browser download: it drives /usr/bin/chromium)")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    with _pw.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            headless=True, args=CHROMIUM_ARGS)
        yield ctx
        ctx.close()


class Page:
    """A page with every console message, page error and request recorded."""

    def __init__(self, ctx, path: Path):
        self.page = ctx.new_page()
        self.console, self.errors, self.requests = [], [], []
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=30_000)

    def colours(self) -> list[str]:
        return self.page.eval_on_selector_all(".turn", "els => els.map(e => e.style.background)")

    def clean(self) -> None:
        bad = [m for m in self.console if m[0] in ("error", "warning")]
        assert not bad and not self.errors, (bad, self.errors)
        assert self.requests == [self.url], self.requests  # no network, nothing else loaded


@browser_only
def test_page_in_chromium_shows_groups_turns_and_switches_colours(tmp_path, chromium):
    groups = _write_run(tmp_path / "run", hostile=True)
    path, _ = write_view(tmp_path / "run")
    view = Page(chromium, path)
    pg = view.page
    assert pg.get_attribute("body", "data-step") == "s2"  # the last logged step
    assert pg.locator("#groups button").count() == 2
    assert pg.locator(".rollout").count() == len(groups[0])
    assert pg.locator(".turn").count() == sum(t.num_turns for t in groups[0])
    trained = view.colours()
    assert len(set(trained)) > 2  # a diverging scale, not one colour
    pg.click("button[data-est='grpo']")
    grpo = view.colours()
    assert pg.get_attribute("body", "data-estimator") == "grpo" and grpo != trained
    # grpo broadcasts the outcome: every turn of a rollout has its rollout's colour
    for i, traj in enumerate(groups[0]):
        row = pg.eval_on_selector_all(f".rollout[data-i='{i}'] .turn",
                                      "els => els.map(e => e.style.background)")
        assert len(set(row)) == 1 and len(row) == traj.num_turns
    pg.click("button[data-est='info_gain']")  # no scores in a text-world run
    assert pg.locator(".turn.na").count() == sum(t.num_turns for t in groups[0])
    assert "needs gold-answer scores" in pg.inner_text("#note")
    pg.click("button[data-est='step_groups']")
    assert view.colours() == trained
    pg.select_option("#filter", "success")
    assert pg.locator(".rollout").count() == sum(t.success for t in groups[0])
    pg.select_option("#filter", "all")
    pg.click("#groups button[data-g='1']")
    assert pg.locator(".turn").count() == sum(t.num_turns for t in groups[1])
    pg.click("#groups button[data-g='0']")
    pg.click(".rollout[data-i='1'] .turn[data-t='0']")  # the hostile observation, as text
    assert pg.eval_on_selector("#detail pre.observation", "e => e.textContent") == HOSTILE
    assert pg.evaluate("window.__pwned") is None and pg.locator("img").count() == 0
    tip = pg.get_attribute(".rollout[data-i='0'] .turn[data-t='0']", "title")
    assert "step_groups: " in tip and "grpo " in tip and "oracle role" in tip
    pg.click("#prev")
    assert pg.get_attribute("body", "data-step") == "s1"
    pg.check("#numbers")
    assert re.fullmatch(r"-?\d+\.\d\d", pg.inner_text(".rollout[data-i='0'] .turn[data-t='0']"))
    view.clean()
    pg.screenshot(path=str(tmp_path / "shot.png"))


@browser_only
def test_large_run_opens_and_draws_only_the_selected_group(tmp_path, chromium):
    groups = _write_run(tmp_path / "run", steps=(1,))
    index, blobs = build_view(tmp_path / "run")
    # 2,000 logged steps (4,000 groups), as a long run would log them: the page gets one
    # data element per step and parses only the selected one
    steps = []
    for s in range(1, 2001):
        steps.append(dict(index["steps"][0], key=f"s{s}", label=f"step {s}", step=s))
    big = dict(index, steps=steps, initial=len(steps) - 1)
    path = tmp_path / "big.html"
    path.write_text(render_html(big, {st["key"]: blobs["s1"] for st in steps}))
    assert path.stat().st_size > 30_000_000
    view = Page(chromium, path)
    pg = view.page
    assert pg.locator("script[type='application/json']").count() == 2001
    assert pg.get_attribute("body", "data-step") == "s2000"
    assert pg.locator(".turn").count() == sum(t.num_turns for t in groups[0])
    pg.fill("#stepNum", "17")
    pg.dispatch_event("#stepNum", "change")
    assert pg.get_attribute("body", "data-step") == "s17"
    assert pg.locator(".turn").count() == sum(t.num_turns for t in groups[0])
    pg.click("#groups button[data-g='1']")
    assert pg.locator(".turn").count() == sum(t.num_turns for t in groups[1])
    view.clean()


@browser_only
def test_probe_step_draws_mc_truth_under_each_rollout(tmp_path, chromium):
    groups = groups_of("search")[:2]
    names = ("grpo", "role_judge", "step_groups")
    credits = {n: credit.assign_credit(n, groups, {}, _judge_ctx()) for n in names}
    # a stand-in truth with the probe's shape (its real values are tested above)
    truth = [[np.linspace(-0.5, 0.5, t.num_turns) for t in g] for g in groups]
    se = [[np.full(t.num_turns, 0.125) for t in g] for g in groups]
    write_probe_samples(tmp_path / "probe", groups, credits, truth, standard_errors=se)
    _write_run(tmp_path / "run", "search", steps=(1,))
    path, index = write_view(tmp_path / "run", probe=tmp_path / "probe")
    assert [s["key"] for s in index["steps"]] == ["s1", "probe"]
    view = Page(chromium, path)
    pg = view.page
    assert pg.locator(".mc").count() == 0  # training steps have no MC truth
    pg.click("#next")
    assert pg.get_attribute("body", "data-step") == "probe"
    assert pg.locator(".mc").count() == pg.locator(".turn").count() == \
        sum(t.num_turns for t in groups[0])
    assert "Spearman with the MC truth" in pg.inner_text("#note")
    tip = pg.get_attribute(".rollout[data-i='0'] .turn[data-t='0']", "title")
    assert "MC truth -0.500 \u00b1 0.125" in tip
    view.clean()


def test_render_html_is_deterministic_and_escapes_every_angle_bracket(tmp_path):
    from html.parser import HTMLParser

    class Scripts(HTMLParser):  # what a browser's tokenizer sees as script elements
        def __init__(self):
            super().__init__()
            self.found, self._open = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "script":
                self._open = [dict(attrs), ""]

        def handle_data(self, data):
            if self._open is not None:
                self._open[1] += data

        def handle_endtag(self, tag):
            if tag == "script" and self._open is not None:
                self.found.append(tuple(self._open))
                self._open = None

    _write_run(tmp_path / "run", hostile=True)
    index, blobs = build_view(tmp_path / "run")
    page = render_html(index, blobs)
    assert page == render_html(index, blobs)
    parser = Scripts()
    parser.feed(page)
    kinds = [(a.get("type"), a.get("id")) for a, _ in parser.found]
    assert kinds == [("application/json", "index"), ("application/json", "d-s1"),
                     ("application/json", "d-s2"), (None, None)]
    for attrs, data in parser.found[:3]:
        assert not re.search("[<>&\u2028\u2029]", data)
        json.loads(data)
    step = json.loads(parser.found[2][1])
    assert step[0]["rollouts"][1]["turns"][0]["observation"] == HOSTILE
