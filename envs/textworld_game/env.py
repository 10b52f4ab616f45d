"""``turngym/TextWorldGame-v0``: any TextWorld game as a turngym text env.

A *split* is a list of game files: one game (``games/simple.z8``), a directory of them
(every ``*.z8`` / ``*.ulx`` below it, sorted), a list of either, or a mapping from split
name to one of those (``{"train": "games/train", "valid": "games/valid"}``).  A directory
that has a sub-directory named like the requested split uses that sub-directory.  Games
need the ``.json`` file ``tw-make`` writes next to them: TextWorld tracks the game state
(admissible commands, facts, the winning policy) from it.

Conventions (as ``turngym/TextWorld-v0``): ``reset(seed=i)`` plays game ``i % len(split)``
(``options={"task_index": i}`` the same), so the seed names the task; ``replay(seed,
actions)`` reproduces the state exactly; ``info`` carries ``admissible_commands``,
``progress`` (score points reached), ``state_key`` (hash of the game's facts), ``won``,
``lost``, ``score``, ``max_score``, ``task_id``, ``task_type``, ``valid_action``; privileged
keys never appear in the observation.  Reward is 1 on a win (``reward="won"``) or the
score gained, normalised by the game's maximum (``reward="score"``).  Episodes end on a
win or a loss, and are truncated after ``max_turns`` actions.

Commands are sent to the game one at a time: control characters become spaces, and
commands the game would run but TextWorld's state tracker cannot follow are answered by
the env without reaching the game (a meta command such as ``save``/``restore``/``quit``/
``undo``, or several commands or objects at once: ``take key. open door``, ``take all``),
so that admissible commands, facts and replay stay true.  Anything else, including
nonsense, goes to the game and its answer is the observation.

:class:`GameEnv` is the shared machinery for engines run through ``textworld`` (this env
and ``turngym/ALFWorld-v0``).
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base import TextEnv, sanitize

GAME_SUFFIXES = (".z8", ".ulx")
MAX_COMMAND_CHARS = 200
# Inform's out-of-world commands: they change the interpreter, not the world
META_VERBS = frozenset({
    "quit", "q", "restart", "save", "restore", "script", "unscript", "transcript",
    "noscript", "undo", "oops", "verbose", "brief", "superbrief", "short", "long", "normal",
    "notify", "pronouns", "nouns", "version", "again", "g",
})
# words that make Inform run several actions in one turn
CHAIN_WORDS = frozenset({"then", "and", "all", "everything", "except", "but"})
META_REFUSED = "That command is not available: game meta commands (save, restore, quit, undo, ...) are disabled."
CHAIN_REFUSED = "One command per turn: that command names several actions or objects at once."

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_SPACES = re.compile(r" {2,}")
_BANNER = re.compile(r"[^A-Za-z]*")  # a line of the title art: no letters
_PROMPT = re.compile(r"\n*>[^\n]*\Z")  # Inform's prompt and status line after the feedback
_TASK_TYPE = re.compile(r"^(tw-(?:simple|cooking|coin_collector|treasure_hunter)-.+)-\w+$")


def _textworld():
    try:
        import textworld
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("TextWorld games need the textworld package: "
                          "pip install 'turngym[textworld]'") from exc
    return textworld


def _game_files(source: str | Path) -> list[Path]:
    p = Path(source).expanduser()
    if p.is_file():
        if p.suffix not in GAME_SUFFIXES:
            raise ValueError(f"{p} is not a TextWorld game ({'/'.join(GAME_SUFFIXES)})")
        return [p]
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.suffix in GAME_SUFFIXES and f.is_file())
    raise FileNotFoundError(f"no TextWorld game or directory at {p}")


def collect_games(games: Any, split: str) -> list[Path]:
    """The game files of ``split`` (see the module docstring for the accepted forms)."""
    if games is None:
        raise ValueError("TextWorldGame-v0 needs games=: a game file, a directory of games, "
                         "a list of them, or {split: ...}")
    if isinstance(games, Mapping):
        if split not in games:
            raise ValueError(f"no games for split {split!r}; splits given: {sorted(games)}")
        return collect_games(games[split], split)
    if isinstance(games, (str, Path)):
        p = Path(games).expanduser()
        if p.is_dir() and (p / split).is_dir():
            p = p / split
        found = _game_files(p)
    else:
        found = [f for g in games for f in _game_files(g)]
    if not found:
        raise FileNotFoundError(f"no {'/'.join(GAME_SUFFIXES)} games under {games!r}")
    missing = [f for f in found if not f.with_suffix(".json").is_file()]
    if missing:
        raise FileNotFoundError(
            f"{missing[0]} has no {missing[0].with_suffix('.json').name} next to it; TextWorld "
            "needs the game's .json (tw-make writes it) to track admissible commands and state")
    return found


def clean_command(text: str) -> str:
    """One line of printable text: control characters (newlines included) become spaces."""
    text = _CONTROL.sub(" ", str(text))
    return _SPACES.sub(" ", text).strip()[:MAX_COMMAND_CHARS]


def strip_banner(text: str) -> str:
    """Drops the ASCII-art title TextWorld games print before the objective (its leading
    lines without a letter): a thousand characters that carry no information."""
    lines = text.split("\n")
    k = 0
    while k < len(lines) and _BANNER.fullmatch(lines[k]):
        k += 1
    return "\n".join(lines[k:]).lstrip("\n") if k else text


def clean_feedback(text: str) -> str:
    """The game's answer without Inform's trailing prompt/status line and blank edges."""
    return _PROMPT.sub("", text or "").strip("\n").rstrip()


class GameEnv(TextEnv):
    """A game engine run through ``textworld`` (``textworld.start`` + wrappers) behind
    turngym's conventions.  Subclasses say which files make a split (``_collect``), which
    wrappers and infos the engine needs, how commands are filtered and what ``progress``,
    ``task_type`` and the expert are.

    The engine is loaded once and re-used (``load`` + ``reset``) across games.  The expert
    (``oracle_action``) is computed only when asked: while the actions so far follow the
    game's walkthrough it is the walkthrough's next command; otherwise the engine's
    winning policy is requested from then on in the episode (TextWorld's quest tracking,
    or ALFWorld's PDDL planner), so episodes that never ask for it never pay for it.
    """

    fallback_action = "look"
    default_task_type = "game"
    # the engine must track the winning policy from the reset on (TextWorld's quest
    # tracking) rather than compute it for one state (a planner, as ALFWorld's)
    plan_from_reset = True
    # a command outside the admissible list leaves the state as it was (true of PDDL
    # engines; an Inform game may accept a synonym), so it does not leave the walkthrough
    inadmissible_is_noop = False
    case_insensitive = True  # Inform's parser ignores case; ALFWorld's matches exactly

    def __init__(self, split: str = "train", max_turns: int = 50, reward: str = "won",
                 render_mode: str | None = None):
        super().__init__(render_mode)
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if reward not in ("won", "score"):
            raise ValueError(f"reward must be 'won' or 'score', not {reward!r}")
        self.split = split
        self.max_turns = max_turns
        self.reward_mode = reward
        self.game_files: list[Path] = self._collect(split)
        self._engine = None
        self._loaded: Path | None = None
        self._state = None
        self._index: int | None = None
        self._actions: list[str] = []  # every command the engine received
        self._moves: list[str] = []  # those that may have changed the state
        self._walkthrough: list[str] | None = None
        self._planning = False
        self._steps = 0
        self._over = False
        self._score = 0

    # -------------------------------------------------------------- subclass hooks
    def _collect(self, split: str) -> list[Path]:
        raise NotImplementedError

    def _request_infos(self):
        textworld = _textworld()
        return textworld.EnvInfos(admissible_commands=True, won=True, lost=True, score=True,
                                  max_score=True, facts=True)

    def _wrappers(self) -> list:
        return []

    def _clean(self, action: str) -> str:
        """The command as the engine receives it."""
        return clean_command(action[: self.max_action_length])

    def _filter_command(self, command: str, admissible: Sequence[str]) -> str | None:
        """A refusal message for a command that must not reach the engine, else None."""
        return None

    def _walkthrough_for(self, game: Path, state) -> list[str] | None:
        return None

    def _progress(self, state) -> tuple[str, ...]:
        return ()

    def _task_type(self, game: Path, state) -> str:
        return self.default_task_type

    def _state_key_fact(self, fact: str) -> bool:
        return True

    # -------------------------------------------------------------- engine
    def _load(self, game: Path) -> None:
        textworld = _textworld()
        with warnings.catch_warnings():
            # jericho's own score detection does not know tw-make games; TextWorld's
            # state tracking (which this env reads) does
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            if self._engine is None:
                self._engine = textworld.start(str(game), request_infos=self._request_infos(),
                                               wrappers=self._wrappers())
            elif self._loaded != game:
                self._engine.load(str(game))
        self._loaded = game

    def _set_planning(self, on: bool) -> None:
        self._engine.request_infos.policy_commands = on
        self._planning = on

    def _engine_reset(self, game: Path):
        self._load(game)
        self._set_planning(False)
        return self._engine.reset()

    # -------------------------------------------------------------- gymnasium
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        index = options.get("task_index", seed)
        if index is None:
            index = int(self.np_random.integers(0, 2**31 - 1))
        self._index = int(index) % len(self.game_files)
        game = self.game_files[self._index]
        self._state = self._engine_reset(game)
        self._actions = []
        self._moves = []
        self._steps = 0
        self._over = False
        self._score = int(self._state.get("score") or 0)
        self._walkthrough = self._walkthrough_for(game, self._state)
        obs = sanitize(self._observation(self._state.feedback, first=True),
                       self.max_observation_length)
        self._last_obs = obs
        return obs, self._info(valid=True)

    def _observation(self, feedback: str, first: bool = False) -> str:
        """The engine's feedback as the agent reads it (``first``: after a reset)."""
        return feedback

    def step(self, action: str):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        if self._over:  # the engine would go on (and keep paying a win): as every env does
            raise RuntimeError("episode is over (terminated or truncated); call reset()")
        command = self._clean(action if isinstance(action, str) else str(action))
        admissible = list(self._state.get("admissible_commands") or [])
        self._steps += 1
        refusal = self._filter_command(command, admissible)
        if refusal is not None:
            obs, valid = refusal, False
        else:
            valid = command in admissible or (self.case_insensitive
                                               and command.lower() in admissible)
            self._state, _, _ = self._engine.step(command)
            self._actions.append(command)
            if valid or not self.inadmissible_is_noop:
                self._moves.append(command)
            obs = self._observation(self._state.feedback)
        won, lost = bool(self._state.get("won")), bool(self._state.get("lost"))
        score = int(self._state.get("score") or 0)
        if self.reward_mode == "won":
            reward = 1.0 if won else 0.0
        else:
            reward = (score - self._score) / max(1, int(self._state.get("max_score") or 1))
        self._score = score
        terminated = won or lost
        truncated = not terminated and self._steps >= self.max_turns
        self._over = terminated or truncated
        obs = sanitize(obs, self.max_observation_length)
        self._last_obs = obs
        return obs, float(reward), terminated, truncated, self._info(valid=valid)

    def _info(self, valid: bool) -> dict[str, Any]:
        st = self._state
        game = self.game_files[self._index]
        return {
            "task_id": f"{self.split}-{self._index}",
            "task_type": self._task_type(game, st),
            "game_file": str(game),
            "valid_action": valid,
            "won": bool(st.get("won")),
            "lost": bool(st.get("lost")),
            "score": int(st.get("score") or 0),
            "max_score": int(st.get("max_score") or 0),
            "admissible_commands": list(st.get("admissible_commands") or []),
            "progress": self._progress(st),
            "state_key": self.state_key(),
            "steps": self._steps,
        }

    def state_key(self) -> str:
        """Hash of the engine's facts (the history-free world state)."""
        facts = sorted(f for f in map(str, self._state.get("facts") or ())
                       if self._state_key_fact(f))
        return hashlib.blake2b("\n".join(facts).encode(), digest_size=8).hexdigest()

    # -------------------------------------------------------------- expert
    def oracle_action(self) -> str:
        """The expert's next command: the walkthrough while on it, else the engine's
        winning policy from the current state (requested from here on)."""
        if self._state is None:
            raise RuntimeError("call reset() first")
        k = len(self._moves)
        wt = self._walkthrough
        if not self._planning and wt and k < len(wt) and self._moves == wt[:k]:
            return wt[k]
        if not self._planning:
            self._replan_here()
        plan = self._state.get("policy_commands") or []
        return plan[0] if plan else self.fallback_action

    def _replan_here(self) -> None:
        """Re-runs the episode's engine commands with the winning policy requested for
        the last state (the engine is deterministic, so the state is the same)."""
        game = self.game_files[self._index]
        self._load(game)
        self._set_planning(self.plan_from_reset or not self._actions)
        state = self._engine.reset()
        for i, a in enumerate(self._actions):
            if i == len(self._actions) - 1:
                self._set_planning(True)
            state, _, _ = self._engine.step(a)
        self._state = state

    def close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.close()
            except Exception:  # pragma: no cover - engine teardown is best effort
                pass
            self._engine = None
            self._loaded = None
        super().close()


class TextWorldGameEnv(GameEnv):
    """Any TextWorld game (``tw-make`` output, ``.z8``/``.ulx`` with its ``.json``)."""

    fallback_action = "look"
    default_task_type = "custom"

    def __init__(self, games: Any = None, split: str = "train", max_turns: int = 100,
                 reward: str = "won", strip_banner: bool = True,
                 render_mode: str | None = None):
        self.games = games
        self.strip_banner = strip_banner
        super().__init__(split=split, max_turns=max_turns, reward=reward,
                         render_mode=render_mode)

    def _collect(self, split: str) -> list[Path]:
        games = self.games
        if (split != "train" and isinstance(games, (str, Path)) and Path(games).is_dir()
                and not (Path(games).expanduser() / split).is_dir()):
            warnings.warn(f"{games} has no {split!r} sub-directory: split {split!r} plays the "
                          "same games as every other split", stacklevel=3)
        return collect_games(games, split)

    def _request_infos(self):
        infos = super()._request_infos()
        infos.extras = ["walkthrough", "uuid"]
        return infos

    def _observation(self, feedback: str, first: bool = False) -> str:
        text = clean_feedback(feedback)
        return strip_banner(text) if first and self.strip_banner else text

    def _filter_command(self, command: str, admissible: Sequence[str]) -> str | None:
        if command in admissible or command.lower() in admissible:
            return None
        words = re.findall(r"[a-z]+", command.lower())
        if words and words[0] in META_VERBS:
            return META_REFUSED
        if re.search(r"[.;,]", command.rstrip(".!? ")) or CHAIN_WORDS & set(words):
            return CHAIN_REFUSED
        return None

    def _walkthrough_for(self, game: Path, state) -> list[str] | None:
        wt = state.get("extra.walkthrough")
        return list(wt) if wt else None

    def _progress(self, state) -> tuple[str, ...]:
        score = max(0, int(state.get("score") or 0))
        return tuple(f"point {k}" for k in range(1, score + 1))

    def _task_type(self, game: Path, state) -> str:
        m = _TASK_TYPE.match(str(state.get("extra.uuid") or ""))
        return m.group(1) if m else self.default_task_type

    def vocabulary(self) -> list[str]:
        """Words of the split's entity names, descriptions, objectives and walkthroughs,
        plus TextWorld's command words (for tiny word-level tokenizers)."""
        words = set(["go", "north", "south", "east", "west", "take", "from", "put", "on", "in", "insert", "into", "open", "close", "lock", "unlock", "with", "examine", "look", "inventory", "eat", "drop", "cook", "slice", "chop", "dice", "prepare", "meal", "drink"])
        for game in self.game_files:
            data = json.loads(game.with_suffix(".json").read_text())
            texts = [data.get("objective") or ""]
            for _, info in data.get("infos", []):
                texts += [info.get("name") or "", info.get("desc") or ""]
            texts += (data.get("metadata") or {}).get("walkthrough") or []
            for t in texts:
                words.update(re.findall(r"[a-z][a-z'-]*", t.lower()))
        return sorted(words)
