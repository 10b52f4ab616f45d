"""``agent.show_inventory``: the agent is shown what it holds (the env's ``inventory``
text) after every observation -- in rollouts and in the warm-start demos alike."""

import re

import gymnasium as gym
import pytest
from test_rollout import ScriptedPolicy
from turngym.agents import EnvPool, RolloutConfig, rollout
from turngym.agents.observation import ObservationView, render_observation
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.demos import collect_demos

TAKE = re.compile(r"^take (.+) from ")


def test_info_inventory_is_what_the_inventory_command_prints():
    env = TextWorldEnv(max_turns=40)
    checked_holding = 0
    for task in range(6):
        _, info = env.reset(seed=task)
        assert info["inventory"] == "You are not carrying anything."
        for _ in range(30):
            before = info["inventory"]
            snap = env.snapshot()
            printed, *_ = env.step("inventory")
            env.restore(snap)
            assert printed == before
            checked_holding += before.startswith("You are carrying")
            action = env.oracle_action()
            _, _, term, trunc, info = env.step(action)
            if m := TAKE.match(action):
                assert info["inventory"] == f"You are carrying: a {m.group(1)}."
            if term or trunc:
                break
    assert checked_holding > 0


def test_render_puts_the_inventory_before_the_admissible_list():
    info = {"inventory": "You are carrying: a mug 2.", "admissible_commands": ["look"]}
    assert render_observation("obs", info, True, True) == \
        "obs\nYou are carrying: a mug 2.\nAdmissible: look"
    assert render_observation("obs", info, False, True) == "obs\nYou are carrying: a mug 2."
    assert render_observation("obs", info) == "obs"


def test_demos_show_the_held_instance_after_each_take():
    make = lambda: TextWorldEnv(max_turns=30)
    demos = collect_demos(make, 10, 0.0, 0, 30, view=ObservationView(inventory=True))
    plain = collect_demos(make, 10, 0.0, 0, 30)
    takes = 0
    for d, p in zip(demos, plain):
        assert d.first_observation == p.first_observation + "\nYou are not carrying anything."
        assert [a for a, _, _ in d.steps] == [a for a, _, _ in p.steps]  # same expert
        for (a, shown, _), (_, obs, _) in zip(d.steps, p.steps):
            assert shown.startswith(obs + "\n")
            if m := TAKE.match(a):
                takes += 1
                assert shown.endswith(f"\nYou are carrying: a {m.group(1)}.")
    assert takes >= 10


def test_rollout_shows_the_inventory_as_tokens_of_the_next_prompt(tiny_stack):
    tok, _, prompter = tiny_stack
    pol = ScriptedPolicy(tok, [f"<action> look </action> {tok.eos_token}"])
    plain = ScriptedPolicy(tok, [f"<action> look </action> {tok.eos_token}"])
    for p, show in ((pol, True), (plain, False)):
        (g,) = rollout(p, prompter, EnvPool(lambda: TextWorldEnv()), [0], 1,
                       RolloutConfig(max_turns=2, max_new_tokens=8, show_inventory=show))
        t0 = g.trajectories[0].turns[0]
        assert t0.observation.endswith("\nYou are not carrying anything.") == show
    # the line is in the next prompt's tokens, once for the reset and once for turn 0
    line = tok.decode(tok("You are not carrying anything.", add_special_tokens=False)["input_ids"])
    assert tok.decode(pol.prompts[1][0]).count(line) == 2
    assert tok.decode(plain.prompts[1][0]).count(line) == 0


def test_an_env_without_an_inventory_is_refused_at_the_first_reset(tiny_stack):
    tok, _, prompter = tiny_stack
    pol = ScriptedPolicy(tok, [f"<action> look </action> {tok.eos_token}"])
    with pytest.raises(ValueError, match="show_inventory needs an env whose info carries"):
        rollout(pol, prompter, EnvPool(lambda: gym.make("turngym/ToolMath-v0")), [0], 1,
                RolloutConfig(max_turns=2, max_new_tokens=8, show_inventory=True))
