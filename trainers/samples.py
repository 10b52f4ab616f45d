"""Trajectory samples for ``turngym view``: a bounded, size-capped log of whole groups.

During RL, :class:`SampleLogger` appends ``groups_per_step`` trajectory groups of every
step to ``RUN_DIR/samples.jsonl``, one JSON record per group, with everything needed to
*show* where credit went and to recompute other estimators later -- but no tokens:

* per rollout: outcome, success, stop reason, the task text, and per turn the action,
  the observation, the env reward and the cheap env info (:func:`cheap_info`);
* the per-turn advantages of the estimator that trained the run (for estimators that
  credit below the turn, the mean of each turn's token advantages);
* the inputs other estimators read, where they are cheap to keep: ``state_key``
  (step_groups), ``progress`` / ``won`` / ``answered`` / ``valid_action`` /
  ``valid_format`` (role_judge's oracle judge, grpo's invalid penalty), ``gold_answer``,
  and -- only when the run's estimator had an answer scorer (info_gain: the policy,
  td_log_ratio: the frozen reference) -- the gold-answer token log-probs at every turn
  start, so :func:`recompute` can run those estimators again without a model.

Bounds: ``groups_per_step`` groups per step (groups whose outcomes differ first: they
are the ones with a GRPO signal, then the rest, each in a step-seeded random order),
text fields clipped to ``max_text`` characters, and ``max_bytes`` for the whole file;
when the next step would pass it, one ``{"kind": "capped"}`` record is written and
logging stops.  Each step's records go out in one ``O_APPEND`` write, and a torn last
line (a crash mid-write) is closed before the next append and skipped by
:func:`read_samples`.  A resumed run redoes steps: the reader keeps the redone copy.

:func:`recompute` rebuilds token-free :class:`~turngym.types.TrajectoryGroup` objects
from a record (:func:`rebuild_group`) and calls the registered estimators on them
(grpo, step_groups, role_judge with :class:`~turngym.credit.roles.OracleJudge`, and
info_gain / td_log_ratio through :class:`StoredScorer` when scores were logged);
an estimator that cannot run from logged data is reported with the reason.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import credit as credit_lib
from ..credit.registry import make_params
from ..credit.roles import OracleJudge, segments_of
from ..types import ContextMode, CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn

__all__ = [
    "PROBE_SAMPLES_FILE",
    "RECORD_VERSION",
    "SAMPLES_FILE",
    "SampleLogger",
    "StoredScorer",
    "cheap_info",
    "group_record",
    "log_samples",
    "oracle_roles",
    "read_samples",
    "rebuild_group",
    "recompute",
    "turn_level",
    "write_probe_samples",
]

SAMPLES_FILE = "samples.jsonl"
PROBE_SAMPLES_FILE = "probe_samples.jsonl"
RECORD_VERSION = 1
# env/agent info keys credit estimators read: always kept (when present)
CREDIT_KEYS = ("state_key", "progress", "valid_action", "valid_format", "format_error", "won",
               "answered", "env_error", "gold_answer")
# read per turn; other turn infos equal to the reset info's (task_id, gold_answer, ...) are
# not repeated in every turn
TURN_KEYS = tuple(k for k in CREDIT_KEYS if k != "gold_answer")
_MAX_SCALAR_STR = 200  # other string infos longer than this are dropped
_MAX_LIST = 32  # other list infos longer than this are dropped
_LOGPROB_FLOOR = -1e9  # -inf / NaN log-probs as logged (any estimator floor is far above)


def clip_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, saying how much was cut."""
    text = str(text)
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[:max_chars] + f" ... [{len(text) - max_chars} more chars]"


_SKIP = object()  # "not small enough to keep"


def _scalar(v: Any) -> Any:
    """A JSON-safe scalar for ``v`` (numpy scalars unwrapped; NaN/inf as ``None``), or
    ``_SKIP`` when ``v`` is not a scalar or a string longer than ``_MAX_SCALAR_STR``."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bool) or v is None or isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str) and len(v) <= _MAX_SCALAR_STR:
        return v
    return _SKIP


def _small_value(v: Any) -> Any:
    s = _scalar(v)
    if s is not _SKIP:
        return s
    if isinstance(v, (list, tuple)) and len(v) <= _MAX_LIST:
        items = [_scalar(x) for x in v]
        if all(x is not _SKIP for x in items):
            return items
    return _SKIP


def cheap_info(info: Mapping[str, Any], reset_info: Mapping[str, Any] | None = None) -> dict:
    """The part of an env/agent info worth keeping in a sample: every key a credit
    estimator reads (:data:`CREDIT_KEYS`; ``state_key`` as a string, lists as lists) and
    other small scalars or short lists of scalars.  Bulky values are dropped.  Given the
    trajectory's ``reset_info``, a turn info's other keys holding the same value as
    there (``task_id``, ``gold_answer``, ...) are left out."""
    out: dict = {}
    for k, v in info.items():
        if k == "first_observation":
            continue  # kept once per trajectory as its task text
        if reset_info is not None and k not in TURN_KEYS and k in reset_info \
                and _same(reset_info[k], v):
            continue
        if k == "state_key":
            out[k] = None if v is None else str(v)
        elif k in CREDIT_KEYS and isinstance(v, (list, tuple)):
            out[k] = [str(x) if _scalar(x) is _SKIP else _scalar(x) for x in v]
        elif k in CREDIT_KEYS and isinstance(v, str):
            out[k] = v  # never dropped for length: the estimator reads it
        else:
            s = _small_value(v)
            if s is not _SKIP:
                out[str(k)] = s
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - e.g. numpy arrays: treat as different
        return False


def turn_level(c: CreditAssignment) -> list[list[float]]:
    """One number per turn: the turn advantage, or the mean of the turn's token
    advantages where the estimator credits below the turn (branch segments)."""
    rows = []
    for i, adv in enumerate(c.turn_advantages):
        toks = c.token_advantages[i] if c.token_advantages is not None else None
        row = []
        for t, a in enumerate(adv):
            x = toks[t] if toks is not None and toks[t] else None
            row.append(float(np.mean(x)) if x else float(a))
        rows.append(row)
    return rows


def _credit_entry(c: CreditAssignment) -> dict:
    entry: dict = {"turn": [list(map(float, r)) for r in c.turn_advantages]}
    if c.token_advantages is not None and any(x is not None for x in c.token_advantages):
        entry["token_mean"] = turn_level(c)
    if c.extra:
        entry["extra_trajectories"] = len(c.extra)
    return entry


def _finite_logprobs(a) -> list[float]:
    x = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=_LOGPROB_FLOOR,
                      neginf=_LOGPROB_FLOOR, posinf=0.0)
    return [float(v) for v in np.maximum(x, _LOGPROB_FLOOR)]


def logged_scores(scorer, trajs: Sequence[Trajectory]) -> dict:
    """What :class:`StoredScorer` needs to replay ``scorer`` on ``trajs``: the gold
    answers' token log-probs at every turn start (``GoldScorer.turn_start_scores``) and
    each gold answer's gold-token mask."""
    raw = scorer.turn_start_scores(list(trajs))
    golds = {g for tr in trajs for g in credit_lib.scoring.gold_answers(tr)}
    return {"turn_start": [[[_finite_logprobs(a) for a in per_turn] for per_turn in per_traj]
                           for per_traj in raw],
            "answer_masks": {g: [bool(x) for x in scorer.answer_mask(g)] for g in sorted(golds)}}


def _nulls_for_nan(rows: Sequence[Sequence[float]]) -> list[list[float | None]]:
    return [[float(x) if math.isfinite(x) else None for x in row] for row in rows]


def group_record(group: TrajectoryGroup, credits: Mapping[str, CreditAssignment], *,
                 step: int, estimator: str | None, params: Any = None,
                 max_text: int = 4000, tokenizer=None, scores: Mapping[str, dict] | None = None,
                 mc_advantages: Sequence[Sequence[float]] | None = None,
                 mc_standard_errors: Sequence[Sequence[float]] | None = None,
                 source: str = "train") -> dict:
    """One group as a JSON-able sample record (pure: reads the group, writes nothing).

    ``credits`` maps estimator names to their assignment for this group (the run's
    estimator during training; every module in a probe).  ``tokenizer`` adds the
    decoded response where it differs from the parsed action.  ``scores`` holds
    :func:`logged_scores` under ``"policy"`` / ``"reference"``.  ``mc_advantages``: the
    probe's Monte-Carlo true advantage of every turn, ``mc_standard_errors`` its standard
    error."""
    trajs = []
    for tr in group:
        turns = []
        for t in tr.turns:
            turn = {"action": clip_text(t.action_text, max_text),
                    "observation": clip_text(t.observation, max_text),
                    "reward": float(t.reward), "info": cheap_info(t.info, tr.info)}
            if tokenizer is not None and t.response_ids:
                text = tokenizer.decode(list(t.response_ids), skip_special_tokens=False)
                if text.strip() != t.action_text.strip():
                    turn["response"] = clip_text(text, max_text)
            turns.append(turn)
        trajs.append({"outcome": float(tr.outcome_reward), "success": bool(tr.success),
                      "stop": StopReason(tr.stop_reason).value, "task_id": tr.task_id,
                      "group_id": tr.group_id, "policy_version": int(tr.policy_version),
                      "context_mode": ContextMode(tr.context_mode).value,
                      "task": clip_text(tr.info.get("first_observation", ""), max_text),
                      "info": cheap_info(tr.info), "turns": turns})
    rec: dict = {"kind": "group", "version": RECORD_VERSION, "source": source,
                 "step": int(step), "estimator": estimator, "params": _plain(params or {}),
                 "task_id": group.task_id, "trajectories": trajs,
                 "credit": {name: _credit_entry(c) for name, c in credits.items()},
                 "metrics": {name: {k: float(v) for k, v in c.metrics.items()}
                             for name, c in credits.items()}}
    if scores:
        rec["scores"] = dict(scores)
    if mc_advantages is not None:
        # NaN (every continuation from that state hit an env error) as null
        rec["mc_advantage"] = _nulls_for_nan(mc_advantages)
    if mc_standard_errors is not None:  # NaN (one continuation) as null
        rec["mc_se"] = _nulls_for_nan(mc_standard_errors)
    return rec


def _plain(x: Any) -> Any:
    """``x`` as plain JSON data (dataclasses as dicts, enums as their values)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, enum.Enum):
        return _plain(x.value)
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _has_spread(group: TrajectoryGroup) -> bool:
    r = group.outcome_rewards()
    return len(set(r)) > 1


def choose_groups(groups: Sequence[TrajectoryGroup], n: int, step: int) -> list[int]:
    """Indices of the ``n`` groups to keep at ``step``: groups whose outcomes differ
    first (they carry a GRPO signal), then the rest, each in a step-seeded order."""
    order = np.random.default_rng([7411, int(step)]).permutation(len(groups))
    mixed = [int(i) for i in order if _has_spread(groups[i])]
    rest = [int(i) for i in order if not _has_spread(groups[i])]
    return sorted((mixed + rest)[:max(0, n)])


class SampleLogger:
    """Appends a bounded sample of every RL step's groups to ``RUN_DIR/samples.jsonl``.

    ``SampleLogger(run_dir, groups_per_step=2, max_bytes=20_000_000).log(step, groups,
    credits, estimator_name)`` -- ``groups_per_step=0`` turns it off.  ``fresh`` removes
    an earlier file (a new run); otherwise records are appended (a resumed run) and the
    byte cap counts what is already there."""

    def __init__(self, run_dir: str | Path, groups_per_step: int = 2,
                 max_bytes: int = 20_000_000, max_text: int = 4000, fresh: bool = False,
                 filename: str = SAMPLES_FILE):
        if groups_per_step < 0 or max_bytes <= 0:
            raise ValueError("groups_per_step must be >= 0 and max_bytes > 0")
        self.path = Path(run_dir) / filename
        self.groups_per_step = int(groups_per_step)
        self.max_bytes = int(max_bytes)
        self.max_text = int(max_text)
        self.capped = False
        self._warned = False
        if fresh and self.path.exists():
            self.path.unlink()
        if self.groups_per_step:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._size = self.path.stat().st_size if self.path.exists() else 0
        self._torn = False
        if self._size:
            with open(self.path, "rb") as f:
                f.seek(-1, 2)
                self._torn = f.read(1) != b"\n"
            with open(self.path, "rb") as f:  # a capped run stays capped on resume
                f.seek(max(0, self._size - 4096))
                self.capped = b'"kind":"capped"' in f.read()

    @property
    def enabled(self) -> bool:
        return self.groups_per_step > 0 and not self.capped

    def log(self, step: int, groups: Sequence[TrajectoryGroup],
            credits: Sequence[CreditAssignment], estimator: str, params: Any = None,
            ctx=None, tokenizer=None) -> int:
        """Logs up to ``groups_per_step`` of ``groups`` (with their ``credits`` from
        ``estimator`` run with ``params``: a mapping or its params dataclass); returns
        the bytes written.  With ``ctx`` holding an answer scorer
        (``scorer``: the policy, ``reference_scorer``: the frozen reference) the gold
        answers' log-probs at every turn start are logged too.  A failure warns once and
        never stops training."""
        if not self.enabled or not groups:
            return 0
        if len(credits) != len(groups):
            raise ValueError(f"{len(groups)} groups but {len(credits)} credit assignments")
        try:
            records = []
            for i in choose_groups(groups, self.groups_per_step, step):
                scores = {}
                for key, attr in (("policy", "scorer"), ("reference", "reference_scorer")):
                    scorer = getattr(ctx, attr, None) if ctx is not None else None
                    if scorer is not None:
                        scores[key] = logged_scores(scorer, list(groups[i]))
                rec = group_record(groups[i], {estimator: credits[i]}, step=step,
                                   estimator=estimator, params=params, max_text=self.max_text,
                                   tokenizer=tokenizer, scores=scores)
                rec.update(slot=len(records), groups_at_step=len(groups))
                records.append(rec)
            return self.write(records, step)
        except Exception as exc:  # noqa: BLE001 - a debugging aid must never kill a run
            if not self._warned:  # (same text every step: the warnings filter shows it once)
                warnings.warn(f"trajectory samples for turngym view not logged: {exc!r}",
                              RuntimeWarning, stacklevel=2)
                self._warned = True
            return 0

    def write(self, records: Iterable[dict], step: int) -> int:
        """Appends ``records`` in one write, or the cap marker if they would pass
        ``max_bytes``; returns the bytes written."""
        if self.capped:
            return 0
        data = b"".join(_line(r) for r in records)
        marker = _line({"kind": "capped", "step": int(step), "max_bytes": self.max_bytes})
        # room is kept for the marker (and a torn line's closing newline): the cap holds
        if self._size + len(data) + len(marker) + 1 > self.max_bytes:
            self.capped = True
            data = marker
        if self._torn:
            data = b"\n" + data
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        self._torn = False
        self._size += len(data)
        return len(data)


def log_samples(cfg, step: int, groups: Sequence[TrajectoryGroup],
                credits: Sequence[CreditAssignment], params: Any = None, ctx=None,
                tokenizer=None) -> int:
    """The training loop's one call (rank 0, right after credit): logs ``step``'s sample
    to ``output_dir/samples.jsonl`` as ``logging.samples_per_step`` and
    ``logging.samples_max_mb`` say.  Stateless between steps: the file itself says how
    full (or capped) it is, so a resumed run simply continues it."""
    lg = cfg.logging
    logger = SampleLogger(cfg.output_dir, int(lg.samples_per_step),
                          max(1, int(float(lg.samples_max_mb) * 1_000_000)))
    return logger.log(step, groups, credits, cfg.rl.credit.name, params, ctx, tokenizer)


def write_probe_samples(out_dir: str | Path, groups: Sequence[TrajectoryGroup],
                        credits: Mapping[str, Sequence[CreditAssignment]],
                        truth: Sequence[Sequence[Sequence[float]]], tokenizer=None,
                        max_text: int = 4000,
                        standard_errors: Sequence[Sequence[Sequence[float]]] | None = None
                        ) -> Path:
    """``out_dir/probe_samples.jsonl`` (replaced atomically): every probe group with
    each module's advantages (``credits[name][g]``) and the Monte-Carlo true advantage
    of every turn (``truth[g][i][t]``, with its standard error when given), for
    ``turngym view``."""
    from .checkpoint import write_atomic_text

    lines = []
    for g, group in enumerate(groups):
        rec = group_record(group, {name: c[g] for name, c in credits.items()}, step=0,
                           estimator=None, max_text=max_text, tokenizer=tokenizer,
                           mc_advantages=truth[g], source="probe",
                           mc_standard_errors=(standard_errors[g] if standard_errors is not None
                                               else None))
        rec.update(slot=g, groups_at_step=len(groups))
        lines.append(_line(rec).decode("utf-8"))
    path = Path(out_dir) / PROBE_SAMPLES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_text(path, "".join(lines))
    return path


def _line(rec: dict) -> bytes:
    return (json.dumps(rec, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            + "\n").encode("utf-8")


def read_samples(path: str | Path) -> tuple[list[dict], dict]:
    """(group records, status) from a samples file.  Unparseable lines (a torn write)
    are skipped and counted; when a step shows up again after later steps (a resumed
    run redid it), the redone records replace everything logged from that step on.
    ``status``: ``{"torn": n, "capped_at": step or None}``."""
    records: list[dict] = []
    status: dict = {"torn": 0, "capped_at": None}
    last_step = last_slot = None
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():  # a closing newline written after a (seemingly) torn end
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                status["torn"] += 1
                continue
            if not isinstance(rec, dict):
                status["torn"] += 1
                continue
            step, slot = rec.get("step"), rec.get("slot")
            # a step written again (a resumed run redoes every step after its checkpoint,
            # the step it crashed in included): the newer records replace the older ones
            again = isinstance(step, int) and last_step is not None and (
                step < last_step or (step == last_step and isinstance(slot, int)
                                     and last_slot is not None and slot <= last_slot))
            if again:
                records = [r for r in records if r["step"] < step]
                if status["capped_at"] is not None and status["capped_at"] >= step:
                    status["capped_at"] = None
            if isinstance(step, int):
                last_step, last_slot = step, slot if isinstance(slot, int) else None
            if rec.get("kind") == "capped":
                status["capped_at"] = step
            elif rec.get("kind") == "group" and rec.get("version") == RECORD_VERSION:
                records.append(rec)
    return records, status


# ---------------------------------------------------------------- recomputation
def rebuild_group(rec: Mapping[str, Any]) -> TrajectoryGroup:
    """The record's group as token-free trajectories: what every estimator that reads
    only rewards, infos and outcomes needs (and the stored scores for the others)."""
    trajs = []
    for tr in rec["trajectories"]:
        turns = tuple(Turn((), (), (), (), t["action"], t["observation"], float(t["reward"]),
                           dict(t.get("info") or {})) for t in tr["turns"])
        info = dict(tr.get("info") or {})
        info["first_observation"] = tr.get("task", "")
        trajs.append(Trajectory(turns, float(tr["outcome"]), bool(tr["success"]),
                                StopReason(tr["stop"]), tr["task_id"], tr["group_id"],
                                int(tr.get("policy_version", 0)), info,
                                ContextMode(tr.get("context_mode", "full"))))
    return TrajectoryGroup(tuple(trajs), rec["task_id"])


class StoredScorer:
    """Replays logged gold-answer scores with the two methods estimators call on a
    :class:`~turngym.credit.scoring.GoldScorer` (``turn_start_scores``, ``answer_mask``),
    for the trajectories of one rebuilt group."""

    def __init__(self, group: TrajectoryGroup, logged: Mapping[str, Any]):
        rows = logged["turn_start"]
        if len(rows) != len(group):
            raise ValueError(f"scores of {len(rows)} trajectories for a group of {len(group)}")
        for tr, row in zip(group, rows):
            if len(row) != tr.num_turns:
                raise ValueError("logged scores do not match the trajectory's turns")
        self._by_traj = {id(tr): row for tr, row in zip(group, rows)}
        self._masks = {g: np.array(m, dtype=bool) for g, m in logged["answer_masks"].items()}

    def turn_start_scores(self, trajs: Sequence[Trajectory]) -> list[list[list[np.ndarray]]]:
        try:
            return [[[np.asarray(a, dtype=np.float64) for a in per_turn]
                     for per_turn in self._by_traj[id(tr)]] for tr in trajs]
        except KeyError:
            raise ValueError("StoredScorer only scores the trajectories it was built for") \
                from None

    def answer_mask(self, answer: str) -> np.ndarray:
        return self._masks[answer]


def oracle_roles(group: TrajectoryGroup) -> list[list[str]]:
    """The oracle judge's role for every turn (the role of the segment it lies in)."""
    trajs = list(group)
    segs = [s for i, tr in enumerate(trajs) for s in segments_of(tr, i)]
    roles, _ = OracleJudge().label(segs)
    out = [[""] * tr.num_turns for tr in trajs]
    for s, r in zip(segs, roles):
        for t in range(s.start, s.end):
            out[s.traj_index][t] = r.value
    return out


_SERVICE_NOTES = {
    "policy": "the policy model",
    "reference": "the reference model",
    "brancher": "env replay with policy re-sampling",
}


def _context_for(name: str, group: TrajectoryGroup, rec: Mapping[str, Any]):
    """(CreditContext, None) for ``name`` from logged data, or (None, why not)."""
    ctx = credit_lib.CreditContext(judge=OracleJudge())
    scores = rec.get("scores") or {}
    needs = credit_lib.requirements(name)
    services = [n for n in needs if n not in ("judge", "scorer", "reference_scorer")]
    if services:
        what = " and ".join(_SERVICE_NOTES.get(n, f"CreditContext.{n}") for n in services)
        return None, f"needs {what}: cannot be recomputed from logged samples"
    for need in needs:
        if need in ("scorer", "reference_scorer"):
            key = "policy" if need == "scorer" else "reference"
            if key not in scores:
                who = "the policy" if key == "policy" else "the frozen reference"
                return None, (f"needs gold-answer scores of {who}; samples keep them only "
                              f"when the run's estimator computed them")
            setattr(ctx, need, StoredScorer(group, scores[key]))
    return ctx, None


@functools.lru_cache(maxsize=256)
def _params_cached(name: str, key: str) -> Any:
    return make_params(name, json.loads(key))


def _params(name: str, params: Mapping[str, Any]) -> Any:
    """The estimator's params dataclass (filling one from a mapping is slow -- OmegaConf
    -- and a viewed run repeats the same few thousands of times)."""
    return _params_cached(name, json.dumps(params, sort_keys=True))


def recompute(rec: Mapping[str, Any], names: Sequence[str] | None = None,
              group: TrajectoryGroup | None = None) -> dict[str, dict]:
    """Every estimator's per-turn advantages for the record's group, from logged data.

    Returns ``{name: {"turn": rows}}`` (turn-level: token advantages averaged per turn)
    or ``{name: {"skipped": reason}}``.  The run's own estimator is recomputed with the
    run's params; the others with their defaults.  role_judge always uses the oracle
    judge (privileged env progress).  ``group``: the record's group if already rebuilt."""
    group = rebuild_group(rec) if group is None else group
    out: dict[str, dict] = {}
    for name in names or credit_lib.list_estimators():
        params = dict(rec.get("params") or {}) if name == rec.get("estimator") else {}
        if "judge" in credit_lib.requirements(name) and "judge" in params:
            params["judge"] = {"kind": "oracle"}
        ctx, why = _context_for(name, group, rec)
        if ctx is None:
            out[name] = {"skipped": why}
            continue
        try:
            (c,) = credit_lib.assign_credit(name, [group], _params(name, params), ctx)
        except (KeyError, ValueError, TypeError) as exc:  # e.g. no state_key in this env
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            out[name] = {"skipped": f"cannot run from this env's logged data: {msg}"}
            continue
        out[name] = {"turn": turn_level(c)}
    return out
