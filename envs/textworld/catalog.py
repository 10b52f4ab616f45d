"""Static vocabulary of the household world: rooms, receptacles, objects, task types.

Names follow ALFWorld (lower-case, no spaces: ``sinkbasin``, ``desklamp``) so that
prompts and policies written for ALFWorld read naturally here.
"""

from __future__ import annotations

from dataclasses import dataclass

# receptacle type -> openable?
RECEPTACLES: dict[str, bool] = {
    "cabinet": True, "drawer": True, "fridge": True, "microwave": True, "safe": True,
    "laundryhamper": False, "countertop": False, "diningtable": False, "shelf": False,
    "sinkbasin": False, "stoveburner": False, "garbagecan": False, "coffeemachine": False,
    "toaster": False, "sofa": False, "armchair": False, "coffeetable": False,
    "sidetable": False, "tvstand": False, "dresser": False, "bed": False, "desk": False,
    "toilet": False, "bathtubbasin": False, "towelholder": False, "handtowelholder": False,
    "toiletpaperhanger": False,
}

# appliance used by each transforming task
APPLIANCE = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
LAMP = "desklamp"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# ALFRED's object tables (``alfworld.gen.constants``: VAL_RECEPTACLE_OBJECTS,
# VAL_ACTION_OBJECTS, MOVABLE_RECEPTACLES) restricted to the types this world uses;
# ALFWorld's PDDL domain reads them as ``canContain``, ``heatable``/``coolable``/
# ``cleanable`` and ``isReceptacleObject``.  ``tests/test_alfworld_diff.py`` checks them
# against the alfworld package itself.
# receptacle type -> object types a "move ... to" may put there
CAN_CONTAIN: dict[str, frozenset[str]] = {
    "cabinet": _words(
        "book bowl box candle cd cloth cup dishsponge mug newspaper pan "
        "peppershaker plate plunger pot saltshaker soapbar soapbottle "
        "spraybottle toiletpaper vase"),
    "drawer": _words(
        "book butterknife candle cd cellphone cloth creditcard dishsponge fork "
        "keychain knife newspaper pen pencil peppershaker remotecontrol "
        "saltshaker soapbar soapbottle spatula spoon spraybottle toiletpaper "
        "watch"),
    "fridge": _words("apple bowl bread cup egg lettuce mug pan plate pot potato tomato"),
    "microwave": _words("apple bowl bread cup egg mug plate potato tomato"),
    "safe": _words("cd cellphone creditcard keychain statue vase watch"),
    "laundryhamper": _words("cloth"),
    "countertop": _words(
        "alarmclock apple book bowl box bread butterknife candle cd cellphone "
        "cloth creditcard cup dishsponge egg fork keychain knife laptop lettuce "
        "mug newspaper pan pen pencil peppershaker plate pot potato "
        "remotecontrol saltshaker soapbar soapbottle spatula spoon spraybottle "
        "statue toiletpaper tomato vase watch"),
    "diningtable": _words(
        "alarmclock apple book bowl box bread butterknife candle cd cellphone "
        "cloth creditcard cup dishsponge egg fork keychain knife laptop lettuce "
        "mug newspaper pan pen pencil peppershaker plate pot potato "
        "remotecontrol saltshaker soapbar soapbottle spatula spoon spraybottle "
        "statue toiletpaper tomato vase watch"),
    "shelf": _words(
        "alarmclock book bowl box candle cd cellphone cloth creditcard cup "
        "dishsponge keychain mug newspaper pen pencil peppershaker plate pot "
        "remotecontrol saltshaker soapbar soapbottle spraybottle statue "
        "toiletpaper vase watch"),
    "sinkbasin": _words(
        "apple bowl butterknife cloth cup dishsponge egg fork knife lettuce mug "
        "pan plate pot potato soapbar spatula spoon tomato"),
    "stoveburner": _words("pan pot"),
    "garbagecan": _words(
        "apple bread cd cloth dishsponge egg lettuce newspaper pen pencil "
        "potato soapbar soapbottle spraybottle toiletpaper tomato"),
    "coffeemachine": _words("mug"),
    "toaster": _words(""),
    "sofa": _words(
        "book box cellphone cloth creditcard keychain laptop newspaper pillow "
        "remotecontrol"),
    "armchair": _words(
        "book box cellphone cloth creditcard keychain laptop newspaper pillow "
        "remotecontrol"),
    "coffeetable": _words(
        "alarmclock apple book bowl box bread butterknife candle cd cellphone "
        "cloth creditcard cup dishsponge egg fork keychain knife laptop lettuce "
        "mug newspaper pan pen pencil peppershaker plate pot potato "
        "remotecontrol saltshaker soapbar soapbottle spatula spoon spraybottle "
        "statue toiletpaper tomato vase watch"),
    "sidetable": _words(
        "alarmclock apple book bowl box bread butterknife candle cd cellphone "
        "cloth creditcard cup dishsponge egg fork keychain knife laptop lettuce "
        "mug newspaper pan pen pencil peppershaker plate pot potato "
        "remotecontrol saltshaker soapbar soapbottle spatula spoon spraybottle "
        "statue toiletpaper tomato vase watch"),
    "tvstand": _words(""),
    "dresser": _words(
        "alarmclock book bowl box candle cd cellphone cloth creditcard cup "
        "keychain laptop mug newspaper pen pencil plate remotecontrol "
        "spraybottle statue toiletpaper vase watch"),
    "bed": _words("book cellphone laptop newspaper pillow"),
    "desk": _words(
        "alarmclock book bowl box candle cd cellphone cloth creditcard cup "
        "keychain laptop mug newspaper pen pencil plate remotecontrol "
        "soapbottle spraybottle statue toiletpaper vase watch"),
    "toilet": _words(
        "candle cloth dishsponge newspaper soapbar soapbottle spraybottle "
        "toiletpaper"),
    "bathtubbasin": _words("cloth dishsponge soapbar"),
    "towelholder": _words(""),
    "handtowelholder": _words(""),
    "toiletpaperhanger": _words("toiletpaper"),
}
# transform verb -> object types it applies to
TRANSFORMABLE: dict[str, frozenset[str]] = {
    "heat": _words("apple bread cup egg mug plate potato tomato"),
    "cool": _words("apple bowl bread cup egg lettuce mug pan plate pot potato tomato"),
    "clean": _words("apple bowl butterknife cloth cup dishsponge egg fork knife lettuce mug "
                    "pan plate pot potato soapbar spatula spoon tomato"),
}
# objects that are receptacles themselves ("This is a normal mug 1. In it, you see ...")
RECEPTACLE_OBJECTS = _words("bowl box cup mug pan plate pot")
# ALFWorld's SliceObject: a sliceable object sliced with a knife the agent holds
SLICEABLE = _words("apple bread egg lettuce potato tomato")
SLICERS = _words("butterknife knife")


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
