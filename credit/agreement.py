"""Agreement between two labellings of the same items (a judge against the oracle).

Rows are the reference labels (the oracle), columns the labels under test (the
judge).  Cohen's kappa corrects raw agreement for what two labellers with these
marginals would agree on by chance::

    p_o = trace(C) / n,   p_e = sum_k (row_k / n) * (col_k / n),
    kappa = (p_o - p_e) / (1 - p_e)

so a judge that always answers the majority class scores kappa 0 however high its
raw agreement, and per-class recall (the diagonal over the row sums) shows which
roles it never finds.  When both labellings put everything into one class
(``p_e = 1``) kappa is undefined; it is reported as 0 (no evidence of skill).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def confusion_matrix(reference: Sequence[str], predicted: Sequence[str],
                     labels: Sequence[str]) -> np.ndarray:
    """``C[i, j]``: items labelled ``labels[i]`` by the reference and ``labels[j]`` by the
    other labeller.  Labels outside ``labels`` raise ValueError."""
    if len(reference) != len(predicted):
        raise ValueError(f"{len(reference)} reference labels but {len(predicted)} predicted")
    index = {lab: i for i, lab in enumerate(labels)}
    c = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for r, p in zip(reference, predicted):
        try:
            c[index[r], index[p]] += 1
        except KeyError as exc:
            raise ValueError(f"unknown label {exc.args[0]!r}; labels are {list(labels)}") \
                from None
    return c


def cohen_kappa(c: np.ndarray) -> float:
    """Cohen's kappa of a square confusion matrix (0 for an empty one)."""
    c = np.asarray(c, dtype=np.float64)
    n = c.sum()
    if n == 0:
        return 0.0
    p_o = np.trace(c) / n
    p_e = float((c.sum(1) / n) @ (c.sum(0) / n))
    if p_e >= 1.0 - 1e-12:  # one class on both sides: agreement says nothing beyond chance
        return 0.0
    return float((p_o - p_e) / (1.0 - p_e))


def agreement(c: np.ndarray) -> float:
    c = np.asarray(c)
    n = c.sum()
    return float(np.trace(c) / n) if n else 0.0


def per_class(c: np.ndarray, labels: Sequence[str]) -> dict[str, dict]:
    """Per label: support (reference count), predicted count, recall and precision
    (``None`` where the denominator is 0)."""
    c = np.asarray(c)
    out = {}
    for i, lab in enumerate(labels):
        support, predicted = int(c[i].sum()), int(c[:, i].sum())
        out[lab] = {"support": support, "predicted": predicted,
                    "recall": float(c[i, i] / support) if support else None,
                    "precision": float(c[i, i] / predicted) if predicted else None}
    return out


def macro_recall(c: np.ndarray) -> float:
    """Mean recall over the reference labels that occur (balanced accuracy)."""
    c = np.asarray(c, dtype=np.float64)
    rows = c.sum(1)
    seen = rows > 0
    return float(np.mean(np.diag(c)[seen] / rows[seen])) if seen.any() else 0.0


def reweighted_agreement(c: np.ndarray, weights: Sequence[float]) -> float:
    """Agreement if the reference labels occurred with frequencies ``weights`` (e.g. the
    natural frequencies of a pool the items were sampled from by stratum):
    ``sum_k w_k * recall_k`` over the labels present in ``c``, weights renormalised."""
    c = np.asarray(c, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    rows = c.sum(1)
    seen = rows > 0
    if not seen.any() or w[seen].sum() <= 0:
        return 0.0
    recall = np.diag(c)[seen] / rows[seen]
    return float((w[seen] / w[seen].sum()) @ recall)


def bootstrap_ci(reference: Sequence[int], predicted: Sequence[int], k: int, n_boot: int = 1000,
                 seed: int = 0) -> dict[str, list[float]]:
    """95% percentile intervals of agreement and kappa, items resampled with replacement
    (``reference`` / ``predicted``: label indices in ``range(k)``)."""
    ref = np.asarray(reference, dtype=np.int64)
    pred = np.asarray(predicted, dtype=np.int64)
    n = len(ref)
    if n == 0:
        return {"agreement": [0.0, 0.0], "kappa": [0.0, 0.0]}
    rng = np.random.default_rng(seed)
    agr, kap = np.empty(n_boot), np.empty(n_boot)
    for b in range(n_boot):
        idx = rng.integers(0, n, size=n)
        c = np.bincount(ref[idx] * k + pred[idx], minlength=k * k).reshape(k, k)
        agr[b], kap[b] = agreement(c), cohen_kappa(c)
    return {"agreement": [float(np.percentile(agr, 2.5)), float(np.percentile(agr, 97.5))],
            "kappa": [float(np.percentile(kap, 2.5)), float(np.percentile(kap, 97.5))]}
