"""Rules of the household world, one scripted episode per task type."""

import pytest

from turngym.envs.textworld import NOTHING, TASK_TYPES, World, WorldConfig, sample_task, solve
from turngym.envs.textworld.generator import Layout, Task

CFG = WorldConfig()


def _kitchen_task(task_type, target="apple", dest="countertop", placements=None):
    lay = Layout(0, "kitchen", ("cabinet 1", "countertop 1", "diningtable 1", "fridge 1",
                                "microwave 1", "sinkbasin 1"))
    placements = placements or (("apple 1", "cabinet 1"), ("mug 1", "diningtable 1"))
    word = {"pick_heat_then_place": "hot", "pick_cool_then_place": "cool",
            "pick_clean_then_place": "clean"}.get(task_type)
    return World(Task("t", "train", lay, task_type, target, dest, placements, "goal", None,
                      extra={"state_word": word}))


def test_open_before_take_and_one_held_object():
    w = _kitchen_task("pick_and_place")
    assert w.step("go to cabinet 1") == ("You arrive at cabinet 1. The cabinet 1 is closed.", True)
    assert w.step("take apple 1 from cabinet 1") == (NOTHING, False)  # closed
    out, ok = w.step("open cabinet 1")
    assert ok and out == "You open the cabinet 1. The cabinet 1 is open. In it, you see a apple 1."
    assert w.step("take apple 1 from cabinet 1") == ("You pick up the apple 1 from the cabinet 1.", True)
    w.step("go to diningtable 1")
    assert w.step("take mug 1 from diningtable 1") == (NOTHING, False)  # hands full
    assert w.step("inventory") == ("You are carrying: a apple 1.", True)


def test_pick_and_place_reward_only_on_success():
    w = _kitchen_task("pick_and_place", dest="countertop")
    for a in ["go to cabinet 1", "open cabinet 1", "take apple 1 from cabinet 1",
              "go to diningtable 1", "move apple 1 to diningtable 1"]:
        w.step(a)
        assert not w.state.won  # wrong receptacle does not count
    w.step("take apple 1 from diningtable 1")
    w.step("go to countertop 1")
    out, ok = w.step("put apple 1 on countertop 1")  # ALFWorld's older "put" form
    assert ok and out == "You move the apple 1 to the countertop 1." and w.state.won


@pytest.mark.parametrize("task_type,verb,app,word", [
    ("pick_heat_then_place", "heat", "microwave 1", "hot"),
    ("pick_cool_then_place", "cool", "fridge 1", "cool"),
    ("pick_clean_then_place", "clean", "sinkbasin 1", "clean"),
])
def test_transform_tasks_need_the_right_appliance(task_type, verb, app, word):
    w = _kitchen_task(task_type)
    for a in ["go to cabinet 1", "open cabinet 1", "take apple 1 from cabinet 1"]:
        w.step(a)
    assert w.step(f"{verb} apple 1 with {app}") == (NOTHING, False)  # not at the appliance
    w.step("go to countertop 1")
    w.step("move apple 1 to countertop 1")
    assert not w.state.won  # placed, but not transformed
    w.step("take apple 1 from countertop 1")
    wrong = "sinkbasin 1" if app != "sinkbasin 1" else "microwave 1"
    w.step(f"go to {wrong}")
    assert w.step(f"{verb} apple 1 with {wrong}") == (NOTHING, False)
    w.step(f"go to {app}")
    assert w.step(f"{verb} apple 1 with {app}") == (f"You {verb} the apple 1 using the {app}.", True)
    assert word in w.state.props["apple 1"]
    w.step("go to countertop 1")
    w.step("move apple 1 to countertop 1")
    assert w.state.won


def test_pick_two_needs_two_objects():
    w = _kitchen_task("pick_two_obj_and_place", target="mug", dest="countertop",
                      placements=(("mug 1", "diningtable 1"), ("mug 2", "diningtable 1")))
    for a in ["go to diningtable 1", "take mug 1 from diningtable 1", "go to countertop 1",
              "move mug 1 to countertop 1"]:
        w.step(a)
    assert not w.state.won and w.progress() == ("placed 1 mug",)
    for a in ["go to diningtable 1", "take mug 2 from diningtable 1", "go to countertop 1",
              "move mug 2 to countertop 1"]:
        w.step(a)
    assert w.state.won


def test_look_at_in_light():
    lay = Layout(0, "bedroom", ("bed 1", "desk 1", "drawer 1"))
    w = World(Task("t", "train", lay, "look_at_obj_in_light", "book", None,
                   (("book 1", "bed 1"), ("desklamp 1", "desk 1")), "look at book under the desklamp.",
                   "desklamp 1", extra={"state_word": None}))
    w.step("go to desk 1")
    assert w.step("take desklamp 1 from desk 1") == (NOTHING, False)  # lamps are fixed
    assert w.step("use desklamp 1") == ("You turn on the desklamp 1.", True)
    assert not w.state.won  # lamp on but not holding the book
    w.step("go to bed 1")
    w.step("take book 1 from bed 1")
    assert not w.state.won
    w.step("go to desk 1")
    assert w.state.won


def test_invalid_commands_say_nothing_happens():
    w = _kitchen_task("pick_and_place")
    for bad in ["", "fly to the moon", "go to cabinet 9", "open countertop 1", "take apple 1",
                "move apple 1 to cabinet 1", "use microwave 1", "examine cabinet 1"]:
        assert w.step(bad) == (NOTHING, False)
    w.step("go to cabinet 1")
    assert w.step("go to cabinet 1") == (NOTHING, False)  # already there


def test_every_admissible_command_is_valid():
    for i in range(40):
        w = World(sample_task(CFG, "train", i))
        for _ in range(12):
            snap = w.state.copy()
            for cmd in w.admissible():
                w.state = snap.copy()
                _, ok = w.step(cmd)
                assert ok, (cmd, w.task.task_id)
            w.state = snap
            w.step(w.admissible()[i % len(w.admissible())])


def test_goal_text_and_intro_are_alfworld_style():
    w = World(sample_task(CFG, "train", 0))
    intro = w.intro()
    assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert "Your task is to: " in intro
    assert all(r in intro for r in w.receptacles)


def test_task_types_cycle_and_splits():
    types = [sample_task(CFG, "train", i).task_type for i in range(12)]
    assert types == list(TASK_TYPES) * 2
    with pytest.raises(ValueError):
        sample_task(CFG, "test", 0)
    with pytest.raises(ValueError):
        WorldConfig(task_types=("dance",))


def test_unseen_layouts_never_appear_in_training():
    seen = {sample_task(CFG, "train", i).layout.receptacles for i in range(400)}
    seen |= {sample_task(CFG, "valid_seen", i).layout.receptacles for i in range(200)}
    unseen = {sample_task(CFG, "valid_unseen", i).layout.receptacles for i in range(200)}
    assert seen and unseen and not (seen & unseen)


def test_oracle_solves_all_500_tasks_per_split():
    for split in ("train", "valid_unseen"):
        for i in range(500):
            w = World(sample_task(CFG, split, i))
            actions = solve(w, max_steps=50)
            assert w.state.won, (split, i, w.task.task_type, actions)


# ALFWorld rules found by the differential check against ALFWorld's own engine
# (tests/test_alfworld_diff.py plays the same sequences there when alfworld is installed)
def test_receptacles_take_only_what_alfred_says_they_contain():
    w = _kitchen_task("pick_and_place", placements=(("apple 1", "diningtable 1"),
                                                    ("mug 1", "diningtable 1")))
    w.step("go to diningtable 1")
    w.step("take apple 1 from diningtable 1")
    w.step("go to cabinet 1")
    w.step("open cabinet 1")
    assert "move apple 1 to cabinet 1" not in w.admissible()
    assert w.step("move apple 1 to cabinet 1") == (NOTHING, False)  # no apples in cabinets
    w.step("go to fridge 1")
    w.step("open fridge 1")
    assert w.step("move apple 1 to fridge 1") == ("You move the apple 1 to the fridge 1.", True)


def test_only_transformable_objects_transform_and_examine_says_so():
    w = _kitchen_task("pick_cool_then_place", target="lettuce",
                      placements=(("lettuce 1", "diningtable 1"),))
    w.step("go to diningtable 1")
    w.step("take lettuce 1 from diningtable 1")
    w.step("go to microwave 1")
    assert w.step("heat lettuce 1 with microwave 1") == (NOTHING, False)
    assert w.admissible() == sorted(w.admissible()) and "help" in w.admissible()
    w.step("go to fridge 1")
    w.step("cool lettuce 1 with fridge 1")
    assert w.step("examine lettuce 1") == ("This is a cold lettuce 1.", True)


def test_pick_two_counts_one_receptacle_and_lists_run_high_to_low():
    lay = Layout(0, "kitchen", ("countertop 1", "countertop 2", "diningtable 1"))
    w = World(Task("t", "train", lay, "pick_two_obj_and_place", "mug", "countertop",
                   (("mug 1", "diningtable 1"), ("mug 2", "diningtable 1")), "goal", None,
                   extra={"state_word": None}))
    assert w.step("go to diningtable 1")[0] == ("You arrive at diningtable 1. On the "
                                                "diningtable 1, you see a mug 2, and a mug 1.")
    for a in ["take mug 1 from diningtable 1", "go to countertop 1", "move mug 1 to countertop 1",
              "go to diningtable 1", "take mug 2 from diningtable 1", "go to countertop 2",
              "move mug 2 to countertop 2"]:
        w.step(a)
    assert not w.state.won  # one mug on each countertop
    assert solve(w) and w.state.won  # the oracle gathers both on one


def test_laundryhamper_is_open_and_help_is_a_command():
    lay = Layout(0, "bedroom", ("bed 1", "laundryhamper 1"))
    w = World(Task("t", "train", lay, "pick_and_place", "book", "bed",
                   (("book 1", "laundryhamper 1"),), "goal", None, extra={"state_word": None}))
    assert w.step("go to laundryhamper 1")[0] == ("You arrive at laundryhamper 1. On the "
                                                   "laundryhamper 1, you see a book 1.")
    out, ok = w.step("help")
    assert ok and out.startswith("Available commands:\n  look:")
