"""Procedural, offline generation of layouts and tasks.

A *layout* is a room type plus its receptacle instances; a *task* places
objects into a layout and states a goal.  Splits follow ALFWorld: ``train`` and
``valid_seen`` draw from the same pool of layouts, ``valid_unseen`` from layouts
never used in training.  Everything is a pure function of (config, split, index),
so a task id is enough to rebuild a task anywhere.

Every task is one ALFWorld could pose: the target can take the task's transform
(ALFRED's heatable / coolable / cleanable tables) and the destination type can contain
it (ALFRED's ``canContain``).  Draws that break this are rejected and redrawn, so a task
that already satisfied it keeps exactly the draws (and text) it had before the check.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

from .catalog import (
    APPLIANCE, CAN_CONTAIN, GOAL_TEMPLATES, LAMP, RECEPTACLES, ROOMS, STATE_WORD,
    TASK_TRANSFORM, TASK_TYPES, TRANSFORMABLE, RoomSpec,
)

SPLITS = ("train", "valid_seen", "valid_unseen")


@dataclass(frozen=True)
class WorldConfig:
    """Size and split knobs of the generator (hashable: used as a cache key)."""

    seed: int = 0
    num_seen_layouts: int = 60
    num_unseen_layouts: int = 20
    min_receptacles: int = 6
    max_receptacles: int = 12
    min_objects: int = 4
    max_objects: int = 10
    task_types: tuple[str, ...] = TASK_TYPES

    def __post_init__(self) -> None:
        unknown = set(self.task_types) - set(TASK_TYPES)
        if unknown:
            raise ValueError(f"unknown task types {sorted(unknown)}; known: {TASK_TYPES}")
        if not 3 <= self.min_receptacles <= self.max_receptacles:
            raise ValueError("need 3 <= min_receptacles <= max_receptacles")
        if not 1 <= self.min_objects <= self.max_objects:
            raise ValueError("need 1 <= min_objects <= max_objects")


@dataclass(frozen=True)
class Layout:
    layout_id: int
    room: str
    receptacles: tuple[str, ...]  # instance names in display order, e.g. "cabinet 1"

    @property
    def types(self) -> set[str]:
        return {r.rsplit(" ", 1)[0] for r in self.receptacles}

    def of_type(self, rtype: str) -> list[str]:
        return [r for r in self.receptacles if r.rsplit(" ", 1)[0] == rtype]


@dataclass(frozen=True)
class Task:
    """A fully specified episode start."""

    task_id: str
    split: str
    layout: Layout
    task_type: str
    target: str  # object type to manipulate
    dest: str | None  # receptacle type to place into (None for look-at tasks)
    placements: tuple[tuple[str, str], ...]  # (object instance, receptacle instance)
    goal: str
    lamp: str | None = None  # lamp instance for look-at tasks
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def transform(self) -> str | None:
        return TASK_TRANSFORM.get(self.task_type)

    @property
    def required_count(self) -> int:
        return 2 if self.task_type == "pick_two_obj_and_place" else 1


def rtype(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def _make_layout(room: RoomSpec, rng: random.Random, cfg: WorldConfig, layout_id: int) -> Layout:
    n = rng.randint(cfg.min_receptacles, cfg.max_receptacles)
    counts = {t: 1 for t in room.must_have}
    pool = [t for t, cap in room.receptacles for _ in range(cap)]
    rng.shuffle(pool)
    caps = dict(room.receptacles)
    for t in pool:
        if sum(counts.values()) >= n:
            break
        if counts.get(t, 0) < caps[t]:
            counts[t] = counts.get(t, 0) + 1
    names = sorted(f"{t} {i}" for t, c in counts.items() for i in range(1, c + 1))
    return Layout(layout_id, room.name, tuple(names))


@lru_cache(maxsize=16)
def layouts(cfg: WorldConfig) -> tuple[tuple[Layout, ...], tuple[Layout, ...]]:
    """(seen, unseen) layout pools; unseen layouts never repeat a seen one."""
    rooms = sorted(ROOMS)
    seen: list[Layout] = []
    unseen: list[Layout] = []
    signatures: set[tuple] = set()
    salt = 0
    while len(seen) + len(unseen) < cfg.num_seen_layouts + cfg.num_unseen_layouts:
        lid = len(seen) + len(unseen)
        rng = random.Random(f"layout-{cfg.seed}-{lid}-{salt}")
        room = ROOMS[rooms[lid % len(rooms)]]
        lay = _make_layout(room, rng, cfg, lid)
        sig = (lay.room, lay.receptacles)
        if sig in signatures:
            salt += 1
            if salt > 200 * (cfg.num_seen_layouts + cfg.num_unseen_layouts):
                raise ValueError(
                    f"cannot draw {cfg.num_seen_layouts + cfg.num_unseen_layouts} distinct "
                    f"layouts with {cfg.min_receptacles}-{cfg.max_receptacles} receptacles; "
                    "allow more receptacles or ask for fewer layouts")
            continue
        signatures.add(sig)
        (seen if len(seen) < cfg.num_seen_layouts else unseen).append(lay)
    return tuple(seen), tuple(unseen)


def _feasible(task_type: str, room: RoomSpec, lay: Layout) -> bool:
    types = lay.types
    transform = TASK_TRANSFORM.get(task_type)
    if transform is not None:
        if APPLIANCE[transform] not in types:
            return False
        if not {"heat": room.heatable, "cool": room.coolable, "clean": room.cleanable}[transform]:
            return False
    if task_type == "look_at_obj_in_light":
        return bool(set(room.lamp_on) & types)
    # need a destination distinct from at least one storage receptacle
    return len(set(room.storage) & types) >= 2


def sample_task(cfg: WorldConfig, split: str, index: int) -> Task:
    """The task number ``index`` of ``split``; deterministic."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    if index < 0:
        raise ValueError("task index must be >= 0")
    seen, unseen = layouts(cfg)
    pool = unseen if split == "valid_unseen" else seen
    rng = random.Random(f"task-{cfg.seed}-{split}-{index}")
    task_type = cfg.task_types[index % len(cfg.task_types)]
    for _ in range(1000):
        lay = pool[rng.randrange(len(pool))]
        room = ROOMS[lay.room]
        if not _feasible(task_type, room, lay):
            continue
        task = _place(cfg, rng, split, index, lay, room, task_type)
        if task is not None:
            return task
    raise RuntimeError(f"no layout in {split} supports {task_type}")


def _candidates(room: RoomSpec, task_type: str) -> tuple[str, ...]:
    transform = TASK_TRANSFORM.get(task_type)
    if transform == "heat":
        return room.heatable
    if transform == "cool":
        return room.coolable
    if transform == "clean":
        return room.cleanable
    return room.objects


def _place(cfg: WorldConfig, rng: random.Random, split: str, index: int, lay: Layout,
           room: RoomSpec, task_type: str) -> Task | None:
    """Objects and goal of one task in ``lay``; None if no (target, destination) pair
    of this layout makes an ALFWorld-valid task of ``task_type``."""
    storage = [r for r in lay.receptacles if rtype(r) in room.storage]
    transform = TASK_TRANSFORM.get(task_type)
    candidates = _candidates(room, task_type)
    dest_types = sorted({rtype(r) for r in storage}
                        - ({APPLIANCE[transform]} if transform else set()))
    dest: str | None = None
    lamp: str | None = None
    for _ in range(64):
        target = rng.choice(candidates)
        if transform is not None and target not in TRANSFORMABLE[transform]:
            continue
        if task_type == "look_at_obj_in_light":
            lamp_recs = [r for r in lay.receptacles if rtype(r) in room.lamp_on]
            lamp_at = rng.choice(lamp_recs)
            lamp = f"{LAMP} 1"
            break
        fits = [d for d in dest_types if target in CAN_CONTAIN[d]]
        if not fits:
            continue
        for _ in range(64):
            dest = rng.choice(dest_types)
            if dest in fits:
                break
        else:
            dest = rng.choice(fits)
        break
    else:
        return None
    sources = [r for r in storage if dest is None or rtype(r) != dest] or storage
    n_target = 2 if task_type == "pick_two_obj_and_place" else 1
    n_target += rng.randint(0, 1)
    n_objects = max(rng.randint(cfg.min_objects, cfg.max_objects), n_target)
    counters: dict[str, int] = {}
    placements: list[tuple[str, str]] = []

    def add(obj_type: str, where: list[str]) -> None:
        counters[obj_type] = counters.get(obj_type, 0) + 1
        placements.append((f"{obj_type} {counters[obj_type]}", rng.choice(where)))

    for _ in range(n_target):
        add(target, sources)
    distractors = [o for o in room.objects if o != target]
    for _ in range(n_objects - n_target):
        add(rng.choice(distractors), storage)
    if lamp is not None:
        placements.append((lamp, lamp_at))
    rng.shuffle(placements)
    template = rng.choice(GOAL_TEMPLATES[task_type])
    goal = template.format(obj=target, rec=dest)
    task_id = f"{split}-{index}"
    return Task(task_id, split, lay, task_type, target, dest, tuple(placements), goal, lamp,
                extra={"state_word": STATE_WORD.get(transform or "", None),
                       "openable": tuple(r for r in lay.receptacles if RECEPTACLES[rtype(r)])})
