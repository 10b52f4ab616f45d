"""Our generated tasks as ALFWorld games: a PDDL problem in ALFWorld's own domain
(``alfred.pddl``) with ALFWorld's text grammar (``alfred.twl2``), in the
``game.tw-pddl`` format ALFWorld's download step ships (``pddl_domain``, ``grammar``,
``pddl_problem``, ``solvable``, ``walkthrough``), plus the ``traj_data.json`` fields
ALFWorld reads next to it (``task_type``, ``pddl_params``).

This is what makes a differential check of our rules possible offline: the same task
played in our engine (``envs/textworld``) and in ALFWorld's (textworld's PDDL backend).
The object properties (what can be heated, cooled, cleaned, what each receptacle type
can contain, which receptacles open, which objects are receptacle objects) are ALFRED's
own tables from ``alfworld.gen.constants``, so a rule we got wrong shows up as a
difference instead of being copied into both worlds.

Entity ids follow ALFRED's mangling (``Cabinet_bar_...``) and are chosen so that
ALFWorld's demangler (``AlfredDemangler``: ids sorted, numbers handed out from the top)
names every entity exactly as our task does (``cabinet 2``).  Each receptacle stands at
a location of its own and the agent starts at a location without one, as in ALFWorld.

Needs the optional ``alfworld`` package (``pip install turngym[alfworld]``).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..textworld.catalog import LAMP
from ..textworld.generator import Task, rtype

# our task type -> ALFWorld's task type name (traj_data.json ``task_type``)
ALFWORLD_TASK_TYPE = {
    "pick_and_place": "pick_and_place_simple",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_clean_then_place": "pick_clean_then_place_in_recep",
    "pick_heat_then_place": "pick_heat_then_place_in_recep",
    "pick_cool_then_place": "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place": "pick_two_obj_and_place",
}
OUR_TASK_TYPE = {v: k for k, v in ALFWORLD_TASK_TYPE.items()}


def _alfworld():
    try:
        import alfworld.gen.goal_library as goals
        from alfworld.gen import constants
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("converting tasks to ALFWorld games needs the alfworld package: "
                          "pip install 'turngym[alfworld]'") from exc
    return constants, goals


def alfworld_logic() -> tuple[str, str]:
    """ALFWorld's PDDL domain and text grammar as its wheel ships them."""
    data = resources.files("alfworld") / "data"
    return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()


def alfred_class(name: str) -> str:
    """Our lower-case type name (``sinkbasin``) -> ALFRED's class (``SinkBasin``)."""
    constants, _ = _alfworld()
    lookup = {o.lower(): o for o in constants.OBJECTS}
    if name not in lookup:
        raise KeyError(f"{name!r} is not an ALFRED object class")
    return lookup[name]


def _mangled(instance: str, count: int) -> str:
    """An ALFRED-style id for ``instance`` (``"cabinet 2"``) that ALFWorld's demangler
    turns back into the same name: ids of one class are numbered from the highest down
    in sorted order, so instance k of n gets a code that sorts (n - k)-th."""
    kind, num = rtype(instance), int(instance.rsplit(" ", 1)[1])
    cls = alfred_class(kind)
    code = f"{count - num:03d}"
    if cls.endswith("Basin"):  # ALFRED spells basins as part of their sink/bathtub
        return f"{cls[:-5]}_bar_{code}_bar_{cls}"
    return f"{cls}_bar_{code}"


def task_to_pddl(task: Task) -> str:
    """The task's start state and goal as a PDDL problem in ALFWorld's domain."""
    constants, goals = _alfworld()
    objects = [o for o, _ in task.placements]
    recs = list(task.layout.receptacles)
    counts: dict[str, int] = {}
    for name in objects + recs:
        counts[rtype(name)] = counts.get(rtype(name), 0) + 1
    ids = {name: _mangled(name, counts[rtype(name)]) for name in objects + recs}
    loc = {r: f"loc_bar_{i + 1}" for i, r in enumerate(recs)}
    start = "loc_bar_0"

    otypes = sorted({alfred_class(rtype(o)) for o in objects} | {alfred_class(task.target)}
                    | ({alfred_class(LAMP)} if task.lamp else set()))
    rtypes = sorted({alfred_class(rtype(r)) for r in recs}
                    | ({alfred_class(task.dest)} if task.dest else set()))
    action_sets = {k: {c for c in v} for k, v in constants.VAL_ACTION_OBJECTS.items()}
    receptacle_objects = set(constants.MOVABLE_RECEPTACLES)

    decl = ["agent1 - agent"]
    decl += [f"{t}Type - otype" for t in otypes]
    decl += [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{ids[o]} - object" for o in objects]
    decl += [f"{ids[r]} - receptacle" for r in recs]
    decl += [f"{name} - location" for name in [start] + [loc[r] for r in recs]]

    init = [f"(atLocation agent1 {start})"]
    for r in recs:
        cls = alfred_class(rtype(r))
        init.append(f"(receptacleType {ids[r]} {cls}Type)")
        init.append(f"(receptacleAtLocation {ids[r]} {loc[r]})")
        if cls in constants.OPENABLE_CLASS_SET:
            init.append(f"(openable {ids[r]})")
    for o, r in task.placements:
        cls = alfred_class(rtype(o))
        init.append(f"(objectType {ids[o]} {cls}Type)")
        init.append(f"(inReceptacle {ids[o]} {ids[r]})")
        init.append(f"(objectAtLocation {ids[o]} {loc[r]})")
        if cls in action_sets["Toggleable"]:
            init.append(f"(toggleable {ids[o]})")
        else:
            init.append(f"(pickupable {ids[o]})")
        for prop, key in (("heatable", "Heatable"), ("coolable", "Coolable"),
                          ("cleanable", "Cleanable"), ("sliceable", "Sliceable")):
            if cls in action_sets[key]:
                init.append(f"({prop} {ids[o]})")
        if cls in receptacle_objects:
            init.append(f"(isReceptacleObject {ids[o]})")
    for rt in rtypes:
        can = constants.VAL_RECEPTACLE_OBJECTS.get(rt, set())
        init += [f"(canContain {rt}Type {ot}Type)" for ot in otypes if ot in can]

    goal = goals.gdict[ALFWORLD_TASK_TYPE[task.task_type]]["pddl"].format(
        obj=alfred_class(task.target),
        recep=alfred_class(task.dest) if task.dest else "",
        toggle=alfred_class(LAMP) if task.lamp else "",
        mrecep="").replace("#", "-")
    nl = "\n    "
    return (f"(define (problem turngym_{task.task_id.replace('-', '_')})\n(:domain alfred)\n"
            f"(:objects{nl}{nl.join(decl)}\n)\n(:init{nl}{nl.join(init)}\n)\n{goal.strip()}\n")


def task_description(task: Task) -> str:
    """The goal sentence as ALFWorld's grammar wants it (it appends the full stop)."""
    return task.goal.rstrip(".")


def traj_data(task: Task) -> dict[str, Any]:
    """The fields of ALFRED's ``traj_data.json`` that ALFWorld's text env reads."""
    return {
        "task_type": ALFWORLD_TASK_TYPE[task.task_type],
        "task_id": task.task_id,
        "pddl_params": {
            "object_target": alfred_class(task.target),
            "parent_target": alfred_class(task.dest) if task.dest else "",
            "toggle_target": alfred_class(LAMP) if task.lamp else "",
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": task_description(task)}]},
    }


def task_to_game(task: Task, walkthrough: list[str] | None = None) -> dict[str, Any]:
    """A ``game.tw-pddl`` document for ``task`` (ALFWorld's download format)."""
    domain, grammar = alfworld_logic()
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", task_description(task)),
        "pddl_problem": task_to_pddl(task),
        "solvable": True,
        "walkthrough": list(walkthrough) if walkthrough is not None else None,
    }


def write_game(task: Task, trial_dir: str | Path, walkthrough: list[str] | None = None) -> Path:
    """Writes ``traj_data.json`` and ``game.tw-pddl`` into ``trial_dir`` (created) and
    returns the game file's path, laid out as ALFWorld's data directory has them."""
    trial = Path(trial_dir)
    trial.mkdir(parents=True, exist_ok=True)
    (trial / "traj_data.json").write_text(json.dumps(traj_data(task)))
    game = trial / "game.tw-pddl"
    game.write_text(json.dumps(task_to_game(task, walkthrough)))
    return game


def write_data_dir(root: str | Path, tasks_by_split: dict[str, list[Task]],
                   walkthroughs: dict[str, list[str]] | None = None) -> Path:
    """An ALFWorld-layout data directory (``root/json_2.1.1/<split>/<task>/<trial>/``)
    holding ``tasks`` as games: ``turngym/ALFWorld-v0`` reads it as it reads ALFWorld's
    download.  ``walkthroughs`` maps task ids to solutions stored in the game files."""
    root = Path(root)
    for split, tasks in tasks_by_split.items():
        for task in tasks:
            name = (f"{ALFWORLD_TASK_TYPE[task.task_type]}-{alfred_class(task.target)}-None-"
                    f"{alfred_class(task.dest) if task.dest else alfred_class(LAMP)}-"
                    f"{task.task_id.replace('-', '_')}")
            write_game(task, root / "json_2.1.1" / split / name / "trial_T00000000_000000_0",
                       (walkthroughs or {}).get(task.task_id))
    return root
