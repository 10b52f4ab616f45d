"""Oracle planner: a state-based expert that solves every task.

It behaves like a fair explorer — receptacles are searched in name order
(``cabinet 1`` before ``cabinet 2``), and only contents the agent has already seen
are used — so its demonstrations are learnable from observations alone.  Being a
function of the current state (not a fixed plan) it recovers from any detour,
which is what makes *noisy* demonstrations (random actions mixed in) possible.
"""

from __future__ import annotations

import random

from .catalog import APPLIANCE
from .engine import World, can_contain
from .generator import rtype


def goal_receptacle(world: World) -> str | None:
    """Where goal objects go: for a pick-two task the destination that already holds
    the most of them (both must share one receptacle), else the one the agent stands
    at, else the first of the destination type."""
    t, s = world.task, world.state
    if t.dest is None:
        return None
    dests = t.layout.of_type(t.dest)
    best = max(dests, key=world.placed_in)
    if t.required_count > 1 and world.placed_in(best) > 0:
        return best
    return s.location if s.location in dests else dests[0]


def next_action(world: World) -> str:
    t, s = world.task, world.state
    target = t.target
    holding = s.holding
    loc = s.location
    word = t.extra.get("state_word")

    def goto_or(rec: str, then: str) -> str:
        if loc != rec:
            return f"go to {rec}"
        if not world.visible(rec):
            return f"open {rec}"
        return then

    goal_rec = goal_receptacle(world)

    def done_obj(o: str, r: str) -> bool:  # already counts for the goal
        return r == goal_rec and world._has_props(o)

    # 1. holding something useless: put it down here (or open here first), or at the
    #    first receptacle that can contain it
    if holding is not None and rtype(holding) != target:
        fits = [r for r in world.receptacles if can_contain(r, holding)]
        if not fits:  # nowhere in this room takes it: the task is lost
            return "look"
        rec = loc if loc in fits else fits[0]
        return goto_or(rec, f"move {holding} to {rec}")

    if holding is not None:
        if word and word not in s.props.get(holding, ()):
            verb = next(v for v, w in (("heat", "hot"), ("cool", "cool"), ("clean", "clean"))
                        if w == word)
            app = world.task.layout.of_type(APPLIANCE[verb])[0]
            if loc != app:
                return f"go to {app}"
            return f"{verb} {holding} with {app}"
        if t.task_type == "look_at_obj_in_light":
            lamp_at = s.where(t.lamp)
            if loc != lamp_at:
                return f"go to {lamp_at}"
            return f"use {t.lamp}"
        return goto_or(goal_rec, f"move {holding} to {goal_rec}")

    # 2. need a target object: use what was seen, else explore in listed order
    for r in world.receptacles:
        if r in s.explored:
            for o in s.contents[r]:
                if rtype(o) == target and not done_obj(o, r):
                    return goto_or(r, f"take {o} from {r}")
    for r in world.receptacles:
        if r not in s.explored:
            return goto_or(r, "look")
    # everything explored and nothing found: should not happen for valid tasks
    return "look"


def solve(world: World, max_steps: int = 50) -> list[str]:
    """Runs the oracle on ``world`` (mutating it) and returns the actions taken."""
    actions = []
    while not world.state.won and len(actions) < max_steps:
        a = next_action(world)
        world.step(a)
        actions.append(a)
    return actions


def noisy_action(world: World, rng: random.Random, epsilon: float) -> str:
    """Oracle action, replaced with probability ``epsilon`` by a random admissible one."""
    if rng.random() < epsilon:
        return rng.choice(world.admissible())
    return next_action(world)
