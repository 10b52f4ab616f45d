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

Knobs (:class:`TDLogRatioParams`): ``eps`` (1e-3), ``td_weight`` (1.0), ``returns``
(False), ``normalize_td`` (True), ``gold_tokens_only`` (True, as for info_gain: the
template's tags would dilute the distance), ``logprob_floor`` (-30: a -inf score of a
certain-wrong answer is clamped, so V stays finite), plus the GRPO knobs for the
outcome part (``std_normalize``, ``eps_adv``).  The reference is frozen, so V does not
drift as the policy trains.  Trajectories with no turns get none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..types import CreditAssignment, TrajectoryGroup
from .grpo import group_normalize
from .registry import CreditContext, register_estimator
from .scoring import DEFAULT_ANSWER_TEMPLATE, turn_scores
from .turn_utils import flatten, unflatten


@dataclass(frozen=True)
class TDLogRatioParams:
    eps: float = 1e-3
    td_weight: float = 1.0
    returns: bool = False
    normalize_td: bool = True
    gold_tokens_only: bool = True
    logprob_floor: float = -30.0
    answer_template: str = DEFAULT_ANSWER_TEMPLATE
    std_normalize: bool = True
    eps_adv: float = 1e-6


def values_from_logprobs(mean_logprobs: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """V_k = log(d_0 / d_k) with d_k = -mean log-prob + eps."""
    d = -np.asarray(mean_logprobs, dtype=np.float64) + eps
    if d.size == 0:
        return d
    if (d <= 0).any() or not np.isfinite(d).all():
        raise ValueError("d_k must be positive and finite: mean log-probs are finite and <= 0, "
                         "eps > 0")
    return np.log(d[0] / d)


def td_rewards(values: np.ndarray) -> np.ndarray:
    """r_k = V_{k+1} - V_k for k < T-1, and 0 for the last turn."""
    r = np.zeros_like(values)
    if values.size > 1:
        r[:-1] = np.diff(values)
    return r


def reference_values(group: TrajectoryGroup, scorer, p: TDLogRatioParams) -> list[np.ndarray]:
    return [values_from_logprobs(v, p.eps) for v in
            turn_scores(scorer, list(group), "mean", p.gold_tokens_only, p.logprob_floor)]


@register_estimator("td_log_ratio", params=TDLogRatioParams, requires=("reference_scorer",))
def td_log_ratio(group: TrajectoryGroup, p: TDLogRatioParams,
                 ctx: CreditContext | None = None) -> CreditAssignment:
    scorer = (ctx or CreditContext()).need("reference_scorer", "td_log_ratio")
    values = reference_values(group, scorer, p)
    rows = []
    for v in values:
        r = td_rewards(v)
        if p.returns:
            r = v[-1] - v if v.size else v  # undiscounted sum of future TD rewards
        rows.append(r)
    flat, offsets = flatten(rows)
    if p.normalize_td and flat.size > 1 and flat.std() > 0:
        flat = flat / (flat.std() + 1e-6)
    outcome = group_normalize(np.array(group.outcome_rewards()), p.std_normalize, p.eps_adv)
    lens = np.diff(offsets)
    adv = np.repeat(outcome, lens) + p.td_weight * flat
    all_r = np.concatenate([td_rewards(v) for v in values]) if values else np.zeros(0)
    finals = [v[-1] for v in values if v.size]
    metrics = {"td_reward_mean": float(all_r.mean()) if all_r.size else 0.0,
               "td_zero_frac": float((np.abs(all_r) < 1e-12).mean()) if all_r.size else 0.0,
               "value_final_mean": float(np.mean(finals)) if finals else 0.0,
               "reward_mean": float(np.mean(group.outcome_rewards()))}
    return CreditAssignment(unflatten(adv, offsets), metrics=metrics)
