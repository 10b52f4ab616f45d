"""Text-world env steps/s on one core (goal >= 1000 steps/s).

Drives the full gymnasium stack (``gymnasium.make`` wrappers included) with a
mix of oracle and random admissible actions, as a rollout would.
"""

from __future__ import annotations

import argparse
import random
import time

import gymnasium as gym

import turngym  # noqa: F401


def run(steps: int, seed: int = 0) -> float:
    env = gym.make("turngym/TextWorld-v0")
    rng = random.Random(seed)
    obs, info = env.reset(seed=0)
    task = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        if rng.random() < 0.3:
            a = rng.choice(info["admissible_commands"])
        else:
            a = env.unwrapped.oracle_action()
        obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            task += 1
            obs, info = env.reset(seed=task)
    dt = time.perf_counter() - t0
    return steps / dt


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20000)
    a = p.parse_args()
    sps = run(a.steps)
    print(f"textworld env: {sps:,.0f} steps/s (goal 1000) -> ratio {sps / 1000:.1f}x")
