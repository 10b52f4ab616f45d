"""Atomic checkpoints: a checkpoint is a complete HF model dir (safetensors weights,
config, tokenizer) plus optimizer and trainer state.

Written into a temporary sibling directory, fsynced, then renamed into place;
``latest`` is replaced atomically last.  A crash at any moment leaves either the
old or the new checkpoint, never a half-written one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_model_dir(path: Path, model, tokenizer, extra: dict[str, Any] | None = None,
                   state_dict: dict | None = None) -> Path:
    """Atomically writes ``model``+``tokenizer`` (+ json ``extra``) to ``path``;
    ``state_dict`` overrides the weights (the gathered tensors of a sharded model)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    kw = {"state_dict": state_dict} if state_dict is not None else {}
    model.save_pretrained(tmp, safe_serialization=True, **kw)
    tokenizer.save_pretrained(tmp)
    if extra:
        (tmp / "turngym_state.json").write_text(json.dumps(extra, indent=1, default=str))
    _fsync_tree(tmp)
    old = path.with_name(f".{path.name}.old{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old)
    return path


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int = 2):
        self.root = Path(root)
        self.keep = max(1, keep)

    def save(self, step: int, model, tokenizer, optimizer=None, state: dict | None = None,
             model_state: dict | None = None, optimizer_state: dict | None = None) -> Path:
        """``model_state`` / ``optimizer_state`` replace ``model.state_dict()`` /
        ``optimizer.state_dict()`` (full states gathered from a sharded model)."""
        name = f"step_{step:06d}"
        state = dict(state or {}, step=step)
        final = self.root / name
        tmp_parent = self.root / f".{name}.staging{os.getpid()}"
        if tmp_parent.exists():
            shutil.rmtree(tmp_parent)
        save_model_dir(tmp_parent / "ckpt", model, tokenizer, state, model_state)
        if optimizer_state is None and optimizer is not None:
            optimizer_state = optimizer.state_dict()
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp_parent / "ckpt" / "optimizer.pt")
        torch.save(_rng_state(), tmp_parent / "ckpt" / "rng.pt")
        _fsync_tree(tmp_parent)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp_parent / "ckpt", final)
        shutil.rmtree(tmp_parent, ignore_errors=True)
        write_atomic_text(self.root / "latest", name)
        self._prune()
        return final

    def latest(self) -> Path | None:
        marker = self.root / "latest"
        if not marker.exists():
            return None
        p = self.root / marker.read_text().strip()
        return p if (p / "turngym_state.json").exists() else None

    @staticmethod
    def state(path: Path) -> dict:
        return json.loads((Path(path) / "turngym_state.json").read_text())

    @staticmethod
    def load_optimizer(path: Path, optimizer) -> None:
        f = Path(path) / "optimizer.pt"
        if f.exists():
            optimizer.load_state_dict(torch.load(f, weights_only=False))

    @staticmethod
    def load_rng(path: Path) -> None:
        f = Path(path) / "rng.pt"
        if f.exists():
            _set_rng_state(torch.load(f, weights_only=False))

    def _prune(self) -> None:
        ckpts = sorted(p for p in self.root.glob("step_*") if p.is_dir())
        for p in ckpts[: -self.keep]:
            shutil.rmtree(p, ignore_errors=True)


def _rng_state() -> dict:
    import random

    import numpy as np
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def _set_rng_state(s: dict) -> None:
    import random

    import numpy as np
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
