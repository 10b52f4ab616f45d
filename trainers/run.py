"""The run directory's lifecycle: nothing lost, nothing silently mixed.

* A fresh run into a non-empty ``output_dir`` is refused unless ``overwrite`` (which
  removes the old run first): an old ``metrics.jsonl`` or old checkpoints never mix
  with a new run's.
* ``resume`` needs something to resume (``RunError`` otherwise).  It continues from
  the newest checkpoint whose checksums verify (a deleted ``latest`` pointer, a missing
  or corrupted newest checkpoint fall back to the previous valid one), or after the
  warm start when no RL checkpoint exists; a finished run says so.
* A resumed run's config must equal the saved one except keys on
  :data:`RESUME_MAY_CHANGE` (the changes are printed and logged); anything else --
  the learning rate, the model size -- is refused, because it would silently not apply.
* Records the resumed run is about to redo are dropped from ``metrics.jsonl``.
"""

from __future__ import annotations

import fnmatch
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ..config import TrainConfig, to_dict, to_yaml
from .checkpoint import (
    CheckpointError,
    CheckpointManager,
    clean_staging,
    restore_moved_aside,
    verify_manifest,
    write_atomic_text,
)
from .metrics import truncate_after

# keys a resumed run may change (glob patterns over dotted keys)
RESUME_MAY_CHANGE = ("rl.steps", "eval.*", "checkpoint.*", "logging.*", "threads",
                     "output_dir", "plugins")


class RunError(RuntimeError):
    """The run directory cannot be used as asked; the message says what to do."""


@dataclass
class ResumePoint:
    checkpoint: Path | None = None  # newest valid RL checkpoint
    warmstart: bool = False  # a verified warm start exists (RL restarts from step 0)
    step: int = 0
    notes: list[str] = field(default_factory=list)  # what was skipped/changed, for the log


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_changes(saved: dict, new: dict) -> tuple[list[str], list[str]]:
    """(allowed, refused) ``key: old -> new`` lines between two configs."""
    a, b = _flatten(saved), _flatten(new)
    defaults = _flatten(to_dict(OmegaConf.structured(TrainConfig)))
    allowed, refused = [], []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        if key not in a and key in defaults and b.get(key) == defaults[key]:
            continue  # an option newer than the saved run, left at its default
        line = f"{key}: {a.get(key)!r} -> {b.get(key)!r}"
        if any(fnmatch.fnmatchcase(key, pat) for pat in RESUME_MAY_CHANGE):
            allowed.append(line)
        else:
            refused.append(line)
    return allowed, refused


def _non_empty(out: Path) -> bool:
    return out.exists() and any(out.iterdir())


def prepare_run_dir(cfg: DictConfig, resume: bool, overwrite: bool) -> ResumePoint:
    """Checks the run directory against the request (rank 0 only); returns where to
    start.  Writes ``config.yaml`` last, so a refused start leaves the directory as
    it was."""
    out = Path(cfg.output_dir)
    if resume and overwrite:
        raise RunError("--resume and --overwrite exclude each other")
    point = ResumePoint()
    if resume:
        point = _resume_point(cfg, out)
    elif _non_empty(out):
        if not overwrite:
            found = sorted(p.name for p in out.iterdir())[:6]
            raise RunError(f"output_dir {out} is not empty ({', '.join(found)}); continue that "
                           "run with --resume, replace it with --overwrite, or choose another "
                           "output_dir")
        if not (out / "config.yaml").exists():  # never wipe a directory that is no run
            found = sorted(p.name for p in out.iterdir())[:6]
            raise RunError(f"--overwrite replaces a turngym run, and {out} holds none (no "
                           f"config.yaml; it holds {', '.join(found)}); choose another "
                           "output_dir")
        for p in out.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    write_atomic_text(out / "config.yaml", to_yaml(cfg))
    return point


def _resume_point(cfg: DictConfig, out: Path) -> ResumePoint:
    saved_yaml = out / "config.yaml"
    if not saved_yaml.exists():
        raise RunError(f"nothing to resume: {out} holds no run (no config.yaml); "
                       "drop --resume to start one")
    saved = to_dict(OmegaConf.load(saved_yaml))
    allowed, refused = config_changes(saved, to_dict(cfg))
    if refused:
        raise RunError("resuming with a changed config would silently ignore the change:\n  "
                       + "\n  ".join(refused) + "\n  only " + ", ".join(RESUME_MAY_CHANGE)
                       + " may change on resume; start a new run (another output_dir) instead")
    # warmstart/, final/ or a checkpoint moved aside by a save killed between its renames
    restored = restore_moved_aside(out) + restore_moved_aside(out / "checkpoints")
    ckpts = CheckpointManager(out / "checkpoints", keep=cfg.checkpoint.keep)
    removed = ckpts.clean_staging() + clean_staging(out)  # e.g. a half-written final/ copy
    point = ResumePoint(notes=[f"config change on resume: {x}" for x in allowed])
    point.notes += [f"restored {p.name}/ moved aside by an interrupted save" for p in restored]
    point.notes += [f"removed an interrupted save: {p.name}" for p in removed]
    latest, skipped = ckpts.newest_valid()
    point.notes += [f"skipped checkpoint: {why}" for why in skipped]
    if latest is not None:
        point.checkpoint = latest
        point.step = int(CheckpointManager.state(latest)["step"])
    else:
        try:
            verify_manifest(out / "warmstart")
            point.warmstart = True
        except CheckpointError as exc:
            raise RunError(f"nothing to resume in {out}: no valid RL checkpoint and no complete "
                           f"warm start ({exc}); start it again with --overwrite") from None
    if point.step > cfg.rl.steps:  # its weights are past the asked end: final/ would lie
        raise RunError(f"the run in {out} has a checkpoint at step {point.step}, past "
                       f"rl.steps={cfg.rl.steps}; resume with rl.steps >= {point.step}")
    if point.step >= cfg.rl.steps and (out / "summary.json").exists():
        raise RunError(f"nothing to resume: the run in {out} finished at step {point.step}; "
                       f"raise rl.steps above {point.step} to train further")
    # redo from here: RL records after the checkpoint (all of them, and the warm-start
    # evaluation, when RL restarts after the warm start)
    dropped = truncate_after(out / "metrics.jsonl", "rl",
                             point.step if point.checkpoint is not None else -1)
    if dropped:
        point.notes.append(f"dropped {dropped} metrics records after step {point.step} "
                           "(they are redone)")
    return point
