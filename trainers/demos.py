"""Warm-start demonstrations from an env's expert (``env.unwrapped.oracle_action``).

With ``epsilon`` > 0 the expert's action is replaced at random by an admissible
one (the expert recovers), so the warm-started policy inherits some of that noise
and RL has something real to fix.  Only successful demos are kept.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym

from ..agents.prompting import ChatPrompter
from .batching import TokenRow


@dataclass(frozen=True)
class Demo:
    first_observation: str
    steps: tuple[tuple[str, str], ...]  # (action, observation)
    task_id: str


def collect_demos(make_env: Callable[[], gym.Env], num: int, epsilon: float, seed: int,
                  max_turns: int, progress=None) -> list[Demo]:
    env = make_env()
    expert = getattr(env.unwrapped, "oracle_action", None)
    if expert is None:
        raise TypeError(f"{type(env.unwrapped).__name__} has no oracle_action(); "
                        "disable warmstart or give the env an expert")
    rng = random.Random(seed)
    demos: list[Demo] = []
    attempts = 0
    while len(demos) < num and attempts < 3 * num + 10:
        task_seed = rng.randrange(2**31 - 1)
        attempts += 1
        obs0, info = env.reset(seed=task_seed)
        steps = []
        won = False
        for _ in range(max_turns):
            a = env.unwrapped.oracle_action(rng, epsilon)
            obs, reward, term, trunc, info = env.step(a)
            steps.append((a, obs))
            if term or trunc:
                won = bool(term and reward > 0)
                break
        if won:
            demos.append(Demo(obs0, tuple(steps), str(info.get("task_id", task_seed))))
            if progress is not None:
                progress(1)
    env.close()
    return demos


def demo_texts(demos: list[Demo]) -> list[str]:
    out = []
    for d in demos:
        out.append(d.first_observation)
        for a, o in d.steps:
            out.append(a)
            out.append(o)
    return out


def demo_rows(demos: list[Demo], prompter: ChatPrompter, tokenizer, action_format: str,
              max_tokens: int) -> list[TokenRow]:
    """Token rows with loss on the expert's responses only."""
    eos = tokenizer.eos_token_id
    rows = []
    for d in demos:
        ids = prompter.initial_ids(d.first_observation)
        mask = [0.0] * len(ids)
        for k, (a, o) in enumerate(d.steps):
            resp = list(tokenizer(action_format.format(action=a), add_special_tokens=False)
                        ["input_ids"]) + [eos]
            ids += resp
            mask += [1.0] * len(resp)
            if k + 1 < len(d.steps):
                obs = prompter.observation_ids(o, response_stopped=True)
                ids += obs
                mask += [0.0] * len(obs)
        if len(ids) <= max_tokens:
            rows.append(TokenRow(ids, mask, [0.0] * len(ids), [0.0] * len(ids)))
    return rows
