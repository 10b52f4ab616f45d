"""The household world's names, for warm starts that must say names the demos never used.

A tiny model built from scratch knows no words.  Trained only on demonstrations from
the seen layouts, it is never asked to *say* a name that only the unseen layouts use
("coffeemachine 1", "butterknife 3"): the softmax pushes that token down at every step,
and the policy cannot emit it even when the observation prints it (teacher-forced
log-likelihood about -17 after the quickstart's warm start).  In the quickstart this
limits little: such names lie on the expert's route in 59 of the 200 ``valid_unseen``
evaluation tasks, never as the destination, and in a one-seed pilot those tasks were
solved as often as the rest (docs/results/notes.md).  Two remedies live here for envs and models where it does:

* :func:`name_corpus` -- every catalog name in the engine's observation and action
  phrasing, other slots at random (``warmstart.lm_epochs`` / ``lm_mix``).  It trains the
  names as words; its ~12k tokens are few optimizer steps at the default row length
  (``warmstart.lm_row_tokens``), and at the one dose tried on the quickstart (9 steps) it
  did not make "go to coffeemachine 1" sayable as an action (log-likelihood about -18).
* :func:`renamer` -- a consistent renaming of one demonstration (``warmstart.rename``):
  receptacle types replaced by others that play the same part (openable stores, plain
  surfaces; the appliances the tasks name keep their names) and the numbers of every
  name redrawn, keeping the order of the names (the oracle searches in name order), so
  every catalog name becomes an *action target* somewhere and the policy learns to copy
  the name the task and the room print.  In the quickstart, renaming half of the demos
  made those names sayable (negative log-likelihood 17 -> 1.5) but cost success.

Both carry names and grammar only: no layout, task or dynamics of the evaluation
splits (a renamed demo may put an apple in a coffeemachine).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from .catalog import APPLIANCE, RECEPTACLES, lexicon

MAX_NUMBER = 5  # the generator numbers at most 5 receptacles of a type, objects fewer

_RECEPTACLE_FORMS = (
    "You arrive at {r}. On the {r}, you see a {o}, and a {o2}.",
    "You arrive at {r}. The {r} is closed.",
    "You open the {r}. The {r} is open. In it, you see a {o}.",
    "You close the {r}.",
    ("You are in the middle of a room. Looking quickly around you, you see a {r2}, a {r}, "
     "and a {r3}."),
    "go to {r}",
    "open {r}",
    "examine {r}",
    "move {o} to {r}",
    "take {o} from {r}",
)
_OBJECT_FORMS = (
    "You pick up the {o} from the {r}.",
    "You move the {o} to the {r}.",
    "On the {r}, you see a {o2}, and a {o}.",
    "You are carrying: a {o}.",
    "There's nothing special about {o}.",
    "take {o} from {r}",
    "move {o} to {r}",
    "examine {o}",
    "use {o}",
)


def name_corpus(seed: int = 0, repeats: int = 4) -> list[str]:
    """``repeats`` sentences per numbered name (receptacles in receptacle forms, objects
    in object forms), deterministic in ``seed``."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rng = random.Random(seed)
    receptacles = sorted(RECEPTACLES)
    objects = [w for w in lexicon() if w not in RECEPTACLES]

    def numbered(names: list[str]) -> str:
        return f"{rng.choice(names)} {rng.randint(1, MAX_NUMBER)}"

    lines = []
    for kinds, forms, slot in ((receptacles, _RECEPTACLE_FORMS, "r"),
                               (objects, _OBJECT_FORMS, "o")):
        for name in kinds:
            for n in range(1, MAX_NUMBER + 1):
                for _ in range(repeats):
                    fill = {"r": numbered(receptacles), "r2": numbered(receptacles),
                            "r3": numbered(receptacles), "o": numbered(objects),
                            "o2": numbered(objects)}
                    fill[slot] = f"{name} {n}"
                    lines.append(rng.choice(forms).format(**fill))
    rng.shuffle(lines)
    return lines


def _swap_classes() -> tuple[tuple[str, ...], ...]:
    """Receptacle types that may stand in for each other: same verbs apply (openable or
    not), and none is an appliance a task names (microwave, fridge, sinkbasin)."""
    fixed = set(APPLIANCE.values())
    free = sorted(r for r in RECEPTACLES if r not in fixed)
    return (tuple(r for r in free if RECEPTACLES[r]), tuple(r for r in free if not RECEPTACLES[r]))


def renamer(rng: random.Random, texts: Sequence[str]) -> Callable[[str], str]:
    """A random consistent renaming of the names in ``texts`` (one demonstration),
    drawn from ``rng``.  Receptacle types move within their swap class, numbers 1..MAX_NUMBER
    within a name (higher numbers are kept), and the renaming keeps the *order* of the
    names present: the oracle searches receptacles in name order and rooms list them in
    display order, so a renamed demo shows the same search a real one would.  The
    returned function rewrites one text; apply it to every text of the demonstration."""
    present: dict[str, set[int]] = {}
    for text in texts:
        for m in _NAME.finditer(text):
            nums = present.setdefault(m.group(1), set())
            if m.group(2) is not None and 1 <= int(m.group(2)) <= MAX_NUMBER:
                nums.add(int(m.group(2)))
    types = _ordered_types(rng, sorted(w for w in present if w in RECEPTACLES))
    numbers: dict[tuple[str, int], int] = {}
    for word, nums in present.items():
        new = sorted(rng.sample(range(1, MAX_NUMBER + 1), len(nums)))
        numbers.update(((word, a), b) for a, b in zip(sorted(nums), new))

    def sub(m: re.Match) -> str:
        word, num = m.group(1), m.group(2)
        if num is not None:
            num = str(numbers.get((word, int(num)), num))
        new = types.get(word, word)
        return new if num is None else f"{new} {num}"

    return lambda text: _NAME.sub(sub, text)


def _ordered_types(rng: random.Random, present: list[str], tries: int = 100) -> dict[str, str]:
    """Present receptacle types -> distinct types of the same swap class, in the same
    alphabetical order as ``present`` (appliances stay); identity if no draw keeps it."""
    for _ in range(tries):
        out = {w: w for w in present}
        for cls in _SWAP_CLASSES:
            mine = [w for w in present if w in cls]
            out.update(zip(mine, sorted(rng.sample(cls, len(mine)))))
        if sorted(present, key=out.__getitem__) == present:
            return out
    return {w: w for w in present}


_NAME = re.compile(r"\b(" + "|".join(sorted(set(lexicon()) | set(RECEPTACLES), key=len,
                                             reverse=True)) + r")\b(?: (\d+)\b)?")
_SWAP_CLASSES = _swap_classes()
