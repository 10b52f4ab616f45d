"""Untrusted actions stay cheap and never crash an env (issue 14): linear-time parsing of
tool calls and search tags, the declared action length enforced before parsing, deeply
nested JSON as an ``invalid_call`` observation; and no reward after an episode ended."""

from __future__ import annotations

import json
import random
import re
import time

import gymnasium as gym
import pytest
from turngym.envs.search.protocol import parse_search_action
from turngym.envs.tools import CallError, ToolCall, parse_tool_calls
from turngym.envs.tools.calls import MAX_JSON_DEPTH, json_depth
from turngym.envs.tools.shop_env import ToolShopEnv

import turngym  # noqa: F401

# the parser the envs used before: the reference for what honest responses must give
_OLD_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OLD_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _old_structure(text: str, max_calls: int):
    bodies = [m.group(1) for m in _OLD_CALL.finditer(text)]
    tail = _OLD_CALL.sub("", text)
    n = len(bodies) + ("<tool_call>" in tail)
    am = _OLD_ANSWER.search(tail)
    answer = " ".join(am.group(1).split()) if am else None
    return bodies[:max_calls], n, answer or None


def test_tool_call_parser_finds_what_the_regex_found():
    rng = random.Random(0)
    pieces = ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<tool_", "call>",
              '{"name": "f", "arguments": {"a": 1}}', "x", " ", "{", "}"]
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        bodies, n, answer = _old_structure(text, 3)
        new = parse_tool_calls(text, max_calls=3)
        assert new.answer == answer, text
        want = [parse_tool_calls(f"<tool_call>{b}</tool_call>").calls[0] for b in bodies]
        if n > 3:
            want = want[:3] + [CallError("at most 3 calls per turn")]
        elif n > len(bodies):
            want.append(CallError("a <tool_call> was cut off before </tool_call>"))
        assert list(new.calls) == want, text


class _Counting(str):
    """A string that counts how many characters ``find`` looked at."""
    scanned = 0

    def find(self, sub, start=0, end=None):
        i = str.find(self, sub, start, len(self) if end is None else end)
        _Counting.scanned += (len(self) if i < 0 else i + len(sub)) - start
        return i


ADVERSARIAL = {  # shapes that made the old regex quadratic (171 kB took 71 s)
    "unclosed calls": lambda n: "<tool_call>" * n,
    "one close at the end": lambda n: "<tool_call>" * n + "</tool_call>",
    "unclosed answers": lambda n: "<answer>x" * n,
    "calls then unclosed": lambda n: '<tool_call>{"name": "a"}</tool_call>' * 4
                                     + "<tool_call>{" * n,
}


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_tool_call_parsing_is_linear(shape):
    for n in (1_000, 20_000):  # ~11 kB and ~220 kB
        text = _Counting(ADVERSARIAL[shape](n))
        _Counting.scanned = 0
        t0 = time.perf_counter()
        parse_tool_calls(text, max_calls=4)
        took = time.perf_counter() - t0
        # every character is looked at a bounded number of times (quadratic: ~n/2 each)
        assert _Counting.scanned <= 2 * len(text) + 64, (shape, n, _Counting.scanned)
        assert took < 1.0, (shape, n, took)  # generous: it takes milliseconds


def test_search_tag_parsing_is_linear_and_unchanged():
    old = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
    rng = random.Random(1)
    pieces = ["<search>", "</search>", "<answer>", "</answer>", "q", " ", "</"]
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        m, a = old.search(text), parse_search_action(text, 10_000)
        content = " ".join(m.group(2).split()) if m else ""
        if m and content:
            assert (a.kind, a.content) == (m.group(1), content), text
        else:
            assert a.kind == "invalid", text
    for text in ("<search>" * 25_000, "<answer>x" * 25_000 + "</search>"):  # 200 kB
        t0 = time.perf_counter()
        assert parse_search_action(text, 2048).kind == "invalid"
        assert time.perf_counter() - t0 < 1.0  # the regex took over a minute


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deep_nesting_and_huge_numbers_are_invalid_calls_not_crashes():
    # issue 14: a 2,043-character call inside the old 2,048 limit raised RecursionError
    call = '<tool_call>{"name": "find_user", "arguments": {"name": ' + _nested(987) + "}}" \
           "</tool_call>"
    assert len(call) == 2043
    r = parse_tool_calls(call)
    assert r.invalid == 1 and "nested 989 levels deep" in r.calls[0].message
    for body in (_nested(100_000), '{"name": "f", "arguments": "' + _nested(5000) + '"}',
                 '{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}"):
        r = parse_tool_calls(f"<tool_call>{body}</tool_call>")
        assert r.invalid == 1 and isinstance(r.calls[0], CallError), body[:40]
    ok = '{"name": "f", "arguments": {"x": ' + _nested(MAX_JSON_DEPTH - 2) + "}}"
    assert parse_tool_calls(f"<tool_call>{ok}</tool_call>").calls[0] == \
        ToolCall("f", {"x": json.loads(_nested(MAX_JSON_DEPTH - 2))})
    assert json_depth('{"a": "[[[{{{\\"[", "b": [1, {"c": []}]}') == 4

    env = ToolShopEnv()
    env.reset(seed=0)
    obs, _, term, _, info = env.step(call)
    assert "nested" in obs and info["invalid_calls"] == 1 and not term
    obs, _, _, _, info = env.step(env.oracle_action())  # the episode goes on normally
    assert "Error" not in obs and info["invalid_calls"] == 0


def test_tool_envs_cut_actions_at_their_declared_length():
    env = ToolShopEnv()
    assert env.action_space.max_length == env.max_action_length == 16384
    env.reset(seed=0)
    honest = env.oracle_action()
    obs, _, _, _, info = env.step(honest + " " * 100)
    assert not info["action_truncated"] and not obs.startswith("Note")
    t0 = time.perf_counter()
    obs, _, _, _, info = env.step("<tool_call>" * 20_000)  # 220 kB
    assert time.perf_counter() - t0 < 1.0
    assert info["action_truncated"] and obs.startswith("Note: the response was longer than "
                                                       "16384 characters")
    assert "cut off" in obs and info["invalid_calls"] == 1
    # a call that starts beyond the limit is not read at all
    env.reset(seed=0)
    obs, _, _, _, info = env.step("x" * 20_000 + env.oracle_action())
    assert info["action_truncated"] and info["tool_calls"] == 0 and not info["valid_action"]


def test_textworld_pays_a_win_once_and_refuses_to_step_on():
    env = gym.make("turngym/TextWorld-v0", split="valid_seen")
    env.reset(seed=3)
    rewards, done = [], False
    while not done:
        _, reward, term, trunc, info = env.step(env.unwrapped.oracle_action())
        rewards.append(reward)
        done = term or trunc
    assert term and info["won"] and rewards[-1] == 1.0 and sum(rewards) == 1.0
    for action in ("look", "inventory"):
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step(action)
    env.reset(seed=3)  # a new episode steps again
    assert env.step("look")[1] == 0.0


def test_textworld_truncation_also_ends_the_episode():
    from turngym.envs.textworld.env import TextWorldEnv

    env = TextWorldEnv(split="train")  # the step limit is its default (ALFWorld's 50)
    env.reset(seed=0)
    snap = env.snapshot()
    trunc = term = False
    while not (term or trunc):
        _, reward, term, trunc, _ = env.step("look")
    assert trunc and not term and reward == 0.0 and env.world.state.steps == 50
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("look")
    env.restore(snap)  # back to a live state: stepping is legal again
    assert env.step("look")[2:4] == (False, False)
