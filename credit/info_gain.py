"""Information gain (IGPO): a turn is worth how much it raised the policy's belief
in the gold answer.

For trajectory i with turns t = 0..T-1, let ``s_t`` be the current policy's score
of the gold answer in the context the agent acted in at turn t (before its
response; :mod:`turngym.credit.scoring` computes all of them in one packed
forward).  Then::

    IG_t  = s_{t+1} - s_t                       (t < T-1)
    r_t   = ig_weight * IG_t   (optionally max(IG_t, 0) with clip_negative)
    r_T-1 = outcome reward                       (the final turn is judged by the outcome)

Rewards are normalised over all turns of the group (never per turn index),
jointly or separately for IG and outcome rewards, then turned into discounted
returns ``A_t = sum_{k>=t} gamma^(k-t) r^_k``.

Knobs: ``score`` ("prob": exp of the reduced log-prob, IGPO's choice; "logprob"),
``reduce`` ("mean" over answer tokens, or "sum"), ``gamma`` (1.0), ``ig_weight``
(1.0), ``clip_negative`` (False), ``normalize`` ("joint" | "separate"),
``std_normalize`` (True), ``eps`` (1e-6).  Multiple gold answers: the best one.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..types import CreditAssignment, TrajectoryGroup
from .registry import CreditContext, register_estimator
from .scoring import gold_answers, reduce_scores, response_starts
from .turn_utils import discounted_returns, flatten, normalize, unflatten


def boundary_values(group: TrajectoryGroup, scorer, reduce: str = "mean",
                    score: str = "logprob") -> list[np.ndarray]:
    """Per trajectory, the gold-answer score at the start of every turn."""
    if score not in ("prob", "logprob"):
        raise ValueError(f"score must be 'prob' or 'logprob', got {score!r}")
    trajs = list(group)
    raw = scorer.score(trajs, [response_starts(t) for t in trajs],
                       [gold_answers(t) for t in trajs])
    out = []
    for per_k in raw:
        v = np.array([reduce_scores(lps, reduce) for lps in per_k], dtype=np.float64)
        out.append(np.exp(v) if score == "prob" else v)
    return out


@register_estimator("info_gain", requires=("scorer",))
def info_gain(group: TrajectoryGroup, cfg: Mapping[str, Any], ctx: CreditContext | None = None
              ) -> CreditAssignment:
    scorer = (ctx or CreditContext()).need("scorer", "info_gain")
    values = boundary_values(group, scorer, cfg.get("reduce", "mean"), cfg.get("score", "prob"))
    w = float(cfg.get("ig_weight", 1.0))
    clip = bool(cfg.get("clip_negative", False))
    ig_rows, out_mask_rows, rows = [], [], []
    for traj, v in zip(group, values):
        T = traj.num_turns
        ig = np.zeros(T)
        if T > 1:
            ig[:-1] = np.diff(v)
        if clip:
            ig = np.maximum(ig, 0.0)
        r = w * ig
        r[-1] = traj.outcome_reward
        is_out = np.zeros(T, dtype=bool)
        is_out[-1] = True
        rows.append(r)
        ig_rows.append(ig[:-1])
        out_mask_rows.append(is_out)
    flat, offsets = flatten(rows)
    is_out = np.concatenate(out_mask_rows)
    std, eps = bool(cfg.get("std_normalize", True)), float(cfg.get("eps", 1e-6))
    mode = cfg.get("normalize", "joint")
    if mode == "joint":
        norm = normalize(flat, std, eps)
    elif mode == "separate":
        norm = np.zeros_like(flat)
        norm[is_out] = normalize(flat[is_out], std, eps)
        norm[~is_out] = normalize(flat[~is_out], std, eps)
    else:
        raise ValueError(f"normalize must be 'joint' or 'separate', got {mode!r}")
    adv = discounted_returns(norm, offsets, float(cfg.get("gamma", 1.0)))
    igs = np.concatenate(ig_rows) if any(len(x) for x in ig_rows) else np.zeros(0)
    metrics = {"ig_mean": float(igs.mean()) if igs.size else 0.0,
               "ig_positive_frac": float((igs > 0).mean()) if igs.size else 0.0,
               "gold_score_first": float(np.mean([v[0] for v in values])),
               "reward_mean": float(np.mean(group.outcome_rewards()))}
    return CreditAssignment(unflatten(adv, offsets), metrics=metrics)
