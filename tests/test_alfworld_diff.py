"""Our household rules (envs/textworld) against ALFWorld's own engine, and ALFWorld-v0.

Every check plays ALFWorld's real engine (textworld's PDDL backend, ALFWorld's domain,
grammar and wrappers from the installed ``alfworld`` wheel) on games written from our
tasks; nothing here is a stand-in.  Needs ``pip install 'turngym[alfworld]'``.
"""

import json
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from turngym.envs.alfworld import ALFWorldEnv, collect_alfworld_games
from turngym.envs.textworld import World, WorldConfig, sample_task, solve
from turngym.envs.textworld.catalog import (
    CAN_CONTAIN, RECEPTACLE_OBJECTS, RECEPTACLES, ROOMS, SLICEABLE, TRANSFORMABLE,
)
from turngym.envs.textworld.generator import Layout, Task

NEEDS = "ALFWorld's engine: pip install 'turngym[alfworld]'"


def _alfworld():
    pytest.importorskip("textworld", reason=NEEDS)
    return pytest.importorskip("alfworld.agents.environment.alfred_tw_env", reason=NEEDS)


def test_missing_data_raises_promptly_naming_the_directory(tmp_path):
    # ALFWorld's own AlfredTWEnv finds 0 games here and then hangs in reset()
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError) as err:
        gym.make("turngym/ALFWorld-v0", data_dir=tmp_path / "nowhere", split="valid_unseen")
    assert time.perf_counter() - t0 < 5
    msg = str(err.value)
    assert str(tmp_path / "nowhere" / "json_2.1.1" / "valid_unseen") in msg
    assert "alfworld-download" in msg and "ALFWORLD_DATA" in msg
    (tmp_path / "empty" / "json_2.1.1" / "train" / "task" / "trial").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no trials"):
        collect_alfworld_games(tmp_path / "empty", "train")
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        collect_alfworld_games(tmp_path, "test")


def test_missing_data_via_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alf"))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "alf")):
        ALFWorldEnv(split="train")


def test_our_object_tables_are_alfreds():
    _alfworld()
    import alfworld.gen.constants as c

    ours = sorted({o for room in ROOMS.values() for o in room.objects})
    cls = {o.lower(): o for o in c.OBJECTS}
    for rec in RECEPTACLES:
        theirs = {o for o in ours if cls[o] in c.VAL_RECEPTACLE_OBJECTS.get(cls[rec], ())}
        assert CAN_CONTAIN[rec] == theirs, rec
        assert RECEPTACLES[rec] == (cls[rec] in c.OPENABLE_CLASS_SET), rec
    for verb, key in (("heat", "Heatable"), ("cool", "Coolable"), ("clean", "Cleanable")):
        assert TRANSFORMABLE[verb] == {o for o in ours if cls[o] in c.VAL_ACTION_OBJECTS[key]}
    assert SLICEABLE == {o for o in ours if cls[o] in c.VAL_ACTION_OBJECTS["Sliceable"]}
    assert RECEPTACLE_OBJECTS == {o for o in ours if cls[o] in c.MOVABLE_RECEPTACLES}


# ------------------------------------------------------------------ crafted rule checks
def _kitchen(task_type="pick_and_place", target="apple", dest="countertop", placements=None,
             receptacles=("cabinet 1", "cabinet 2", "countertop 1", "countertop 2", "drawer 1",
                          "fridge 1", "microwave 1", "sinkbasin 1")):
    word = {"pick_heat_then_place": "hot", "pick_cool_then_place": "cool",
            "pick_clean_then_place": "clean"}.get(task_type)
    placements = placements or (("apple 1", "countertop 1"), ("cup 1", "countertop 1"),
                                ("knife 1", "drawer 1"), ("lettuce 1", "fridge 1"),
                                ("mug 1", "cabinet 1"))
    lay = Layout(0, "kitchen", receptacles)
    goal = {"pick_two_obj_and_place": f"put two {target} in {dest}."}.get(
        task_type, f"put a {target} in {dest}.")
    return Task("crafted-0", "train", lay, task_type, target, dest, placements, goal, None,
                extra={"state_word": word})


def _play(tmp_path, task, actions):
    from turngym.envs.alfworld.convert import write_game
    from turngym.envs.alfworld.differential import play_both

    game = write_game(task, tmp_path / task.task_id)
    out = play_both(task, game, lambda t, w, adm, rng, step: actions[step - 1],
                    max_steps=len(actions))
    assert out.differences == [], out.differences
    return out


def _feedback(task, actions):
    w = World(task)
    return [w.step(a)[0] for a in actions], w


def test_receptacles_only_take_what_alfred_lets_them_contain(tmp_path):
    _alfworld()
    task = _kitchen()
    actions = ["go to countertop 1", "take cup 1 from countertop 1", "go to drawer 1",
               "open drawer 1", "move cup 1 to drawer 1", "go to cabinet 2", "open cabinet 2",
               "move cup 1 to cabinet 2"]
    _play(tmp_path, task, actions)
    fb, w = _feedback(task, actions)
    assert fb[4] == "Nothing happens."  # a drawer cannot hold a cup (ALFRED canContain)
    assert fb[7] == "You move the cup 1 to the cabinet 2."


def test_only_heatable_objects_heat(tmp_path):
    _alfworld()
    task = _kitchen("pick_cool_then_place", target="lettuce", dest="countertop")
    actions = ["go to fridge 1", "open fridge 1", "take lettuce 1 from fridge 1",
               "go to microwave 1", "heat lettuce 1 with microwave 1", "go to fridge 1",
               "cool lettuce 1 with fridge 1", "examine lettuce 1", "go to countertop 2",
               "move lettuce 1 to countertop 2"]
    out = _play(tmp_path, task, actions)
    fb, w = _feedback(task, actions)
    assert fb[4] == "Nothing happens."  # lettuce is not heatable in ALFRED
    assert fb[6] == "You cool the lettuce 1 using the fridge 1."
    assert fb[7] == "This is a cold lettuce 1."
    assert out.won_ours and out.won_alfworld


def test_pick_two_needs_both_in_one_receptacle(tmp_path):
    _alfworld()
    task = _kitchen("pick_two_obj_and_place", target="apple", dest="countertop",
                    placements=(("apple 1", "cabinet 1"), ("apple 2", "fridge 1"),
                                ("mug 1", "cabinet 1")))
    actions = ["go to cabinet 1", "open cabinet 1", "take apple 1 from cabinet 1",
               "go to countertop 1", "move apple 1 to countertop 1", "go to fridge 1",
               "open fridge 1", "take apple 2 from fridge 1", "go to countertop 2",
               "move apple 2 to countertop 2", "take apple 2 from countertop 2",
               "go to countertop 1", "move apple 2 to countertop 1"]
    out = _play(tmp_path, task, actions)
    w = World(task)
    for a in actions[:10]:
        w.step(a)
    assert not w.state.won and w.progress() == ("placed 1 apple",)  # one on each
    assert out.won_ours and out.won_alfworld and len(out.actions) == len(actions)


def test_examine_slice_help_and_list_order_are_alfworlds(tmp_path):
    _alfworld()
    task = _kitchen(target="mug", dest="countertop",
                    placements=(("apple 1", "countertop 1"), ("apple 2", "countertop 1"),
                                ("knife 1", "countertop 1"), ("mug 1", "cabinet 1"),
                                ("egg 1", "sinkbasin 1")))
    actions = ["help", "go to countertop 1", "take knife 1 from countertop 1",
               "slice apple 2 with knife 1", "move knife 1 to countertop 1",
               "take apple 2 from countertop 1", "examine apple 2", "go to microwave 1",
               "heat apple 2 with microwave 1", "go to sinkbasin 1",
               "clean apple 2 with sinkbasin 1", "examine apple 2", "go to cabinet 1",
               "open cabinet 1", "move apple 2 to cabinet 1", "go to countertop 2",
               "move apple 2 to countertop 2", "go to cabinet 1", "take mug 1 from cabinet 1",
               "examine mug 1"]
    _play(tmp_path, task, actions)
    fb, w = _feedback(task, actions)
    assert fb[0].startswith("Available commands:")
    assert fb[1] == ("You arrive at countertop 1. On the countertop 1, you see a apple 2, "
                     "a apple 1, and a knife 1.")  # highest number first, as ALFWorld lists
    assert fb[3] == "You sliced the apple 2 with the knife 1."
    assert fb[6] == "This is a sliced apple 2."
    assert fb[11] == "This is a hot and clean sliced apple 2."
    assert fb[14] == "Nothing happens."  # a cabinet cannot hold an apple
    assert fb[19] == "This is a normal mug 1. In it, you see nothing."
    assert "a cabinet 2, a cabinet 1" in World(task).intro()


def test_documented_leniency_of_our_parser(tmp_path):
    """Forms only our parser accepts (docs/game_engines.md): ALFWorld matches the exact
    command, we normalise case/spacing and accept ALFWorld's older synonyms."""
    _alfworld()
    from turngym.envs.alfworld.convert import write_game
    from turngym.envs.alfworld.differential import start_alfworld_game

    task = _kitchen()
    env = start_alfworld_game(write_game(task, tmp_path / "lenient"))
    for form in ["Go To countertop 1", "go  to countertop 1", "look.", "inv",
                 "put apple 1 on countertop 2", "pick up apple 1 from countertop 1"]:
        state = env.reset()
        w = World(task)
        setup = ["go to countertop 1", "take apple 1 from countertop 1", "go to countertop 2"]
        if form.startswith("put"):
            for a in setup:
                state, _, _ = env.step(a)
                w.step(a)
        elif form.startswith("pick"):
            state, _, _ = env.step(setup[0])
            w.step(setup[0])
        state, _, _ = env.step(form)
        ours, valid = w.step(form)
        assert state.feedback == "Nothing happens." and valid and ours != "Nothing happens.", form


# ------------------------------------------------------------------ generated tasks
def test_generated_tasks_play_identically_in_both_engines(tmp_path):
    _alfworld()
    from turngym.envs.alfworld.differential import check_tasks

    cfg = WorldConfig()
    tasks = [sample_task(cfg, "train", 4), sample_task(cfg, "valid_unseen", 5)]  # cool, two
    outcomes = check_tasks(tasks, ("oracle", "invalid"), workdir=tmp_path)
    for o in outcomes:
        assert o.differences == [], o.differences[:3]
        assert o.won_ours and o.won_alfworld, (o.task_id, o.policy, o.actions)


@pytest.mark.slow
def test_differential_many_tasks_all_policies(tmp_path):
    _alfworld()
    from turngym.envs.alfworld.differential import POLICIES, check_tasks, report

    cfg = WorldConfig()
    tasks = [sample_task(cfg, s, i) for s in ("train", "valid_unseen") for i in range(12)]
    outcomes = check_tasks(tasks, POLICIES, workdir=tmp_path)
    assert all(o.differences == [] for o in outcomes), report(outcomes)
    for o in outcomes:
        assert o.won_ours == o.won_alfworld
        if o.policy in ("oracle", "invalid"):
            assert o.won_ours, (o.task_id, o.policy)


# ------------------------------------------------------------------ ALFWorld-v0
@pytest.fixture(scope="module")
def alf_data(tmp_path_factory):
    _alfworld()
    from turngym.envs.alfworld.convert import write_data_dir

    cfg = WorldConfig()
    tasks = {s: [sample_task(cfg, s, i) for i in range(3)]
             for s in ("train", "valid_seen", "valid_unseen")}
    walk = {t.task_id: solve(World(t)) for ts in tasks.values() for t in ts}
    root = write_data_dir(tmp_path_factory.mktemp("alfworld"), tasks, walk)
    # trials ALFWorld itself skips: a sliced task, and an unsolvable game
    sliced = root / "json_2.1.1" / "train" / "pick_and_place_simple-AppleSliced-None-Fridge-1"
    (sliced / "trial_T0").mkdir(parents=True)
    for name in ("traj_data.json", "game.tw-pddl"):
        src = next((root / "json_2.1.1" / "train").glob(f"pick_and_place*/trial_*/{name}"))
        (sliced / "trial_T0" / name).write_text(src.read_text())
    return root, tasks


def test_alfworld_env_contract(alf_data):
    root, tasks = alf_data
    env = gym.make("turngym/ALFWorld-v0", data_dir=str(root), split="valid_unseen")
    check_env(env.unwrapped, skip_render_check=True)
    u = env.unwrapped
    assert len(u.game_files) == 3
    obs, info = u.reset(seed=4)  # seed names the game: index 4 % 3
    assert info["task_id"] == "valid_unseen-1"
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    for key in ("admissible_commands", "progress", "state_key", "won", "task_type"):
        assert key in info
    assert info["state_key"] not in obs and "help" in info["admissible_commands"]
    obs2, info2 = u.reset(seed=1)
    assert obs2 == obs and info2["state_key"] == info["state_key"]
    for bad in ("fly away", info["admissible_commands"][0].upper()):  # exact match only
        obs, r, term, trunc, info = u.step(bad)
        assert obs == "Nothing happens." and not info["valid_action"] and r == 0.0


def test_alfworld_env_splits_skip_what_alfworld_skips(alf_data):
    root, tasks = alf_data
    train = ALFWorldEnv(data_dir=root, split="train")
    assert len(train.game_files) == 3  # the sliced trial is not collected
    types = {train.reset(seed=i)[1]["task_type"] for i in range(3)}
    assert types == {"pick_and_place_simple", "look_at_obj_in_light",
                     "pick_clean_then_place_in_recep"}
    only = ALFWorldEnv(data_dir=root, split="train", task_types=[2])
    assert len(only.game_files) == 1
    with pytest.raises(ValueError, match="task type"):
        ALFWorldEnv(data_dir=root, split="train", task_types=[9])


def test_alfworld_env_replay(alf_data):
    import random

    root, tasks = alf_data
    env = ALFWorldEnv(data_dir=root, split="train")
    rng = random.Random(0)
    obs, info = env.reset(seed=0)
    actions, observations, keys = [], [], []
    for _ in range(8):
        a = rng.choice(info["admissible_commands"] + ["nonsense"])
        obs, r, term, trunc, info = env.step(a)
        actions.append(a), observations.append(obs), keys.append(info["state_key"])
        if term or trunc:
            break
    other = ALFWorldEnv(data_dir=root, split="train")
    for k in range(len(actions)):
        o, i = other.replay(0, actions[: k + 1])
        assert o == observations[k] and i["state_key"] == keys[k]


@pytest.mark.slow
def test_alfworld_env_expert_plans_off_the_walkthrough(alf_data):
    root, tasks = alf_data
    env = ALFWorldEnv(data_dir=root, split="train")
    env.reset(seed=0)
    env.step("fly away")  # changes nothing in a PDDL world: still on the walkthrough
    walkthrough = json.loads(env.game_files[0].read_text())["walkthrough"]
    assert env.oracle_action() == walkthrough[0]
    for a in ["help", "inventory", "look"]:  # off the walkthrough: ALFWorld's planner
        env.step(a)
    seen_progress = set()
    for _ in range(40):
        obs, r, term, trunc, info = env.step(env.oracle_action())
        seen_progress.update(info["progress"])
        if term:
            break
    assert info["won"] and r == 1.0
    assert any(p.startswith(("placed", "lamp on")) for p in seen_progress)
