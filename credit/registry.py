"""Registry of credit estimators.

An estimator is a pure function ``(group, config) -> CreditAssignment`` over
one :class:`~turngym.types.TrajectoryGroup`.  Estimators that need model
scores, branch rollouts or a judge receive those services through
``CreditContext`` rather than importing a backend, so they stay
backend-independent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..types import CreditAssignment, TrajectoryGroup


@runtime_checkable
class SelfChecking(Protocol):
    """Params that validate themselves beyond their types (called once, at load)."""

    def check(self) -> None: ...


@runtime_checkable
class ScoresAnswers(Protocol):
    """Params of an estimator that scores the gold answer: how it is written out."""

    answer_template: str


@runtime_checkable
class NamesAJudge(Protocol):
    """Params of an estimator that asks a judge: which one (a JudgeSpec)."""

    judge: Any


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
    sampling_temperature: float = 1.0  # what the rollouts (and branches) sample at
    extras: dict = field(default_factory=dict)

    def need(self, name: str, estimator: str) -> Any:
        value = getattr(self, name, None)
        if value is None:
            raise ValueError(f"credit estimator {estimator!r} needs CreditContext.{name}; "
                             "the trainer builds it when the estimator declares it")
        return value


@dataclass(frozen=True)
class NoParams:
    """An estimator without knobs."""


class Estimator(Protocol):
    def __call__(self, group: TrajectoryGroup, params: Any,
                 ctx: CreditContext | None = None) -> CreditAssignment: ...


_REGISTRY: dict[str, Estimator] = {}
_REQUIRES: dict[str, tuple[str, ...]] = {}
_PARAMS: dict[str, type] = {}


def register_estimator(name: str, params: type = NoParams, requires: Sequence[str] = ()
                       ) -> Callable[[Estimator], Estimator]:
    """Registers ``fn(group, params, ctx) -> CreditAssignment`` under ``name``.

    ``params`` is the estimator's dataclass of knobs (``rl.credit.params`` is checked
    against it at config load: unknown keys and wrong types are refused); ``requires``
    names the CreditContext services it calls ("scorer", "reference_scorer", "policy",
    "brancher", "judge"), which the trainer then builds."""
    if not dataclasses.is_dataclass(params):
        raise TypeError(f"params of estimator {name!r} must be a dataclass, got {params!r}")

    def deco(fn: Estimator) -> Estimator:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"credit estimator {name!r} is already registered")
        _REGISTRY[name] = fn
        _REQUIRES[name] = tuple(requires)
        _PARAMS[name] = params
        return fn
    return deco


def unregister_estimator(name: str) -> None:
    """Removes ``name`` from the registry (a plugin's teardown, a test's own estimator)."""
    for table in (_REGISTRY, _REQUIRES, _PARAMS):
        table.pop(name, None)


def requirements(name: str) -> tuple[str, ...]:
    get_estimator(name)
    return _REQUIRES.get(name, ())


def params_class(name: str) -> type:
    get_estimator(name)
    return _PARAMS[name]


def make_params(name: str, given: Mapping[str, Any] | Any | None = None) -> Any:
    """The estimator's params dataclass filled from ``given`` (a mapping, or already an
    instance).  Unknown keys, wrong types and invalid enum values raise ValueError."""
    cls = params_class(name)
    if isinstance(given, cls):
        return given
    given = dict(given or {})
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{name} takes no {unknown}; its params are {known}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.create(given))
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        first = str(exc).splitlines()[0]
        raise ValueError(f"{name}: {first}") from None
    if isinstance(obj, SelfChecking):
        obj.check()
    return obj


def get_estimator(name: str) -> Estimator:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown credit estimator {name!r}; registered: {sorted(_REGISTRY)}") from None


def list_estimators() -> list[str]:
    return sorted(_REGISTRY)


def assign_credit(name: str, groups: Sequence[TrajectoryGroup], params: Any = None,
                  ctx: CreditContext | None = None) -> list[CreditAssignment]:
    """Runs estimator ``name`` on every group; validates the shapes it returns and that
    every advantage is finite (a NaN would otherwise reach the loss silently)."""
    est = get_estimator(name)
    p = make_params(name, params)
    out = []
    for g in groups:
        res = est(g, p, ctx)
        res.validate(g)
        res.check_finite(name)
        out.append(res)
    return out
