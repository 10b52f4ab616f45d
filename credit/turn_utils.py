"""Small vectorised helpers shared by turn-level estimators."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def flatten(rows: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows -> (flat values, row offsets of length len(rows)+1)."""
    lens = np.array([len(r) for r in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    flat = np.concatenate([np.asarray(r, dtype=np.float64) for r in rows]) if len(rows) else \
        np.zeros(0)
    return flat, offsets


def unflatten(flat: np.ndarray, offsets: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(x) for x in flat[a:b]) for a, b in zip(offsets[:-1], offsets[1:]))


def discounted_returns(rewards: np.ndarray, offsets: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = sum_{k>=t} gamma^(k-t) r_k within each row (one reverse pass per row: O(N))."""
    out = np.empty_like(rewards, dtype=np.float64)
    for a, b in zip(offsets[:-1], offsets[1:]):
        acc = 0.0
        for i in range(b - 1, a - 1, -1):
            acc = rewards[i] + gamma * acc
            out[i] = acc
    return out


def normalize(x: np.ndarray, std: bool = True, eps: float = 1e-6, ddof: int = 0) -> np.ndarray:
    """(x - mean) / std over all entries; exactly zero when there is no spread; all NaN
    when an entry is not finite (so the caller's finite check refuses it, never a silent 0)."""
    if not np.isfinite(x).all():
        return np.full(x.shape, np.nan)
    if x.size <= 1 or np.all(x == x[0]):
        return np.zeros_like(x)
    c = x - x.mean()
    if not std:
        return c
    s = x.std(ddof=ddof)
    return c / (s + eps) if s > 0 else np.zeros_like(x)


@np.errstate(invalid="ignore")  # inf - inf in a broken group: NaN, refused below
def segment_normalize(values: np.ndarray, keys: np.ndarray, std: bool = True, eps: float = 1e-6,
                      ddof: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Normalises ``values`` within groups of equal ``keys`` (bincount, no pairwise loops):
    ``(v - mean) / (std + eps)`` with the ``ddof`` std (1: sample std, as GRPO's episode
    part).  Groups with no spread (singletons included) get exactly 0; a group holding a
    non-finite value is all NaN (refused downstream, never a silent 0).

    Returns (normalised values, size of each entry's group).
    """
    _, inv = np.unique(keys, return_inverse=True)
    counts = np.bincount(inv).astype(np.float64)
    mean = np.bincount(inv, weights=values) / counts
    vmin = np.full(len(counts), np.inf)
    vmax = np.full(len(counts), -np.inf)
    np.minimum.at(vmin, inv, values)
    np.maximum.at(vmax, inv, values)
    flat = (vmin == vmax)[inv]  # no spread: exactly 0, never rounding noise
    out = values - mean[inv]
    if std:
        ss = np.bincount(inv, weights=(values - mean[inv]) ** 2)
        var = ss / np.maximum(counts - ddof, 1.0)
        sd = np.sqrt(var)[inv]
        out = np.where(sd > 0, out / (sd + eps), 0.0)
    size = counts[inv]
    broken = (np.bincount(inv, weights=~np.isfinite(values)) > 0)[inv]
    return np.where(broken, np.nan, np.where(flat | (size <= 1), 0.0, out)), size
