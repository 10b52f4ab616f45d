"""Rules of the household world: state, command grammar, feedback strings.

Pure Python, no gymnasium and no tokens: the env wraps this.  Feedback strings
follow ALFWorld ("You arrive at ...", "Nothing happens." for anything invalid).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from .catalog import APPLIANCE, LAMP, RECEPTACLES, STATE_WORD
from .generator import Task, rtype

NOTHING = "Nothing happens."
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"

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
        ("use", r"^(?:use|toggle|turn on) (?P<o>.+)$"),
        ("examine", r"^(?:examine|look at) (?P<o>.+)$"),
        ("inventory", r"^(?:inventory|inv|i)$"),
        ("look", r"^(?:look|l)$"),
    )
)


def normalize_command(text: str) -> str:
    text = _WS.sub(" ", text.strip().lower())
    return text.rstrip(".!").strip()


def _listing(items: list[str]) -> str:
    if not items:
        return "nothing"
    parts = [f"a {x}" for x in items]
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
    props: dict[str, set[str]]  # object -> {"hot", "cool", "clean"}
    lamps_on: set[str]
    explored: set[str]  # receptacles whose contents the agent has seen
    steps: int = 0
    won: bool = False
    history: list[str] = field(default_factory=list)

    def copy(self) -> "WorldState":
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
        s.contents[r].append(o)
        s.contents[r].sort()
        s.holding = None
        return f"You move the {o} to the {r}."

    def _do_transform(self, verb: str, o: str, r: str) -> str | None:
        s = self.state
        if s.holding != o or r != s.location or rtype(r) != APPLIANCE[verb]:
            return None
        word = STATE_WORD[verb]
        props = s.props.setdefault(o, set())
        props.add(word)
        if word == "hot":
            props.discard("cool")
        elif word == "cool":
            props.discard("hot")
        return f"You {verb} the {o} using the {r}."

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
        if s.holding == o or (s.location and self.visible(s.location)
                              and o in s.contents[s.location]):
            return f"There's nothing special about {o}."
        return None

    def _do_inventory(self) -> str:
        h = self.state.holding
        return f"You are carrying: a {h}." if h else "You are not carrying anything."

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

    def placed_count(self) -> int:
        t = self.task
        if t.dest is None:
            return 0
        return sum(
            1 for r in self.receptacles if rtype(r) == t.dest
            for o in self.state.contents[r] if rtype(o) == t.target and self._has_props(o)
        )

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
        out = [f"go to {r}" for r in self.receptacles if r != s.location]
        loc = s.location
        if loc is not None:
            if loc in self.openable:
                out.append(f"close {loc}" if loc in s.opened else f"open {loc}")
            vis = self.visible(loc)
            if vis:
                if s.holding is None:
                    out += [f"take {o} from {loc}" for o in s.contents[loc] if rtype(o) != LAMP]
                else:
                    out.append(f"move {s.holding} to {loc}")
                out += [f"use {o}" for o in s.contents[loc] if rtype(o) == LAMP]
            if s.holding is not None:
                for verb, app in APPLIANCE.items():
                    if rtype(loc) == app:
                        out.append(f"{verb} {s.holding} with {loc}")
            out.append(f"examine {loc}")
        if s.holding is not None:
            out.append(f"examine {s.holding}")
        out += ["inventory", "look"]
        return out

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
