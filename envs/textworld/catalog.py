"""Static vocabulary of the household world: rooms, receptacles, objects, task types.

Names follow ALFWorld (lower-case, no spaces: ``sinkbasin``, ``desklamp``) so that
prompts and policies written for ALFWorld read naturally here.
"""

from __future__ import annotations

from dataclasses import dataclass

# receptacle type -> openable?
RECEPTACLES: dict[str, bool] = {
    "cabinet": True, "drawer": True, "fridge": True, "microwave": True, "safe": True,
    "laundryhamper": True, "countertop": False, "diningtable": False, "shelf": False,
    "sinkbasin": False, "stoveburner": False, "garbagecan": False, "coffeemachine": False,
    "toaster": False, "sofa": False, "armchair": False, "coffeetable": False,
    "sidetable": False, "tvstand": False, "dresser": False, "bed": False, "desk": False,
    "toilet": False, "bathtubbasin": False, "towelholder": False, "handtowelholder": False,
    "toiletpaperhanger": False,
}

# appliance used by each transforming task
APPLIANCE = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
LAMP = "desklamp"


@dataclass(frozen=True)
class RoomSpec:
    """What a room type may contain.

    ``receptacles``: (type, max instances).  ``storage``: receptacle types where
    loose objects start.  ``objects``: pickable object types.
    """

    name: str
    receptacles: tuple[tuple[str, int], ...]
    must_have: tuple[str, ...]
    storage: tuple[str, ...]
    objects: tuple[str, ...]
    heatable: tuple[str, ...] = ()
    coolable: tuple[str, ...] = ()
    cleanable: tuple[str, ...] = ()
    lamp_on: tuple[str, ...] = ()  # receptacle types a desklamp may stand on


_FOOD = ("apple", "tomato", "potato", "egg", "lettuce", "bread")
_DISH = ("mug", "cup", "plate", "bowl", "pan", "pot")
_CUTLERY = ("knife", "fork", "spoon", "spatula", "butterknife")

ROOMS: dict[str, RoomSpec] = {
    "kitchen": RoomSpec(
        name="kitchen",
        receptacles=(("cabinet", 4), ("drawer", 3), ("countertop", 2), ("fridge", 1),
                     ("microwave", 1), ("sinkbasin", 1), ("stoveburner", 2),
                     ("diningtable", 1), ("shelf", 2), ("garbagecan", 1),
                     ("coffeemachine", 1), ("toaster", 1)),
        must_have=("fridge", "microwave", "sinkbasin", "countertop"),
        storage=("cabinet", "drawer", "countertop", "diningtable", "shelf", "stoveburner",
                 "fridge", "garbagecan"),
        objects=_FOOD + _DISH + _CUTLERY + ("saltshaker", "peppershaker", "dishsponge"),
        heatable=_FOOD + ("mug", "cup", "plate"),
        coolable=_FOOD + _DISH,
        cleanable=_FOOD + _DISH + _CUTLERY,
    ),
    "livingroom": RoomSpec(
        name="livingroom",
        receptacles=(("sofa", 1), ("armchair", 1), ("coffeetable", 1), ("sidetable", 2),
                     ("tvstand", 1), ("shelf", 3), ("drawer", 3), ("cabinet", 2),
                     ("garbagecan", 1), ("dresser", 1)),
        must_have=("sidetable", "sofa"),
        storage=("sofa", "armchair", "coffeetable", "sidetable", "tvstand", "shelf", "drawer",
                 "cabinet", "dresser"),
        objects=("remotecontrol", "keychain", "creditcard", "newspaper", "book", "pillow",
                 "vase", "statue", "box", "laptop", "watch", "cellphone"),
        lamp_on=("sidetable", "dresser"),
    ),
    "bedroom": RoomSpec(
        name="bedroom",
        receptacles=(("bed", 1), ("desk", 1), ("sidetable", 2), ("dresser", 1),
                     ("drawer", 4), ("shelf", 3), ("garbagecan", 1), ("laundryhamper", 1),
                     ("safe", 1)),
        must_have=("desk", "bed"),
        storage=("bed", "desk", "sidetable", "dresser", "drawer", "shelf", "safe"),
        objects=("book", "cellphone", "alarmclock", "pen", "pencil", "pillow", "cd",
                 "keychain", "creditcard", "laptop", "mug", "bowl"),
        coolable=(),
        lamp_on=("desk", "sidetable"),
    ),
    "bathroom": RoomSpec(
        name="bathroom",
        receptacles=(("toilet", 1), ("sinkbasin", 1), ("bathtubbasin", 1),
                     ("countertop", 1), ("cabinet", 4), ("drawer", 2), ("towelholder", 1),
                     ("handtowelholder", 1), ("shelf", 2), ("garbagecan", 1),
                     ("toiletpaperhanger", 1)),
        must_have=("sinkbasin", "countertop"),
        storage=("toilet", "countertop", "cabinet", "drawer", "shelf", "bathtubbasin",
                 "garbagecan"),
        objects=("soapbar", "soapbottle", "spraybottle", "toiletpaper", "candle", "cloth",
                 "dishsponge", "plunger", "scrubbrush"),
        cleanable=("soapbar", "cloth", "dishsponge"),
    ),
}

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj_and_place",
)

# task type -> required object property (None for none)
TASK_TRANSFORM = {
    "pick_clean_then_place": "clean",
    "pick_heat_then_place": "heat",
    "pick_cool_then_place": "cool",
}

# property word used in goal text and state ("clean", "hot", "cool")
STATE_WORD = {"clean": "clean", "heat": "hot", "cool": "cool"}

GOAL_TEMPLATES: dict[str, tuple[str, ...]] = {
    "pick_and_place": ("put a {obj} in {rec}.", "put some {obj} on {rec}."),
    "look_at_obj_in_light": ("look at {obj} under the desklamp.",
                             "examine the {obj} with the desklamp."),
    "pick_clean_then_place": ("put a clean {obj} in {rec}.", "clean some {obj} and put it in {rec}."),
    "pick_heat_then_place": ("put a hot {obj} in {rec}.", "heat some {obj} and put it in {rec}."),
    "pick_cool_then_place": ("put a cool {obj} in {rec}.", "cool some {obj} and put it in {rec}."),
    "pick_two_obj_and_place": ("put two {obj} in {rec}.", "find two {obj} and put them in {rec}."),
}


def lexicon() -> list[str]:
    """Every word the world can print (for building small word-level tokenizers)."""
    words: set[str] = set(RECEPTACLES) | {LAMP}
    for room in ROOMS.values():
        words |= set(room.objects)
    return sorted(words)
