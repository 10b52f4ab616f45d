"""TD log-ratio (TRACE): credit a tool call by how much closer it brought a FROZEN
reference model to the gold answer.

At the state before turn k (k = 0..T-1; :mod:`turngym.credit.scoring` scores all in
one packed forward of the reference model)::

    d_k = -mean_j log p_ref(gold_j | state_k) + eps        (a distance to the answer)
    V_k = log(d_0 / d_k)                                     (0 at the start)
    r_k = V_{k+1} - V_k                                      (k < T-1; the last turn: 0)

so rewards telescope: ``sum_k r_k = V_{T-1} - V_0`` and a call that leaves the
reference's belief unchanged earns exactly 0.  The last turn (the answer, or a
call whose result was never observed) gets no TD reward; the outcome covers it.

Advantage: ``A_{i,t} = A^GRPO_i + td_weight * r^_{i,t}`` where ``r^`` is the TD
reward divided by its std over the group's turns (``normalize_td``), or the
undiscounted TD return ``V_{T-1} - V_t`` with ``returns=True``.

Knobs: ``eps`` (1e-3), ``td_weight`` (1.0), ``returns`` (False), ``normalize_td``
(True), plus the GRPO knobs for the outcome part (``std_normalize``, ``eps_adv``).
The reference is frozen, so V does not drift as the policy trains.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..types import CreditAssignment, TrajectoryGroup
from .grpo import group_normalize
from .registry import CreditContext, register_estimator
from .scoring import gold_answers, response_starts
from .turn_utils import flatten, unflatten


def values_from_logprobs(mean_logprobs: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """V_k = log(d_0 / d_k) with d_k = -mean log-prob + eps."""
    d = -np.asarray(mean_logprobs, dtype=np.float64) + eps
    if (d <= 0).any():
        raise ValueError("d_k must be positive: mean log-probs are <= 0, eps > 0")
    return np.log(d[0] / d)


def td_rewards(values: np.ndarray) -> np.ndarray:
    """r_k = V_{k+1} - V_k for k < T-1, and 0 for the last turn."""
    r = np.zeros_like(values)
    if values.size > 1:
        r[:-1] = np.diff(values)
    return r


def reference_values(group: TrajectoryGroup, scorer, eps: float) -> list[np.ndarray]:
    trajs = list(group)
    raw = scorer.score(trajs, [response_starts(t) for t in trajs],
                       [gold_answers(t) for t in trajs])
    out = []
    for per_k in raw:
        best = np.array([max(float(a.mean()) for a in lps) for lps in per_k])
        out.append(values_from_logprobs(best, eps))
    return out


@register_estimator("td_log_ratio", requires=("reference_scorer",))
def td_log_ratio(group: TrajectoryGroup, cfg: Mapping[str, Any],
                 ctx: CreditContext | None = None) -> CreditAssignment:
    scorer = (ctx or CreditContext()).need("reference_scorer", "td_log_ratio")
    values = reference_values(group, scorer, float(cfg.get("eps", 1e-3)))
    rows = []
    for v in values:
        r = td_rewards(v)
        if cfg.get("returns", False):
            r = v[-1] - v  # undiscounted sum of future TD rewards (telescoped)
        rows.append(r)
    flat, offsets = flatten(rows)
    if cfg.get("normalize_td", True) and flat.size > 1 and flat.std() > 0:
        flat = flat / (flat.std() + 1e-6)
    outcome = group_normalize(np.array(group.outcome_rewards()),
                              bool(cfg.get("std_normalize", True)),
                              float(cfg.get("eps_adv", 1e-6)))
    w = float(cfg.get("td_weight", 1.0))
    lens = np.diff(offsets)
    adv = np.repeat(outcome, lens) + w * flat
    all_r = np.concatenate([td_rewards(v) for v in values])
    metrics = {"td_reward_mean": float(all_r.mean()),
               "td_zero_frac": float((np.abs(all_r) < 1e-12).mean()),
               "value_final_mean": float(np.mean([v[-1] for v in values])),
               "reward_mean": float(np.mean(group.outcome_rewards()))}
    return CreditAssignment(unflatten(adv, offsets), metrics=metrics)
