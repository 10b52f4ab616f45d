"""Text-world env steps/s on one core (goal >= 1000 steps/s), and side by side with the
real engines on comparable games, as ratios, in one run.

1. ``turngym/TextWorld-v0`` through the full gymnasium stack (``gymnasium.make``
   wrappers included) with a mix of oracle and random admissible actions, as a rollout
   would (the goal line).
2. Random admissible actions, resets on episode end, for a fixed time each:

   * ours on our generated tasks;
   * ALFWorld's engine (textworld's PDDL backend with ALFWorld's domain, grammar and
     wrappers) on the SAME tasks, written as ALFWorld games (needs ``alfworld``), raw and
     through ``turngym/ALFWorld-v0``;
   * TextWorld's engine on a ``tw-make tw-simple`` game generated here (needs
     ``textworld``), raw and through ``turngym/TextWorldGame-v0``.

Engines that are not installed are reported as skipped.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def random_play_gym(env, seeds: list[int], seconds: float, seed: int = 0) -> float:
    """Steps/s of a gymnasium text env under random admissible actions."""
    rng = random.Random(seed)
    k = 0
    obs, info = env.reset(seed=seeds[0])
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        obs, r, term, trunc, info = env.step(rng.choice(info["admissible_commands"]))
        n += 1
        if term or trunc:
            k += 1
            obs, info = env.reset(seed=seeds[k % len(seeds)])
    return n / (time.perf_counter() - t0)


def random_play_textworld(start, games: list[str], seconds: float, seed: int = 0,
                          max_steps: int = 50) -> float:
    """Steps/s of a raw textworld environment (``start(game) -> env``) under random
    admissible actions; a new game after ``max_steps`` or a finished one."""
    rng = random.Random(seed)
    envs = [start(g) for g in games]
    k, steps = 0, 0
    state = envs[0].reset()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        state, _, done = envs[k % len(envs)].step(rng.choice(state["admissible_commands"]))
        n += 1
        steps += 1
        if done or steps >= max_steps:
            k, steps = k + 1, 0
            state = envs[k % len(envs)].reset()
    return n / (time.perf_counter() - t0)


def _line(name: str, sps: float, ours: float) -> str:
    return f"  {name:58s} {sps:10,.0f} steps/s   ours is {ours / sps:8,.0f}x"


def compare(seconds: float, num_tasks: int) -> list[str]:
    from turngym.envs.textworld import World, WorldConfig, sample_task, solve

    lines = ["random admissible actions, side by side (higher is faster):"]
    ours = random_play_gym(gym.make("turngym/TextWorld-v0"), list(range(num_tasks)), seconds)
    lines.append(f"  {'ours: turngym/TextWorld-v0, our generated tasks':58s} {ours:10,.0f} steps/s")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

            from turngym.envs.alfworld.convert import write_data_dir
        except ImportError:
            lines.append("  ALFWorld's engine: skipped (pip install 'turngym[alfworld]')")
        else:
            cfg = WorldConfig()
            tasks = [sample_task(cfg, "train", i) for i in range(num_tasks)]
            root = write_data_dir(Path(tmp) / "alfworld", {"train": tasks},
                                  {t.task_id: solve(World(t)) for t in tasks})
            games = sorted(str(p) for p in root.rglob("game.tw-pddl"))
            infos = textworld.EnvInfos(won=True, admissible_commands=True)

            def start_alfworld(g):
                return textworld.start(g, request_infos=infos,
                                       wrappers=[AlfredDemangler(), AlfredInfos])

            sps = random_play_textworld(start_alfworld, games, seconds)
            lines.append(_line("ALFWorld's engine, the same tasks as ALFWorld games", sps, ours))
            env = gym.make("turngym/ALFWorld-v0", data_dir=str(root))
            sps = random_play_gym(env, list(range(num_tasks)), seconds)
            lines.append(_line("  through turngym/ALFWorld-v0 (+ facts, progress)", sps, ours))
        try:
            import textworld  # noqa: F811
        except ImportError:
            lines.append("  TextWorld's engine: skipped (pip install 'turngym[textworld]')")
        else:
            exe = shutil.which("tw-make") or str(Path(sys.executable).parent / "tw-make")
            game = Path(tmp) / "simple.z8"
            subprocess.run([sys.executable, exe, "tw-simple", "--rewards", "dense", "--goal",
                            "detailed", "--seed", "1", "--output", str(game)], check=True,
                           capture_output=True)
            infos = textworld.EnvInfos(won=True, lost=True, admissible_commands=True)
            sps = random_play_textworld(lambda g: textworld.start(g, request_infos=infos),
                                        [str(game)], seconds)
            lines.append(_line("TextWorld's engine, a tw-make tw-simple game", sps, ours))
            env = gym.make("turngym/TextWorldGame-v0", games=str(game))
            sps = random_play_gym(env, [0], seconds)
            lines.append(_line("  through turngym/TextWorldGame-v0 (+ facts, score)", sps, ours))
    return lines


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--seconds", type=float, default=10.0,
                   help="time per engine in the side-by-side comparison")
    p.add_argument("--tasks", type=int, default=6, help="generated tasks played in it")
    a = p.parse_args()
    sps = run(a.steps)
    print(f"textworld env: {sps:,.0f} steps/s (goal 1000) -> ratio {sps / 1000:.1f}x")
    print("\n".join(compare(a.seconds, a.tasks)))
