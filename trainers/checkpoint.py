"""Atomic, verifiable checkpoints.

A checkpoint is a complete HF model dir (safetensors weights, config, tokenizer) plus
optimizer state, RNG state, trainer state (``turngym_state.json``) and a
``manifest.json`` with the SHA-256 of every other file.

* Written into a staging sibling, fsynced, renamed into place; ``latest`` is replaced
  atomically last.  A crash at any moment leaves the old or the new checkpoint, never
  a half-written one; staging leftovers of a killed save are removed at the next start.
* :meth:`CheckpointManager.newest_valid` walks the checkpoints newest first and returns
  the first whose manifest verifies, so a deleted ``latest``, a missing directory or a
  corrupted weight file falls back to the previous good checkpoint instead of
  restarting from step 0.
* Loads are safe: optimizer and RNG state are read with ``torch.load(weights_only=True)``
  (tensors and plain containers only), so a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

MANIFEST = "manifest.json"
STATE = "turngym_state.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted (missing file, checksum mismatch)."""


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Makes a rename inside ``path`` durable (the directory entry, not only the data);
    a filesystem that cannot sync directories (some FUSE / network mounts) is let be."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _publish_file(path: Path, fill) -> None:
    """``fill(tmp)`` writes a sibling temporary file, which then replaces ``path`` all at
    once (readers see the old or the new file, never a part)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fill(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_atomic_text(path: Path, text: str) -> None:
    _publish_file(path, lambda tmp: Path(tmp).write_text(text))


def copy_atomic(src: Path, dst: Path) -> None:
    _publish_file(dst, lambda tmp: shutil.copyfile(src, tmp))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {str(p.relative_to(directory)): {"sha256": _sha256(p), "bytes": p.stat().st_size}
                for p in files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))


def verify_manifest(directory: Path) -> None:
    """Raises :class:`CheckpointError` naming the first missing or altered file."""
    directory = Path(directory)
    f = directory / MANIFEST
    if not f.exists():
        raise CheckpointError(f"{directory} has no {MANIFEST} (not a complete checkpoint)")
    for rel, meta in json.loads(f.read_text()).items():
        p = directory / rel
        if not p.is_file():
            raise CheckpointError(f"{directory}: {rel} is missing")
        if p.stat().st_size != meta["bytes"] or _sha256(p) != meta["sha256"]:
            raise CheckpointError(f"{directory}: {rel} does not match its checksum")


def save_model_dir(path: Path, model, tokenizer, extra: dict[str, Any] | None = None,
                   state_dict: dict | None = None) -> Path:
    """Atomically writes ``model``+``tokenizer`` (+ json ``extra``, + a manifest) to
    ``path``; ``state_dict`` overrides the weights (the gathered tensors of a sharded
    model)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    _write_model(tmp, model, tokenizer, extra, state_dict)
    write_manifest(tmp)
    _fsync_tree(tmp)
    _replace_dir(tmp, path)
    return path


def _write_model(directory: Path, model, tokenizer, extra, state_dict) -> None:
    kw = {"state_dict": state_dict} if state_dict is not None else {}
    model.save_pretrained(directory, safe_serialization=True, **kw)
    tokenizer.save_pretrained(directory)
    if extra:
        (directory / STATE).write_text(json.dumps(extra, indent=1, default=str))


def _replace_dir(src: Path, dst: Path) -> None:
    """``src`` (complete, fsynced) becomes ``dst``.  A directory cannot be renamed over a
    non-empty one, so an existing ``dst`` is first moved aside to ``.<name>.old<pid>``;
    a crash between the two renames leaves no ``dst`` but that old copy, which
    :func:`restore_moved_aside` puts back."""
    old = dst.with_name(f".{dst.name}.old{os.getpid()}")
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    _fsync_dir(dst.parent)
    if old.exists():
        shutil.rmtree(old)


def restore_moved_aside(parent: Path) -> list[Path]:
    """Puts back directories :func:`_replace_dir` moved aside and did not replace (a crash
    between its renames): where ``<name>`` is missing, the newest ``.<name>.old<pid>`` whose
    manifest verifies becomes ``<name>`` again.  Other ``.old`` leftovers (a crash while
    one was being deleted) are removed.  Returns the restored paths."""
    parent = Path(parent)
    aside: dict[str, list[Path]] = {}
    for p in parent.glob(".*.old*") if parent.exists() else ():
        if p.is_dir():
            aside.setdefault(p.name[1:p.name.rindex(".old")], []).append(p)
    restored = []
    for name, copies in aside.items():
        dst = parent / name
        for p in sorted(copies, key=lambda q: q.stat().st_mtime, reverse=True):
            if name and not dst.exists():
                try:
                    verify_manifest(p)
                except CheckpointError:
                    pass
                else:
                    os.replace(p, dst)
                    restored.append(dst)
                    continue
            shutil.rmtree(p, ignore_errors=True)
    return restored


def clean_staging(root: Path) -> list[Path]:
    """Removes leftovers of saves that were killed half-way in ``root`` (``.step_*.staging*``,
    ``.final.tmp*`` and other ``.tmp*``/``.old*`` entries; run :func:`restore_moved_aside`
    first); returns what was removed."""
    removed = []
    if root.exists():
        for p in root.iterdir():
            if p.name.startswith(".") and any(t in p.name for t in (".staging", ".tmp", ".old")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
                removed.append(p)
    return removed


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int = 2):
        self.root = Path(root)
        self.keep = max(1, keep)

    def clean_staging(self) -> list[Path]:
        return clean_staging(self.root)

    def save(self, step: int, model, tokenizer, optimizer=None, state: dict | None = None,
             model_state: dict | None = None, optimizer_state: dict | None = None,
             shuffle: random.Random | None = None) -> Path:
        """``model_state`` / ``optimizer_state`` replace ``model.state_dict()`` /
        ``optimizer.state_dict()`` (full states gathered from a sharded model);
        ``shuffle``: the trainer's mini-batch shuffle RNG, saved with the others."""
        name = f"step_{step:06d}"
        state = dict(state or {}, step=step)
        final = self.root / name
        staging = self.root / f".{name}.staging{os.getpid()}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        _write_model(staging, model, tokenizer, state, model_state)
        if optimizer_state is None and optimizer is not None:
            optimizer_state = optimizer.state_dict()
        if optimizer_state is not None:
            torch.save(optimizer_state, staging / "optimizer.pt")
        torch.save(rng_state(shuffle), staging / "rng.pt")
        write_manifest(staging)
        _fsync_tree(staging)
        _replace_dir(staging, final)
        write_atomic_text(self.root / "latest", name)
        self._prune(keep_also=final)
        return final

    # ------------------------------------------------------------------ finding
    def candidates(self) -> list[Path]:
        """Checkpoint dirs, newest step first."""
        if not self.root.exists():
            return []
        return sorted((p for p in self.root.glob("step_*") if p.is_dir()), reverse=True)

    def newest_valid(self) -> tuple[Path | None, list[str]]:
        """The newest checkpoint whose manifest verifies, and why newer ones were skipped."""
        skipped = []
        for p in self.candidates():
            try:
                verify_manifest(p)
                json.loads((p / STATE).read_text())
                return p, skipped
            except (CheckpointError, OSError, json.JSONDecodeError) as exc:
                skipped.append(str(exc))
        return None, skipped

    def latest(self) -> Path | None:
        return self.newest_valid()[0]

    @staticmethod
    def state(path: Path) -> dict:
        return json.loads((Path(path) / STATE).read_text())

    # ------------------------------------------------------------------ loading
    @staticmethod
    def load_optimizer(path: Path, optimizer, required: bool = True) -> None:
        f = Path(path) / "optimizer.pt"
        if not f.exists():
            if required:
                raise CheckpointError(f"{path} has no optimizer.pt; resuming without the "
                                      "optimizer state would silently reset Adam's moments")
            return
        optimizer.load_state_dict(torch.load(f, weights_only=True))

    @staticmethod
    def load_rng(path: Path) -> dict:
        """Restores the global RNGs; returns the saved states (see :func:`set_shuffle_state`)."""
        f = Path(path) / "rng.pt"
        if not f.exists():
            raise CheckpointError(f"{path} has no rng.pt")
        saved = torch.load(f, weights_only=True)
        set_rng_state(saved)
        return saved

    def _prune(self, keep_also: Path) -> None:
        for p in self.candidates()[self.keep:]:
            if p != keep_also:
                shutil.rmtree(p, ignore_errors=True)


def _py_rng(state: tuple, prefix: str) -> dict:
    version, internal, gauss = state
    return {f"{prefix}_version": version,
            f"{prefix}_state": torch.tensor(internal, dtype=torch.int64),
            f"{prefix}_gauss": gauss}


def _py_rng_from(s: dict, prefix: str) -> tuple:
    return (s[f"{prefix}_version"], tuple(int(x) for x in s[f"{prefix}_state"].tolist()),
            s[f"{prefix}_gauss"])


def rng_state(shuffle: random.Random | None = None) -> dict:
    """Python, numpy and torch RNG state as tensors and ints only (safe to load with
    ``weights_only=True``); ``shuffle``: the trainer's own mini-batch shuffle RNG."""
    np_state = np.random.get_state()
    return {**_py_rng(random.getstate(), "python"),
            **(_py_rng(shuffle.getstate(), "shuffle") if shuffle is not None else {}),
            "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "numpy_pos": int(np_state[2]), "numpy_has_gauss": int(np_state[3]),
            "numpy_gauss": float(np_state[4]),
            "torch": torch.get_rng_state()}


def set_shuffle_state(s: dict, shuffle: random.Random) -> None:
    """Restores the trainer's shuffle RNG (checkpoints written before it was saved keep
    the freshly seeded one)."""
    if "shuffle_state" in s:
        shuffle.setstate(_py_rng_from(s, "shuffle"))


def set_rng_state(s: dict) -> None:
    random.setstate(_py_rng_from(s, "python"))
    np.random.set_state(("MT19937", s["numpy_keys"].numpy().astype(np.uint32), s["numpy_pos"],
                         s["numpy_has_gauss"], s["numpy_gauss"]))
    torch.set_rng_state(s["torch"])
