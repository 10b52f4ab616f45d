"""``turngym/ALFWorld-v0``: ALFWorld's own text engine over the user's ALFWorld data.

The games are the ``game.tw-pddl`` files ALFWorld's download step (``alfworld-download``)
puts under ``$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/``,
next to each trial's ``traj_data.json``.  They are collected as ALFWorld's
``AlfredTWEnv.collect_game_files`` does (same directories for the three splits; trials
of movable-receptacle and sliced tasks skipped; only games marked ``solvable``; an
optional task-type filter), but sorted, so that game ``i`` of a split is the same on
every machine.  Each game is played with textworld's PDDL engine and ALFWorld's wrappers
(``AlfredDemangler``, ``AlfredInfos``), exactly as ``AlfredTWEnv.init_env`` builds them:
ALFWorld's feedback, its admissible commands, its goal check.

Unlike ``AlfredTWEnv``, which finds 0 games and then hangs in ``reset()`` when the data
is missing, this env raises at construction, naming the directory it looked in and how
to fill it.

``info`` carries our keys: ``admissible_commands``, ``progress`` (the same subgoal facts
as ``turngym/TextWorld-v0``, read off ALFWorld's PDDL state with the trial's
``pddl_params``), ``state_key`` (hash of the PDDL facts, bookkeeping facts such as
``checked`` left out), ``won``, ``task_type`` (ALFWorld's name, e.g.
``pick_heat_then_place_in_recep``), ``task_id``, ``valid_action``.  ``reset(seed=i)``
plays game ``i % len(split)``; ``replay`` reproduces a state exactly.  The expert
(``oracle_action``) follows the game's walkthrough, and once off it asks ALFWorld's PDDL
planner (fast-downward) for the rest of the episode: about 0.4 s a step, paid only by
episodes that ask.

Needs the optional ``alfworld`` package: ``pip install 'turngym[alfworld]'``.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..textworld.generator import rtype
from ..textworld_game.env import GameEnv

SPLIT_DIRS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen"}
# ALFWorld's task types (``alfred_tw_env.TASK_TYPES``: ids 1..6 in its configs)
TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
              "pick_two_obj_and_place")
_STATE_WORD = {"pick_clean_then_place_in_recep": ("isclean", "clean"),
               "pick_heat_then_place_in_recep": ("ishot", "hot"),
               "pick_cool_then_place_in_recep": ("iscool", "cool")}
# PDDL bookkeeping that records what was looked at, not the world
_BOOKKEEPING = ("checked(", "examined(")
DOWNLOAD_HINT = (
    "ALFWorld's game files come from its download step: `pip install 'turngym[alfworld]'` "
    "then `alfworld-download` (it fills $ALFWORLD_DATA, default ~/.cache/alfworld; "
    "`alfworld-download --data-dir DIR` for another place), and pass data_dir=DIR or set "
    "ALFWORLD_DATA=DIR")


def data_root(data_dir: str | os.PathLike | None = None) -> Path:
    """The ALFWorld data directory: ``data_dir``, else ``$ALFWORLD_DATA``, else ALFWorld's
    default ``~/.cache/alfworld``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("ALFWORLD_DATA")
    return Path(os.path.expandvars(env)).expanduser() if env else Path("~/.cache/alfworld").expanduser()


def _task_type_names(task_types: Iterable[int | str] | None) -> tuple[str, ...]:
    if task_types is None:
        return TASK_TYPES
    out = []
    for t in task_types:
        if isinstance(t, int) or (isinstance(t, str) and t.isdigit()):
            k = int(t)
            if not 1 <= k <= len(TASK_TYPES):
                raise ValueError(f"ALFWorld task type ids are 1..6, not {k}")
            out.append(TASK_TYPES[k - 1])
        elif t in TASK_TYPES:
            out.append(t)
        else:
            raise ValueError(f"unknown ALFWorld task type {t!r}; known: {TASK_TYPES}")
    return tuple(out)


def collect_alfworld_games(data_dir: str | os.PathLike | None, split: str,
                           task_types: Iterable[int | str] | None = None) -> list[Path]:
    """The solvable ``game.tw-pddl`` files of ``split``, sorted; raises (never hangs)
    when there are none, naming the directory and ALFWorld's download step.  The scan
    (every game file is read once) is cached per process: a rollout pool makes many envs."""
    if split not in SPLIT_DIRS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {sorted(SPLIT_DIRS)}")
    root = data_root(data_dir)
    split_dir = root / "json_2.1.1" / SPLIT_DIRS[split]
    if not split_dir.is_dir():
        raise FileNotFoundError(f"ALFWorld data not found: {split_dir} does not exist. "
                                f"{DOWNLOAD_HINT}.")
    return list(_scan(split_dir.resolve(), tuple(sorted(set(_task_type_names(task_types))))))


@lru_cache(maxsize=32)
def _scan(split_dir: Path, wanted: tuple[str, ...]) -> tuple[Path, ...]:
    games: list[Path] = []
    seen = 0
    for traj in sorted(split_dir.rglob("traj_data.json")):
        trial = traj.parent
        seen += 1
        rel = str(trial.relative_to(split_dir))
        if "movable" in rel or "Sliced" in rel:
            continue
        game = trial / "game.tw-pddl"
        if not game.is_file():
            continue
        if json.loads(traj.read_text()).get("task_type") not in wanted:
            continue
        if not json.loads(game.read_text()).get("solvable"):
            continue
        games.append(game)
    if not games:
        what = (f"{seen} trials but no solvable game.tw-pddl of task types {sorted(wanted)}"
                if seen else "no trials (traj_data.json)")
        raise FileNotFoundError(f"ALFWorld data incomplete: {split_dir} has {what}. "
                                f"{DOWNLOAD_HINT}.")
    return tuple(games)


class ALFWorldEnv(GameEnv):
    """ALFWorld's text env (its PDDL domain, grammar and wrappers) as a turngym env."""

    fallback_action = "look"
    default_task_type = "alfworld"
    plan_from_reset = False  # a planner: ask it for the current state only
    inadmissible_is_noop = True  # PDDL: a command not in the list changes nothing
    case_insensitive = False

    def __init__(self, data_dir: str | os.PathLike | None = None, split: str = "train",
                 max_turns: int = 50, task_types: Sequence[int | str] | None = None,
                 render_mode: str | None = None):
        self.data_dir = data_dir
        self.task_types = task_types
        self._traj: dict[Path, dict] = {}
        super().__init__(split=split, max_turns=max_turns, reward="won",
                         render_mode=render_mode)

    # -------------------------------------------------------------- hooks
    def _collect(self, split: str) -> list[Path]:
        games = collect_alfworld_games(self.data_dir, split, self.task_types)
        try:
            import alfworld.agents.environment.alfred_tw_env  # noqa: F401
        except ImportError as exc:
            raise ImportError("turngym/ALFWorld-v0 needs the alfworld package: "
                              "pip install 'turngym[alfworld]'") from exc
        return games

    def _load(self, game: Path) -> None:
        # textworld.start(path) would do the same but leaves the game file open
        if self._engine is not None and self._loaded == game:
            return
        data = json.loads(game.read_text())
        if self._engine is None:
            from textworld.envs import PddlEnv

            engine = PddlEnv(self._request_infos())
            for wrapper in self._wrappers():
                engine = wrapper(engine)
            self._engine = engine
        self._engine.load(data)
        self._loaded = game

    def _wrappers(self) -> list:
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        return [AlfredDemangler(shuffle=False), AlfredInfos]

    def _request_infos(self):
        import textworld

        return textworld.EnvInfos(admissible_commands=True, won=True, facts=True)

    def _clean(self, action: Any) -> str:
        # ALFWorld matches the exact command (after strip); only control characters go
        return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in str(action)).strip()

    def _walkthrough_for(self, game: Path, state) -> list[str] | None:
        wt = json.loads(game.read_text()).get("walkthrough")
        return list(wt) if wt else None

    def traj_data(self, game: Path) -> dict:
        if game not in self._traj:
            self._traj[game] = json.loads((game.parent / "traj_data.json").read_text())
        return self._traj[game]

    def _task_type(self, game: Path, state) -> str:
        return str(self.traj_data(game).get("task_type", self.default_task_type))

    def _state_key_fact(self, fact: str) -> bool:
        return not fact.startswith(_BOOKKEEPING)

    def _progress(self, state) -> tuple[str, ...]:
        game = self.game_files[self._index]
        traj = self.traj_data(game)
        params = traj.get("pddl_params") or {}
        target = str(params.get("object_target") or "").lower()
        parent = str(params.get("parent_target") or "").lower()
        task_type = traj.get("task_type")
        facts: dict[str, list[tuple[str, ...]]] = {}
        for f in state.get("facts") or ():
            facts.setdefault(f.name, []).append(tuple(v.name for v in f.arguments))
        props = {name: {a[0] for a in facts.get(name, [])} for name in ("ishot", "iscool",
                                                                      "isclean", "istoggled")}
        out = []
        held = next((o for _, o in facts.get("holds", []) if rtype(o) == target), None)
        if held:
            out.append(f"holding {target}")
        pred, word = _STATE_WORD.get(task_type, (None, None))
        if pred and held and held in props[pred]:
            out.append(f"{word} {target}")
        if task_type == "look_at_obj_in_light":
            toggle = str(params.get("toggle_target") or "").lower()
            here = {loc for _, loc in facts.get("atlocation", [])}
            lamps_here = [o for o, loc in facts.get("objectatlocation", [])
                          if rtype(o) == toggle and loc in here]
            if held and lamps_here:
                out.append("at lamp")
            if state.get("won"):
                out.append("lamp on")
        else:
            count: dict[str, int] = {}
            for o, r in facts.get("inreceptacle", []):
                if rtype(o) == target and rtype(r) == parent and (pred is None or o in props[pred]):
                    count[r] = count.get(r, 0) + 1
            if count:
                out.append(f"placed {max(count.values())} {target}")
        return tuple(out)

    def vocabulary(self) -> list[str]:
        """ALFRED's object and receptacle names plus ALFWorld's command words."""
        from alfworld.gen import constants

        words = {o.lower() for o in constants.OBJECTS}
        words |= set(["go", "to", "open", "close", "take", "from", "move", "put", "in", "on", "into", "heat", "cool", "clean", "slice", "with", "use", "examine", "inventory", "look", "help"])
        return sorted(words)
