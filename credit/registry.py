"""Registry of credit estimators.

An estimator is a pure function ``(group, config) -> CreditAssignment`` over
one :class:`~turngym.types.TrajectoryGroup`.  Estimators that need model
scores, branch rollouts or a judge receive those services through
``CreditContext`` rather than importing a backend, so they stay
backend-independent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..types import CreditAssignment, TrajectoryGroup


@dataclass
class CreditContext:
    """Services an estimator may call (all optional).

    ``scorer`` / ``reference_scorer`` are :class:`~turngym.credit.scoring.GoldScorer`
    objects over the current policy and a frozen reference model; an estimator
    names the ones it needs with ``register_estimator(name, requires=...)`` and the
    trainer builds only those.
    """

    policy: Any = None  # current policy (Policy protocol): .score(...)
    reference: Any = None  # frozen reference policy
    scorer: Any = None  # GoldScorer over the current policy
    reference_scorer: Any = None  # GoldScorer over the frozen reference model
    judge: Any = None  # segment role judge (credit.roles.Judge)
    brancher: Any = None  # BranchPoints -> continuation Trajectories (exact-prefix resume)
    extras: dict = field(default_factory=dict)

    def need(self, name: str, estimator: str) -> Any:
        value = getattr(self, name, None)
        if value is None:
            raise ValueError(f"credit estimator {estimator!r} needs CreditContext.{name}; "
                             "the trainer builds it when the estimator declares it")
        return value


class Estimator(Protocol):
    def __call__(self, group: TrajectoryGroup, cfg: Mapping[str, Any],
                 ctx: CreditContext | None = None) -> CreditAssignment: ...


_REGISTRY: dict[str, Estimator] = {}
_REQUIRES: dict[str, tuple[str, ...]] = {}


def register_estimator(name: str, requires: Sequence[str] = ()
                       ) -> Callable[[Estimator], Estimator]:
    """``requires`` names CreditContext services the estimator calls ("scorer",
    "reference_scorer")."""
    def deco(fn: Estimator) -> Estimator:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"credit estimator {name!r} is already registered")
        _REGISTRY[name] = fn
        _REQUIRES[name] = tuple(requires)
        return fn
    return deco


def requirements(name: str) -> tuple[str, ...]:
    get_estimator(name)
    return _REQUIRES.get(name, ())


def get_estimator(name: str) -> Estimator:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown credit estimator {name!r}; registered: {sorted(_REGISTRY)}") from None


def list_estimators() -> list[str]:
    return sorted(_REGISTRY)


def assign_credit(name: str, groups: Sequence[TrajectoryGroup], cfg: Mapping[str, Any] | None = None,
                  ctx: CreditContext | None = None) -> list[CreditAssignment]:
    """Runs estimator ``name`` on every group and validates the shapes it returns."""
    est = get_estimator(name)
    out = []
    for g in groups:
        res = est(g, dict(cfg or {}), ctx)
        res.validate(g)
        out.append(res)
    return out
