"""Rules of the household world: state, command grammar, feedback strings.

Pure Python, no gymnasium and no tokens: the env wraps this.  Rules and feedback
strings follow ALFWorld's PDDL domain and text grammar ("You arrive at ...", "Nothing
happens." for anything invalid), checked against ALFWorld's own engine by
``tests/test_alfworld_diff.py``: what a receptacle can contain, which objects heat, cool,
clean and slice, both objects of a pick-two task in one receptacle, ALFWorld's
``examine`` and ``help`` texts, lists in ALFWorld's order (by type, highest number first)
and admissible commands sorted.  Where we are more lenient than ALFWorld (synonyms such
as ``put X on Y``, case and spacing) is documented in ``docs/game_engines.md``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from .catalog import (
    APPLIANCE, CAN_CONTAIN, LAMP, RECEPTACLE_OBJECTS, RECEPTACLES, SLICEABLE, SLICERS,
    STATE_WORD, TRANSFORMABLE,
)
from .generator import Task, rtype

NOTHING = "Nothing happens."
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
HELP = (
    "Available commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object\n"
)

_WS = re.compile(r"\s+")
_GRAMMAR: tuple[tuple[str, re.Pattern], ...] = tuple(
    (name, re.compile(pat))
    for name, pat in (
        ("goto", r"^go to (?P<r>.+)$"),
        ("open", r"^open (?P<r>.+)$"),
        ("close", r"^close (?P<r>.+)$"),
        ("take", r"^(?:take|pick up|get) (?P<o>.+?) from (?P<r>.+)$"),
        ("put", r"^(?:move|put|place) (?P<o>.+?) (?:to|in|on|into|onto|in/on) (?P<r>.+)$"),
        ("transform", r"^(?P<verb>heat|cool|clean) (?P<o>.+?) with (?P<r>.+)$"),
        ("slice", r"^slice (?P<o>.+?) with (?P<k>.+)$"),
        ("use", r"^(?:use|toggle|turn on) (?P<o>.+)$"),
        ("examine", r"^(?:examine|look at) (?P<o>.+)$"),
        ("inventory", r"^(?:inventory|inv|i)$"),
        ("look", r"^(?:look|l)$"),
        ("help", r"^help$"),
    )
)


def normalize_command(text: str) -> str:
    text = _WS.sub(" ", text.strip().lower())
    return text.rstrip(".!").strip()


def display_order(names) -> list[str]:
    """ALFWorld's list order: by type, then the highest instance number first
    ("a cabinet 2, a cabinet 1, a countertop 1")."""
    return sorted(names, key=lambda n: (rtype(n), -int(n.rsplit(" ", 1)[1])))


def can_contain(rec: str, obj: str) -> bool:
    """ALFWorld's ``canContain``: may ``obj`` be put into / onto ``rec``?"""
    return rtype(obj) in CAN_CONTAIN[rtype(rec)]


def _listing(items: list[str]) -> str:
    if not items:
        return "nothing"
    parts = [f"a {x}" for x in display_order(items)]
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + ", and " + parts[-1]


@dataclass
class WorldState:
    """Mutable world state; ``copy`` is the cheap snapshot."""

    location: str | None
    holding: str | None
    contents: dict[str, list[str]]
    opened: set[str]
    props: dict[str, set[str]]  # object -> {"hot", "cool", "clean", "sliced"}
    lamps_on: set[str]
    explored: set[str]  # receptacles whose contents the agent has seen
    steps: int = 0
    won: bool = False
    history: list[str] = field(default_factory=list)

    def copy(self) -> WorldState:
        return WorldState(
            self.location, self.holding, {k: list(v) for k, v in self.contents.items()},
            set(self.opened), {k: set(v) for k, v in self.props.items()}, set(self.lamps_on),
            set(self.explored), self.steps, self.won, list(self.history),
        )

    def where(self, obj: str) -> str | None:
        if self.holding == obj:
            return "agent"
        for r, items in self.contents.items():
            if obj in items:
                return r
        return None


class World:
    """One task's rules bound to a state."""

    def __init__(self, task: Task):
        self.task = task
        self.receptacles = task.layout.receptacles
        self._rset = set(self.receptacles)
        self.openable = {r for r in self.receptacles if RECEPTACLES[rtype(r)]}
        self.state = self.initial_state()

    # ------------------------------------------------------------------ state
    def initial_state(self) -> WorldState:
        contents: dict[str, list[str]] = {r: [] for r in self.receptacles}
        for obj, rec in self.task.placements:
            contents[rec].append(obj)
        for items in contents.values():
            items.sort()
        return WorldState(None, None, contents, set(), {}, set(), set())

    def intro(self) -> str:
        rooms = _listing(list(self.receptacles))
        return (f"{WELCOME}\n\nYou are in the middle of a room. Looking quickly around you, "
                f"you see {rooms}.\n\nYour task is to: {self.task.goal}")

    def visible(self, rec: str) -> bool:
        return rec not in self.openable or rec in self.state.opened

    def describe(self, rec: str) -> str:
        items = self.state.contents[rec]
        if rec in self.openable:
            if rec not in self.state.opened:
                return f"The {rec} is closed."
            return f"The {rec} is open. In it, you see {_listing(items)}."
        return f"On the {rec}, you see {_listing(items)}."

    # ------------------------------------------------------------------ step
    def step(self, command: str) -> tuple[str, bool]:
        """Applies one command; returns (feedback, was_valid)."""
        cmd = normalize_command(command)
        self.state.steps += 1
        self.state.history.append(cmd)
        for name, pat in _GRAMMAR:
            m = pat.match(cmd)
            if m:
                out = getattr(self, f"_do_{name}")(**m.groupdict())
                if out is not None:
                    self._check_goal()
                    return out, True
                return NOTHING, False
        return NOTHING, False

    def _do_goto(self, r: str) -> str | None:
        s = self.state
        if r not in self._rset or r == s.location:
            return None
        s.location = r
        if self.visible(r):
            s.explored.add(r)
        return f"You arrive at {r}. {self.describe(r)}"

    def _do_open(self, r: str) -> str | None:
        s = self.state
        if r != s.location or r not in self.openable or r in s.opened:
            return None
        s.opened.add(r)
        s.explored.add(r)
        return f"You open the {r}. {self.describe(r)}"

    def _do_close(self, r: str) -> str | None:
        s = self.state
        if r != s.location or r not in s.opened:
            return None
        s.opened.discard(r)
        return f"You close the {r}."

    def _do_take(self, o: str, r: str) -> str | None:
        s = self.state
        if s.holding is not None or r != s.location or not self.visible(r):
            return None
        if o not in s.contents[r] or rtype(o) == LAMP:
            return None
        s.contents[r].remove(o)
        s.holding = o
        return f"You pick up the {o} from the {r}."

    def _do_put(self, o: str, r: str) -> str | None:
        s = self.state
        if s.holding != o or r != s.location or not self.visible(r):
            return None
        if not can_contain(r, o):
            return None
        s.contents[r].append(o)
        s.contents[r].sort()
        s.holding = None
        return f"You move the {o} to the {r}."

    def _do_transform(self, verb: str, o: str, r: str) -> str | None:
        s = self.state
        if s.holding != o or r != s.location or rtype(r) != APPLIANCE[verb]:
            return None
        if rtype(o) not in TRANSFORMABLE[verb]:
            return None
        word = STATE_WORD[verb]
        props = s.props.setdefault(o, set())
        props.add(word)
        if word == "hot":
            props.discard("cool")
        elif word == "cool":
            props.discard("hot")
        return f"You {verb} the {o} using the {r}."

    def _do_slice(self, o: str, k: str) -> str | None:
        # ALFWorld's SliceObject: holding a knife, the object anywhere at the agent's
        # receptacle (its domain asks objectAtLocation, so a closed one does not hide it)
        s = self.state
        if s.holding != k or rtype(k) not in SLICERS or rtype(o) not in SLICEABLE:
            return None
        if s.location is None or o not in s.contents[s.location]:
            return None
        s.props.setdefault(o, set()).add("sliced")
        return f"You sliced the {o} with the {k}."

    def _do_use(self, o: str) -> str | None:
        s = self.state
        if rtype(o) != LAMP or s.location is None or o not in s.contents[s.location]:
            return None
        s.lamps_on.add(o)
        return f"You turn on the {o}."

    def _do_examine(self, o: str) -> str | None:
        s = self.state
        if o in self._rset:
            if o != s.location:
                return None
            return self.describe(o)
        # ALFWorld's examineObject admits only the held object: the branch of its
        # precondition for objects in the receptacle at hand never grounds
        if s.holding == o:
            return self.describe_object(o)
        return None

    def describe_object(self, o: str) -> str:
        """ALFWorld's ``examineObject`` feedback, its conditions tried in its order."""
        if rtype(o) in RECEPTACLE_OBJECTS:
            return f"This is a normal {o}. In it, you see nothing."
        p = self.state.props.get(o, set())
        hot, cool, clean, sliced = ("hot" in p), ("cool" in p), ("clean" in p), ("sliced" in p)
        if clean and (hot or cool) and sliced:
            return f"This is a {'hot' if hot else 'cool'} and clean sliced {o}."
        if clean and sliced:
            return f"This is a clean sliced {o}."
        if (hot or cool) and sliced:
            return f"This is a {'hot' if hot else 'cool'} sliced {o}."
        if clean and (hot or cool):
            return f"This is a {'hot' if hot else 'cool'} and clean {o}."
        if hot:
            return f"This is a hot {o}."
        if clean:
            return f"This is a clean {o}."
        if cool:
            return f"This is a cold {o}."
        if rtype(o) == LAMP:
            return f"This {o} is {'on' if o in self.state.lamps_on else 'off'}."
        if sliced:
            return f"This is a sliced {o}."
        return f"There's nothing special about {o}."

    def _do_inventory(self) -> str:
        return self.inventory()

    def inventory(self) -> str:
        """What the ``inventory`` command prints (the env's ``info["inventory"]``)."""
        h = self.state.holding
        return f"You are carrying: a {h}." if h else "You are not carrying anything."

    def _do_help(self) -> str:
        return HELP

    def _do_look(self) -> str:
        loc = self.state.location
        if loc is None:
            return ("You are in the middle of a room. Looking quickly around you, "
                    "you see nothing.")
        return f"You are facing the {loc}. Next to it, you see nothing."

    # ------------------------------------------------------------------ goal
    def _has_props(self, obj: str) -> bool:
        word = self.task.extra.get("state_word")
        return word is None or word in self.state.props.get(obj, ())

    def placed_in(self, rec: str) -> int:
        """Goal objects (target type, required property) in receptacle ``rec``."""
        return sum(1 for o in self.state.contents[rec]
                   if rtype(o) == self.task.target and self._has_props(o))

    def placed_count(self) -> int:
        """The most goal objects in ONE receptacle of the destination type (ALFWorld's
        goals quantify over a single receptacle: both objects of a pick-two task must
        share it)."""
        t = self.task
        if t.dest is None:
            return 0
        return max((self.placed_in(r) for r in self.receptacles if rtype(r) == t.dest),
                   default=0)

    def _check_goal(self) -> None:
        t, s = self.task, self.state
        if t.task_type == "look_at_obj_in_light":
            lamp_at = s.where(t.lamp) if t.lamp else None
            s.won = bool(s.holding and rtype(s.holding) == t.target and t.lamp in s.lamps_on
                         and s.location == lamp_at)
        else:
            s.won = self.placed_count() >= t.required_count

    # ------------------------------------------------------------------ info
    def admissible(self) -> list[str]:
        """All commands that would be valid now (ALFWorld's admissible_commands)."""
        s = self.state
        held = s.holding
        out = [f"go to {r}" for r in self.receptacles if r != s.location]
        loc = s.location
        if loc is not None:
            here = s.contents[loc]
            if loc in self.openable:
                out.append(f"close {loc}" if loc in s.opened else f"open {loc}")
            if self.visible(loc):
                if held is None:
                    out += [f"take {o} from {loc}" for o in here if rtype(o) != LAMP]
                elif can_contain(loc, held):
                    out.append(f"move {held} to {loc}")
            out += [f"use {o}" for o in here if rtype(o) == LAMP]
            if held is not None:
                for verb, app in APPLIANCE.items():
                    if rtype(loc) == app and rtype(held) in TRANSFORMABLE[verb]:
                        out.append(f"{verb} {held} with {loc}")
                if rtype(held) in SLICERS:
                    out += [f"slice {o} with {held}" for o in here if rtype(o) in SLICEABLE]
            out.append(f"examine {loc}")
        if held is not None:
            out.append(f"examine {held}")
        out += ["help", "inventory", "look"]
        return sorted(set(out))

    def progress(self) -> tuple[str, ...]:
        """Privileged subgoal facts reached so far (for credit modules, never shown)."""
        t, s = self.task, self.state
        facts = []
        held = s.holding if s.holding and rtype(s.holding) == t.target else None
        if held:
            facts.append(f"holding {t.target}")
        word = t.extra.get("state_word")
        if word and held and word in s.props.get(held, ()):
            facts.append(f"{word} {t.target}")
        if t.task_type == "look_at_obj_in_light":
            if held and s.location == s.where(t.lamp):
                facts.append("at lamp")
            if s.won:
                facts.append("lamp on")
        else:
            n = self.placed_count()
            if n:
                facts.append(f"placed {n} {t.target}")
        return tuple(facts)

    def state_key(self) -> str:
        """Hash of the history-free world state (equal states, equal keys)."""
        s = self.state
        parts = [
            str(s.location), str(s.holding), ",".join(sorted(s.opened)),
            ";".join(f"{k}:{','.join(sorted(v))}" for k, v in sorted(s.props.items()) if v),
            ",".join(sorted(s.lamps_on)),
            "|".join(f"{r}={','.join(s.contents[r])}" for r in self.receptacles),
        ]
        return hashlib.blake2b("#".join(parts).encode(), digest_size=8).hexdigest()
