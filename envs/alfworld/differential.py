"""Differential check of our household rules (``envs/textworld``) against ALFWorld's engine.

Each task of our generator is written as an ALFWorld game (:mod:`.convert`) and played
in both engines side by side: ours (:class:`~turngym.envs.textworld.engine.World`) and
ALFWorld's (textworld's PDDL backend with ALFWorld's wrappers, exactly as
``AlfredTWEnv`` builds it).  After every action the feedback strings, the admissible
commands (as lists: order included) and success are compared, and the intro once.

Action policies (each a function of both engines' current state):

* ``oracle``: our expert; it must win in both engines;
* ``noisy``: the expert with 30 % random ALFWorld-admissible detours (it recovers);
* ``random``: uniformly random ALFWorld-admissible commands;
* ``invalid``: the expert interleaved with commands ALFWorld refuses (wrong place,
  objects not held, unknown verbs, words our parser would map to a valid command only
  through a synonym are excluded: that leniency is documented, see ``LENIENT``).

``python -m turngym.envs.alfworld.differential --tasks 30`` prints a report.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..textworld.engine import World
from ..textworld.generator import SPLITS, Task, WorldConfig, sample_task
from ..textworld.oracle import next_action, solve
from .convert import write_game

POLICIES = ("oracle", "noisy", "random", "invalid")

# commands our parser accepts through a synonym or normalisation while ALFWorld, which
# matches the exact command string, answers "Nothing happens." (documented leniency)
LENIENT = ("put {o} in {r}", "put {o} on {r}", "pick up {o} from {r}", "Go To {r}",
           "go  to {r}", "look.", "inv")


@dataclass(frozen=True)
class Difference:
    task_id: str
    policy: str
    step: int  # 0 = the intro, k = after the k-th action
    action: str
    kind: str  # intro | feedback | admissible | won
    ours: object
    alfworld: object


@dataclass
class Outcome:
    task_id: str
    policy: str
    actions: list[str]
    won_ours: bool
    won_alfworld: bool
    differences: list[Difference]


def start_alfworld_game(game_file: str | Path):
    """ALFWorld's text env for one game file, built as ``AlfredTWEnv.init_env`` builds it
    (demangled names, admissible commands, ``won``)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    return textworld.start(str(game_file), request_infos=infos,
                           wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])


def _invalid_command(task: Task, world: World, rng: random.Random) -> str:
    objects = [o for o, _ in task.placements]
    recs = list(task.layout.receptacles)
    s = world.state
    elsewhere = [r for r in recs if r != s.location] or recs
    not_held = [o for o in objects if o != s.holding] or objects
    forms = [
        f"take {rng.choice(not_held)} from {rng.choice(elsewhere)}",
        f"move {rng.choice(not_held)} to {rng.choice(recs)}",
        f"heat {rng.choice(not_held)} with {rng.choice(recs)}",
        f"cool {rng.choice(objects)} with {rng.choice(elsewhere)}",
        f"clean {rng.choice(not_held)} with {rng.choice(recs)}",
        f"slice {rng.choice(objects)} with {rng.choice(objects)}",
        f"open {rng.choice(elsewhere)}",
        f"close {rng.choice(recs)}",
        f"examine {rng.choice(not_held)}",
        f"examine {rng.choice(elsewhere)}",
        f"use {rng.choice(objects)}",
        "go to the moon", "dance", "", "take", "go to cabinet 99",
    ]
    if s.location is not None:
        forms.append(f"go to {s.location}")  # already there
    return rng.choice(forms)


def _choose(policy: str, task: Task, world: World, admissible: list[str],
            rng: random.Random, step: int) -> str:
    if policy == "oracle":
        return next_action(world)
    if policy == "noisy":
        return rng.choice(admissible) if rng.random() < 0.3 else next_action(world)
    if policy == "random":
        return rng.choice(admissible)
    if policy == "invalid":
        return _invalid_command(task, world, rng) if step % 2 == 0 else next_action(world)
    raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")


def play_both(task: Task, game_file: str | Path, policy: str | Callable, seed: int = 0,
              max_steps: int = 50) -> Outcome:
    """Plays ``task`` in both engines with ``policy`` (a name from ``POLICIES`` or a
    function ``(task, world, alfworld_admissible, rng, step) -> command``)."""
    env = start_alfworld_game(game_file)
    try:
        state = env.reset()
        world = World(task)
        rng = random.Random(seed)
        name = policy if isinstance(policy, str) else getattr(policy, "__name__", "custom")
        diffs: list[Difference] = []

        def compare(step: int, action: str, kind: str, ours, theirs) -> None:
            if ours != theirs:
                diffs.append(Difference(task.task_id, name, step, action, kind, ours, theirs))

        compare(0, "", "intro", world.intro(), state.feedback)
        compare(0, "", "admissible", world.admissible(), list(state["admissible_commands"]))
        actions: list[str] = []
        for step in range(1, max_steps + 1):
            admissible = list(state["admissible_commands"])
            if isinstance(policy, str):
                action = _choose(policy, task, world, admissible, rng, step)
            else:
                action = policy(task, world, admissible, rng, step)
            actions.append(action)
            state, _, done = env.step(action)
            feedback, _ = world.step(action)
            compare(step, action, "feedback", feedback, state.feedback)
            compare(step, action, "admissible", world.admissible(),
                    list(state["admissible_commands"]))
            compare(step, action, "won", world.state.won, bool(state["won"]))
            if done or world.state.won:
                break
        return Outcome(task.task_id, name, actions, world.state.won, bool(state["won"]), diffs)
    finally:
        env.close()


def check_tasks(tasks: list[Task], policies=POLICIES, workdir: str | Path | None = None,
                seed: int = 0) -> list[Outcome]:
    """Writes each task as an ALFWorld game under ``workdir`` and plays every policy."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(workdir or tmp)
        out = []
        for k, task in enumerate(tasks):
            walkthrough = solve(World(task))
            game = write_game(task, root / task.split / task.task_id / "trial_0", walkthrough)
            for p, policy in enumerate(policies):
                out.append(play_both(task, game, policy, seed=seed + 1000 * k + p))
        return out


def report(outcomes: list[Outcome]) -> str:
    lines = []
    kinds = Counter(d.kind for o in outcomes for d in o.differences)
    steps = sum(len(o.actions) for o in outcomes)
    lines.append(f"{len(outcomes)} episodes, {steps} actions, "
                 f"{sum(len(o.differences) for o in outcomes)} differences {dict(kinds)}")
    for p in sorted({o.policy for o in outcomes}):
        mine = [o for o in outcomes if o.policy == p]
        lines.append(f"  {p:8s} won ours {sum(o.won_ours for o in mine)}/{len(mine)}, "
                     f"ALFWorld {sum(o.won_alfworld for o in mine)}/{len(mine)}")
    shown = 0
    for o in outcomes:
        for d in o.differences:
            if shown < 20:
                lines.append(f"  [{d.task_id} {d.policy} step {d.step} {d.action!r}] {d.kind}: "
                             f"ours={d.ours!r} alfworld={d.alfworld!r}")
                shown += 1
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=12, help="tasks per split")
    p.add_argument("--splits", nargs="+", default=["train", "valid_unseen"], choices=SPLITS)
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    cfg = WorldConfig()
    tasks = [sample_task(cfg, s, i) for s in a.splits for i in range(a.tasks)]
    print(report(check_tasks(tasks, a.policies, seed=a.seed)))


if __name__ == "__main__":
    main()
