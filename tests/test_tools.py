"""Tool-call building blocks: @tool schemas and checked dispatch, Hermes/Qwen call
parsing with every error path, the sandboxed Python runner, the safe calculator."""

import os
import time
from typing import Literal, Optional

import pytest

from turngym.envs.tools import (CalculatorError, CallError, SandboxLimits, ToolArgumentError,
                                ToolCall, ToolSet, evaluate, parse_tool_calls, run_python, tool,
                                tool_response)


@tool
def lookup_order(order_id: str, include_items: bool = False) -> dict:
    """Looks up an order by id.

    Args:
        order_id: the order number, e.g. "#W123"
        include_items: also list the items
    """
    return {"id": order_id, "items": [] if include_items else None}


@tool(name="scale")
def _scale(values: list[float], factor: float, mode: Literal["mul", "div"] = "mul",
           note: Optional[str] = None) -> list:
    """Scales numbers."""
    return [v * factor if mode == "mul" else v / factor for v in values]


def test_schema_from_hints_and_docstring():
    s = lookup_order.schema["function"]
    assert s["name"] == "lookup_order" and s["description"] == "Looks up an order by id."
    assert s["parameters"]["required"] == ["order_id"]
    assert s["parameters"]["properties"]["order_id"] == {
        "type": "string", "description": 'the order number, e.g. "#W123"'}
    assert s["parameters"]["properties"]["include_items"]["type"] == "boolean"
    p = _scale.schema["function"]["parameters"]["properties"]
    assert p["values"] == {"type": "array", "items": {"type": "number"}}
    assert p["mode"] == {"type": "string", "enum": ["mul", "div"]}
    assert p["note"] == {"type": "string"}
    with pytest.raises(TypeError, match=r"\*args"):
        tool(lambda *a: None)


def test_toolset_checks_arguments_with_clear_messages():
    ts = ToolSet([lookup_order, _scale])
    assert ts.call("scale", {"values": [1, 2], "factor": 2}) == [2.0, 4.0]  # ints as floats
    assert ts.call("lookup_order", {"order_id": "#1", "include_items": True})["items"] == []
    cases = [("nope", {}, "unknown tool 'nope'"),
             ("lookup_order", {}, "missing required argument"),
             ("lookup_order", {"order_id": 5}, "must be string"),
             ("lookup_order", {"order_id": "1", "include_items": 1}, "must be boolean"),
             ("lookup_order", {"order_id": "1", "color": "red"}, "unknown argument"),
             ("scale", {"values": [1, "x"], "factor": 1}, r"values\[1\]"),
             ("scale", {"values": [1], "factor": 1, "mode": "pow"}, "not one of"),
             ("scale", [1, 2], "must be a JSON object")]
    for name, args, msg in cases:
        with pytest.raises(ToolArgumentError, match=msg):
            ts.call(name, args)
    prompt = ts.system_prompt("You are a shop assistant.")
    assert "<tools>" in prompt and '"name": "scale"' in prompt and "<tool_call>" in prompt
    with pytest.raises(ValueError, match="unique"):
        ToolSet([lookup_order, lookup_order])


def test_parse_tool_calls_and_every_error_path():
    ok = parse_tool_calls('<think>hm</think><tool_call>{"name": "add", "arguments": {"a": 1}}'
                          '</tool_call> and <tool_call>{"name":"x","arguments":"{\\"b\\": 2}"}'
                          '</tool_call>')
    assert ok.calls == (ToolCall("add", {"a": 1}), ToolCall("x", {"b": 2})) and ok.invalid == 0
    bad = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>{"name": "add", "arguments": {"a": 1}': "cut off",
        '<tool_call>{"arguments": {}}</tool_call>': '"name"',
        '<tool_call>["add"]</tool_call>': "JSON object",
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "add", "arguments": "nope"}</tool_call>': "not JSON",
    }
    for text, msg in bad.items():
        r = parse_tool_calls(text)
        assert r.invalid == 1 and msg in r.calls[-1].message, (text, r)
    many = parse_tool_calls('<tool_call>{"name": "a"}</tool_call>' * 5, max_calls=3)
    assert len(many.calls) == 4 and isinstance(many.calls[-1], CallError)
    assert parse_tool_calls("The answer: <answer> 42 </answer>").answer == "42"
    assert parse_tool_calls(None).invalid == 1
    r = tool_response("x" * 50, max_chars=10)
    assert r.startswith("<tool_response>\nxxxxxxxxxx... [truncated 40 chars]")
    assert tool_response({"a": 1}) == '<tool_response>\n{"a": 1}\n</tool_response>'


FAST = SandboxLimits(wall_seconds=2.0, cpu_seconds=2, memory_mb=256)


def test_sandbox_runs_code_in_a_throwaway_directory():
    r = run_python("open('f.txt', 'w').write('hi')\nimport os\nprint(os.listdir('.'), "
                   "open('f.txt').read())")
    assert r.ok and "'f.txt'" in r.stdout and "hi" in r.stdout
    r2 = run_python("import os\nprint(os.listdir('.'))")
    assert "f.txt" not in r2.stdout  # a fresh directory per call
    big = run_python("print('x' * 100000)", SandboxLimits(max_output_chars=100))
    assert "[truncated" in big.stdout and len(big.stdout) < 200
    err = run_python("raise ValueError('boom')")
    assert err.returncode == 1 and "ValueError: boom" in err.render()


def test_the_agent_sees_the_error_whatever_came_before_it_on_stderr():
    """A long stderr is cut at max_output_chars, yet the exception it ends with is what
    the agent is shown; a blank stderr is shown as nothing, and stdout is kept."""
    lim = SandboxLimits(max_output_chars=500)
    r = run_python("import sys\nsys.stderr.write('w' * 5000 + '\\n')\n"
                   "raise ValueError('the real error')", lim)
    assert r.truncated and "[truncated" in r.stderr
    assert r.render() == "[exit code 1]\nValueError: the real error"
    r = run_python("import sys\nprint('partial result')\nsys.stderr.write('\\n  \\n')\n"
                   "raise SystemExit(3)", lim)
    assert r.render() == "partial result\n[exit code 3]"


@pytest.mark.parametrize("code,expect", [
    ("while True:\n    pass", "time limit"),
    ("import time\ntime.sleep(60)", "time limit"),
    ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
    ("import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])", "not allowed"),
    ("import _posixsubprocess", "not allowed"),
    ("x = bytearray(4 * 1024 ** 3)", "MemoryError"),
    ("a = []\nwhile True:\n    a.append(' ' * 10 ** 7)", "MemoryError"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 80))", "not allowed"),
    ("print(open('/etc/hostname').read())", "outside the working directory"),
    ("open('/tmp/turngym_sandbox_escape', 'w').write('x')", "outside the working directory"),
    ("import os\nos.listdir('/root')", "outside the working directory"),
    ("import os\nos.rename('__main__.py', '/tmp/turngym_sandbox_escape')", "outside"),
    ("import os\nos.system('touch /tmp/turngym_sandbox_escape')", "not allowed"),
])
def test_sandbox_survives_hostile_code(code, expect):
    t0 = time.monotonic()
    r = run_python(code, FAST)
    assert not r.ok and expect in r.render(), r
    assert time.monotonic() - t0 < 10
    assert not os.path.exists("/tmp/turngym_sandbox_escape")
    assert run_python("print(6 * 7)", FAST).stdout.strip() == "42"  # the parent keeps working


def test_calculator():
    assert evaluate("2 + 3 * 4") == 14
    assert evaluate("sqrt(16) + 2^3") == 12
    assert evaluate("10 / 4") == 2.5
    assert evaluate("max(1, 7, 3) - abs(-2)") == 5
    assert evaluate("round(pi, 2)") == 3.14
    for expr, msg in [("9 ** 9 ** 9", "exponent"), ("1 / 0", "division by zero"),
                      ("__import__('os')", "not allowed"), ("(1 + 2", "not an arithmetic"),
                      ("x + 1", "not allowed"), ("", "empty"), ("sqrt(-1)", "sqrt"),
                      ("10.0 ** 400", "too large"), ("1" * 600, "longer than"),
                      ("[i for i in range(9)]", "not allowed"), ("True + 1", "not allowed"),
                      ("1e400", "not a finite"), ("1e400 - 1e400", "not a finite"),
                      ("2e300", "too large"), ("9" * 400, "too large")]:
        with pytest.raises(CalculatorError, match=msg):
            evaluate(expr)


def test_cpu_limit_kills_before_the_wall_clock():
    r = run_python("while True:\n    pass", SandboxLimits(wall_seconds=20.0, cpu_seconds=1))
    assert not r.timed_out and r.render() == "[killed: CPU time limit]" and r.seconds < 10


def _play(env, seed, actions=None):
    obs, info = env.reset(seed=seed)
    infos, done, k = [], False, 0
    while not done:
        a = env.oracle_action() if actions is None else actions[k]
        k += 1
        obs, r, term, trunc, info = env.step(a)
        infos.append((obs, r, info))
        done = term or trunc
    return infos


def test_tool_envs_registered_check_env_and_oracles_solve():
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import turngym  # noqa: F401
    for env_id in ("turngym/ToolMath-v0", "turngym/ToolShop-v0"):
        env = gym.make(env_id, split="test")
        check_env(env.unwrapped)
        obs, info = env.reset(seed=0)
        assert "<tools>" in obs and "gold" not in obs.lower()
        wins = sum(_play(env.unwrapped, s)[-1][2]["won"] for s in range(20))
        assert wins == 20, env_id


def test_tool_env_error_paths_are_observations():
    from turngym.envs.tools.shop_env import ToolShopEnv

    env = ToolShopEnv(max_turns=6)
    env.reset(seed=1)
    steps = [
        "I will help you.",  # neither a call nor an answer
        '<tool_call>{"name": "find_user", "arguments": {"name": 3}}</tool_call>',
        '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_order" "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_order", "arguments": {"order_id": "#W1000"}}',
    ]
    expect = ["Invalid response", "must be string", "unknown tool", "not valid JSON", "cut off"]
    for a, e in zip(steps, expect):
        obs, r, term, trunc, info = env.step(a)
        assert e in obs and r == 0.0 and not info["valid_action"]
    assert env.total_invalid == 4 and env.total_calls == 4
    obs, r, term, trunc, info = env.step("<answer> done </answer>")  # nothing was done
    assert term and r == 0.0 and not info["won"]


def test_shop_reward_needs_exactly_the_gold_database_and_replay_is_deterministic():
    from turngym.envs.tools.shop_env import ToolShopEnv

    env = ToolShopEnv()
    env.reset(seed=2)
    gold = env.gold_calls
    import json as _json
    acts = [f'<tool_call>{_json.dumps({"name": n, "arguments": a})}</tool_call>' for n, a in gold]
    # do the right thing, then one thing too many: the database differs from gold
    extra = [o for o, v in env.db["orders"].items() if v["status"] == "pending"
             and o not in str(gold)][0]
    over = acts + [f'<tool_call>{_json.dumps({"name": "change_address", "arguments": {"order_id": extra, "address": "1 Nowhere"}})}</tool_call>',
                   "<answer> done </answer>"]
    assert _play(env, 2, over)[-1][1] == 0.0
    assert _play(env, 2, acts + ["<answer> done </answer>"])[-1][1] == 1.0
    a = [x[0] for x in _play(ToolShopEnv(), 2, acts + ["<answer> done </answer>"])]
    b = [x[0] for x in _play(ToolShopEnv(), 2, acts + ["<answer> done </answer>"])]
    assert a == b
    env.reset(seed=2)
    env.step(acts[0])
    snap = env.snapshot()
    o1 = env.step(acts[1])[0]
    env.restore(snap)
    assert env.step(acts[1])[0] == o1


def test_math_env_scores_numbers_and_runs_python_tool():
    from turngym.envs.tools.math_env import ToolMathEnv

    env = ToolMathEnv(split="train")
    env.reset(seed=4)
    gold = float(env.task_info()["gold_answer"][0])
    obs, *_ = env.step('<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}'
                       '</tool_call>')
    assert "42" in obs
    _, r, term, _, info = env.step(f"<answer> The total is {gold:,.6g} </answer>")
    assert term and r == 1.0 and info["won"]
    env.reset(seed=4)
    assert env.step("<answer> 0.5 </answer>")[1] == 0.0


def test_padded_keys_from_word_level_detokenisers_still_parse():
    r = parse_tool_calls('<tool_call> {" name ": " get_order ", " arguments ": '
                         '{" order_id ": " # w1003 "}} </tool_call>')
    assert r.calls == (ToolCall("get_order", {"order_id": " # w1003 "}),)
    from turngym.envs.tools.shop_env import ToolShopEnv
    env = ToolShopEnv()
    env.reset(seed=0)
    oid = sorted(env.db["orders"])[3]
    messy = " ".join(oid.lower())
    obs, *_ = env.step(f'<tool_call>{{"name": "get_order", "arguments": {{"order_id": "{messy}"}}}}'
                       '</tool_call>')
    assert '"status"' in obs


def test_rollout_on_tool_envs_reports_call_metrics(tiny_stack):
    import gymnasium as gym

    from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
    from turngym.trainers.summary import format_report, summarize

    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    for env_id in ("turngym/ToolMath-v0", "turngym/ToolShop-v0"):
        pool = EnvPool(lambda: gym.make(env_id, split="test", max_turns=3))
        groups = rollout(policy, prompter, pool, [0, 1], 2,
                         RolloutConfig(max_turns=4, max_new_tokens=8, action_parser="raw"))
        m = summarize(groups)
        assert m["episodes"] == 4 and "tool_calls_per_episode" in m
        assert 0.0 <= m["invalid_call_rate"] <= 1.0
        assert "tool calls/episode" in format_report("x", m)


@pytest.mark.parametrize("config", ["tool_math_grpo", "tool_shop_grpo"])
def test_tool_configs_run_end_to_end(tmp_path, config):
    from turngym.config import load_config
    from turngym.trainers.pipeline import train

    cfg = load_config(config, [f"output_dir={tmp_path / 'run'}", "warmstart.num_demos=16",
                               "warmstart.epochs=1", "warmstart.batch_size=8",
                               "model.hidden_size=32", "model.num_layers=1",
                               "model.num_heads=2", "rl.steps=1", "rl.tasks_per_step=2",
                               "rl.group_size=2", "eval.num_tasks=3", "eval.every=0",
                               "checkpoint.every=1"])
    summary = train(cfg, progress=False)
    m = summary["final_eval"]["test"]
    assert m["episodes"] == 3 and "invalid_call_rate" in m


def test_spaced_decimals_from_word_level_detokenisers():
    from turngym.envs.tools.math_env import ToolMathEnv

    assert evaluate("19 / 15 . 4") == pytest.approx(19 / 15.4)
    env = ToolMathEnv()
    env.reset(seed=0)
    gold = env.task_info()["gold_answer"][0]
    spaced = " . ".join(gold.split(".")) if "." in gold else gold
    assert env.step(f"<answer> {spaced} </answer>")[1] == 1.0


def test_train_and_test_splits_share_no_problem_and_cover_every_kind():
    """ToolMath: no test problem text is ever a training problem (one template has only
    2,360 distinct problems); ToolShop: both splits hold every task kind."""
    from turngym.envs.tools.math_env import _TEMPLATES, split_problem
    from turngym.envs.tools.shop_env import ToolShopEnv
    train = {split_problem("train", i)[1] for i in range(20000)}
    test = [split_problem("test", i) for i in range(1000)]
    assert not train & {t for _, t, _ in test}
    assert {k % len(_TEMPLATES) for k, _, _ in test} == set(range(len(_TEMPLATES)))
    assert len({t for _, t, _ in test}) > 900  # held-out problems, not one repeated

    def kind(calls):
        names = [n for n, _ in calls]
        return ("cancel_latest" if "list_orders" in names else
                next(n for n in names if n != "find_user"))
    for split in ("train", "test"):
        env = ToolShopEnv(split=split)
        kinds = []
        for s in range(40):
            env.reset(seed=s)
            kinds.append(kind(env.gold_calls))
        counts = {k: kinds.count(k) for k in set(kinds)}
        assert counts == {"cancel_order": 10, "change_address": 10, "refund_order": 10,
                          "cancel_latest": 10}, (split, counts)


def test_a_long_raw_response_reaches_the_env_whole_and_the_env_says_it_cut_it():
    """The raw parser hands the env the whole response: the env's own bound applies and
    the agent is told (the parser used to cut at 8,192 characters without a word)."""
    from turngym.agents.parsing import get_parser
    from turngym.envs.tools.shop_env import ToolShopEnv

    env = ToolShopEnv(max_turns=6)
    env.reset(seed=1)
    text = "x" * (env.max_action_length + 100) + "<answer> done </answer>"
    parsed = get_parser("raw")(text)
    assert parsed.action == text
    obs, _, _, _, info = env.step(parsed.action)
    assert info["action_truncated"] and f"longer than {env.max_action_length}" in obs
