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

Knobs (:class:`InfoGainParams`): ``score`` ("prob": exp of the reduced log-prob,
IGPO's choice; "logprob"), ``reduce`` ("mean" over answer tokens, or "sum"),
``gold_tokens_only`` (True: score only the gold answer's tokens, as IGPO's released
code does; False: the whole ``answer_template``, tags included -- the tags are
near-certain and dilute the mean, so a turn that makes the gold answer 9x likelier can
end up with negative credit), ``logprob_floor`` (-30: -inf scores are clamped, so the
advantages stay finite), ``gamma`` (1.0), ``ig_weight`` (1.0), ``clip_negative``
(False), ``normalize`` ("joint" | "separate"), ``std_normalize`` (True), ``eps``
(1e-6).  Multiple gold answers: the best one.  Trajectories with no turns get none.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..types import CreditAssignment, TrajectoryGroup
from .registry import CreditContext, register_estimator
from .scoring import DEFAULT_ANSWER_TEMPLATE, turn_scores
from .turn_utils import discounted_returns, flatten, normalize, unflatten


class ScoreKind(str, enum.Enum):
    prob = "prob"
    logprob = "logprob"


class Reduce(str, enum.Enum):
    mean = "mean"
    sum = "sum"


class NormalizeMode(str, enum.Enum):
    joint = "joint"
    separate = "separate"


@dataclass(frozen=True)
class InfoGainParams:
    score: ScoreKind = ScoreKind.prob
    reduce: Reduce = Reduce.mean
    gold_tokens_only: bool = True
    logprob_floor: float = -30.0
    answer_template: str = DEFAULT_ANSWER_TEMPLATE
    gamma: float = 1.0
    ig_weight: float = 1.0
    clip_negative: bool = False
    normalize: NormalizeMode = NormalizeMode.joint
    std_normalize: bool = True
    eps: float = 1e-6


def boundary_values(group: TrajectoryGroup, scorer, p: InfoGainParams) -> list[np.ndarray]:
    """Per trajectory, the gold-answer score at the start of every turn."""
    out = []
    for v in turn_scores(scorer, list(group), p.reduce.value, p.gold_tokens_only,
                         p.logprob_floor):
        out.append(np.exp(v) if p.score is ScoreKind.prob else v)
    return out


@register_estimator("info_gain", params=InfoGainParams, requires=("scorer",))
def info_gain(group: TrajectoryGroup, p: InfoGainParams, ctx: CreditContext | None = None
              ) -> CreditAssignment:
    scorer = (ctx or CreditContext()).need("scorer", "info_gain")
    values = boundary_values(group, scorer, p)
    ig_rows, out_mask_rows, rows = [], [], []
    for traj, v in zip(group, values):
        T = traj.num_turns
        ig = np.zeros(T)
        if T > 1:
            ig[:-1] = np.diff(v)
        if p.clip_negative:
            ig = np.maximum(ig, 0.0)
        r = p.ig_weight * ig
        is_out = np.zeros(T, dtype=bool)
        if T:
            r[-1] = traj.outcome_reward
            is_out[-1] = True
        rows.append(r)
        ig_rows.append(ig[:-1])
        out_mask_rows.append(is_out)
    flat, offsets = flatten(rows)
    is_out = np.concatenate(out_mask_rows) if out_mask_rows else np.zeros(0, dtype=bool)
    if p.normalize is NormalizeMode.joint:
        norm = normalize(flat, p.std_normalize, p.eps)
    else:
        norm = np.zeros_like(flat)
        norm[is_out] = normalize(flat[is_out], p.std_normalize, p.eps)
        norm[~is_out] = normalize(flat[~is_out], p.std_normalize, p.eps)
    adv = discounted_returns(norm, offsets, p.gamma)
    igs = np.concatenate(ig_rows) if any(len(x) for x in ig_rows) else np.zeros(0)
    firsts = [v[0] for v in values if len(v)]
    metrics = {"ig_mean": float(igs.mean()) if igs.size else 0.0,
               "ig_positive_frac": float((igs > 0).mean()) if igs.size else 0.0,
               "gold_score_first": float(np.mean(firsts)) if firsts else 0.0,
               "reward_mean": float(np.mean(group.outcome_rewards()))}
    return CreditAssignment(unflatten(adv, offsets), metrics=metrics)
