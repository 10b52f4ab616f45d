"""Role-typed judge credit (TRIAGE): outcome GRPO gives the direction, a judge's
role for each segment corrects it by a fixed, bounded amount.

Segments are cut at environment-facing actions (:mod:`turngym.credit.roles`);
each segment's role maps to a constant ``c`` (``role_values``, defaults below)
and every turn of segment s of trajectory i gets::

    A_{i,t} = A^GRPO_i + role_weight * c(role_s)

With ``keep_outcome_sign`` (default) a correction never flips the outcome's
sign: where it would, the turn keeps ``min_keep * A^GRPO_i``.  In a group with
no outcome signal (all rewards equal) turns get 0 (``zero_outcome: zero``, the
default: the outcome stays the direction) or ``role_weight * c`` alone
(``zero_outcome: roles``).  Measured on the text world with the tiny model,
``roles`` is reward-hackable: most groups have no success, the policy learns to
"explore" (valid state-changing actions) and success fell to 0 in 80 steps.  |correction| is at most
``role_weight * max|c|``: bounded by construction.

The judge comes from the context: ``OracleJudge`` (privileged env progress, no
model) or ``OpenAIJudge`` (any OpenAI-compatible server, e.g. ``turngym serve``),
chosen by ``judge: {kind: oracle | openai, ...}`` in the credit params (typed:
:class:`~turngym.credit.judges.JudgeSpec`; measure an LLM judge against the oracle
first with ``turngym judge-eval``, docs/judge.md).
Metrics: the share of each role, env-facing turns per episode, judge errors; with
``judge.spot_check`` also the oracle's role shares on a sampled subset and the
judge's running agreement / kappa with it (:mod:`turngym.credit.judges`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from ..types import CreditAssignment, TrajectoryGroup
from .grpo import group_normalize
from .judges import JudgeSpec, SpotChecks, judge_spec
from .registry import CreditContext, register_estimator
from .roles import ROLE_NAMES, Role, segments_of
from .turn_utils import unflatten

DEFAULT_ROLE_VALUES = {
    Role.DECISIVE_PROGRESS.value: 1.0,
    Role.USEFUL_EXPLORATION.value: 0.25,
    Role.NO_PROGRESS_INFRASTRUCTURE.value: -0.25,
    Role.REGRESSION.value: -1.0,
}


class ZeroOutcome(str, enum.Enum):
    zero = "zero"  # groups without outcome signal train nothing (the outcome is the direction)
    roles = "roles"  # role corrections alone there (measured to be reward-hackable)


@dataclass(frozen=True)
class RoleJudgeParams:
    judge: JudgeSpec = field(default_factory=JudgeSpec)  # {kind: oracle} or {kind: openai, ...}
    role_weight: float = 0.5
    role_values: dict = field(default_factory=dict)  # overrides of DEFAULT_ROLE_VALUES
    min_keep: float = 0.1
    keep_outcome_sign: bool = True
    zero_outcome: ZeroOutcome = ZeroOutcome.zero
    std_normalize: bool = True
    eps: float = 1e-6

    def check(self) -> None:
        role_values(self)
        try:
            judge_spec(self.judge)
        except ValueError as exc:
            raise ValueError(f"role_judge: {exc}") from None


def role_values(p: RoleJudgeParams) -> dict[str, float]:
    vals = dict(DEFAULT_ROLE_VALUES)
    given = dict(p.role_values or {})
    bad = set(given) - set(ROLE_NAMES)
    if bad:
        raise ValueError(f"unknown roles {sorted(bad)} in role_values; roles are {ROLE_NAMES}")
    vals.update({k: float(v) for k, v in given.items()})
    if any(abs(v) > 1.0 for v in vals.values()):
        raise ValueError("role values must lie in [-1, 1] (role_weight scales them)")
    return vals


@register_estimator("role_judge", params=RoleJudgeParams, requires=("judge",))
def role_judge(group: TrajectoryGroup, p: RoleJudgeParams,
               ctx: CreditContext | None = None) -> CreditAssignment:
    judge = (ctx or CreditContext()).need("judge", "role_judge")
    values = role_values(p)
    beta, min_keep = p.role_weight, p.min_keep
    trajs = list(group)
    segs = [s for i, tr in enumerate(trajs) for s in segments_of(tr, i)]
    roles, errors = judge.label(segs)
    lens = np.array([t.num_turns for t in trajs])
    offsets = np.concatenate([[0], np.cumsum(lens)])
    corr = np.zeros(offsets[-1])
    for s, r in zip(segs, roles):
        a = offsets[s.traj_index]
        corr[a + s.start:a + s.end] = values[Role(r).value]
    outcome = np.repeat(group_normalize(np.array(group.outcome_rewards()), p.std_normalize,
                                        p.eps), lens)
    adv = outcome + beta * corr
    if p.keep_outcome_sign:
        flipped = (outcome != 0) & (np.sign(adv) != np.sign(outcome))
        adv = np.where(flipped, min_keep * outcome, adv)
    if ZeroOutcome(p.zero_outcome) is ZeroOutcome.zero:
        adv = np.where(outcome == 0, 0.0, adv)
    counts = {name: 0 for name in ROLE_NAMES}
    for r in roles:
        counts[Role(r).value] += 1
    n = max(1, len(roles))
    env_facing = sum(bool(x.info.get("valid_format", True)) for t in trajs for x in t.turns)
    metrics = {f"role/{k}": v / n for k, v in counts.items()}
    metrics.update({"env_facing_turns_per_episode": env_facing / len(trajs),
                    "judge_errors": float(errors), "segments": float(len(segs)),
                    "reward_mean": float(np.mean(group.outcome_rewards()))})
    if isinstance(judge, SpotChecks):
        metrics.update(judge.spot_check(segs, roles).metrics())
    return CreditAssignment(unflatten(adv, offsets), metrics=metrics)
