"""Judge settings (``rl.credit.params.judge``), building a judge from them, and spot checks.

``judge: {kind: oracle}`` (the default) labels segments from privileged env progress;
``judge: {kind: openai, base_url: ..., ...}`` asks any OpenAI-compatible server
(:class:`~turngym.credit.llm_judge.OpenAIJudge`).  Every key is typed and checked when
the config loads: unknown keys, bad ranges, an unreadable prompt file or a template
with unknown fields stop the run before it starts.

``spot_check`` (a fraction of each group's segments, at least ``spot_check_min``)
also labels a seeded random subset with the oracle judge, where the env gives the
oracle's inputs, so the roles an LLM judge hands out during training are shown next
to what the oracle would have said.  :class:`SpotCheckedJudge` keeps the running
confusion matrix of the run; ``role_judge`` logs, per group (the step record averages
them):

* ``spot_checked``: segments checked;
* ``spot_agreement``: the judge's agreement with the oracle on them;
* ``oracle_role/<role>``: the oracle's role shares on them (next to ``role/<role>``,
  the judge's shares on all segments);
* ``judge_agreement`` / ``judge_kappa``: agreement and Cohen's kappa over every spot
  check of this run so far (this process; a resumed run starts counting again).
"""

from __future__ import annotations

import enum
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .agreement import agreement, cohen_kappa
from .llm_judge import SYSTEM_PROMPT, USER_TEMPLATE, OpenAIJudge, check_template
from .roles import ROLE_NAMES, Judge, OracleJudge, Role, Segment, has_oracle_info, oracle_role


class JudgeKind(str, enum.Enum):
    oracle = "oracle"  # privileged env progress, no model
    openai = "openai"  # any OpenAI-compatible chat-completions server


@dataclass(frozen=True)
class JudgeSpec:
    kind: JudgeKind = JudgeKind.oracle
    # openai judge
    base_url: Optional[str] = None  # e.g. http://127.0.0.1:8001/v1 (turngym serve)
    model: str = "default"
    api_key: Optional[str] = None
    api_key_env: Optional[str] = None  # read the key from this environment variable
    timeout: float = 30.0
    retries: int = 2
    backoff: float = 0.5
    max_workers: int = 4
    max_tokens: int = 64
    temperature: float = 0.0
    retry_temperature: float = 0.7  # a retry after an unparseable reply samples
    fallback_role: str = Role.NO_PROGRESS_INFRASTRUCTURE.value
    system_prompt: Optional[str] = None  # default: llm_judge.SYSTEM_PROMPT
    system_prompt_file: Optional[str] = None
    user_template: Optional[str] = None  # default: llm_judge.USER_TEMPLATE
    user_template_file: Optional[str] = None
    max_chars: int = 1500  # each text field of the user message is cut to this
    # diagnostics: oracle spot checks of an LLM judge during training
    spot_check: float = 0.0  # fraction of each group's segments, in [0, 1]
    spot_check_min: int = 1  # at least this many per group (when spot_check > 0)
    spot_check_seed: int = 0

    def check(self) -> None:
        kind = JudgeKind(self.kind)
        if kind is JudgeKind.openai and not self.base_url:
            raise ValueError("an openai judge needs judge.base_url "
                             "(e.g. http://127.0.0.1:8001/v1)")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"judge.timeout must be > 0 seconds, got {self.timeout}")
        for key in ("backoff", "temperature", "retry_temperature"):
            v = float(getattr(self, key))
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"judge.{key} must be a finite number >= 0, got {v}")
        for key, lo in (("retries", 0), ("max_workers", 1), ("max_tokens", 1), ("max_chars", 1),
                        ("spot_check_min", 1)):
            if int(getattr(self, key)) < lo:
                raise ValueError(f"judge.{key} must be >= {lo}, got {getattr(self, key)}")
        if self.fallback_role not in ROLE_NAMES:
            raise ValueError(f"judge.fallback_role must be one of {list(ROLE_NAMES)}, "
                             f"got {self.fallback_role!r}")
        if not (math.isfinite(self.spot_check) and 0.0 <= self.spot_check <= 1.0):
            raise ValueError(f"judge.spot_check is a fraction of each group's segments in "
                             f"[0, 1], got {self.spot_check}")
        if self.spot_check > 0 and kind is JudgeKind.oracle:
            raise ValueError("judge.spot_check compares an LLM judge with the oracle; with "
                             "judge.kind=oracle there is nothing to check")
        for text, path, what in ((self.system_prompt, self.system_prompt_file, "system_prompt"),
                                 (self.user_template, self.user_template_file,
                                  "user_template")):
            if text is not None and path is not None:
                raise ValueError(f"give judge.{what} or judge.{what}_file, not both")
        self.prompt()  # files readable, template fields known

    def prompt(self) -> tuple[str, str]:
        """(system prompt, user template) as configured (files read now)."""
        system = _read(self.system_prompt_file, "system_prompt_file") \
            if self.system_prompt_file else self.system_prompt
        template = _read(self.user_template_file, "user_template_file") \
            if self.user_template_file else self.user_template
        system = SYSTEM_PROMPT if system is None else system
        template = USER_TEMPLATE if template is None else template
        if not system.strip():
            raise ValueError("judge.system_prompt is empty")
        check_template(template)
        return system, template


def _read(path: str, key: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"judge.{key}: cannot read {path!r}: {exc}") from None


def judge_spec(given: JudgeSpec | Mapping[str, Any] | None) -> JudgeSpec:
    """A checked :class:`JudgeSpec` from a mapping (``{"kind": "oracle"}``, ...)."""
    if isinstance(given, JudgeSpec):
        spec = given
    else:
        try:
            merged = OmegaConf.merge(OmegaConf.structured(JudgeSpec),
                                     OmegaConf.create(dict(given or {})))
            spec = OmegaConf.to_object(merged)
        except OmegaConfBaseException as exc:
            raise ValueError(f"judge: {str(exc).splitlines()[0]}") from None
    spec.check()
    return spec


def openai_judge(spec: JudgeSpec) -> OpenAIJudge:
    key = spec.api_key
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise ValueError(f"judge.api_key_env: environment variable {spec.api_key_env!r} "
                             "is not set")
    system, template = spec.prompt()
    return OpenAIJudge(spec.base_url, model=spec.model, api_key=key, timeout=spec.timeout,
                       retries=spec.retries, backoff=spec.backoff,
                       max_workers=spec.max_workers, max_tokens=spec.max_tokens,
                       temperature=spec.temperature, fallback_role=spec.fallback_role,
                       retry_temperature=spec.retry_temperature,
                       system_prompt=system, user_template=template, max_chars=spec.max_chars)


def make_judge(given: JudgeSpec | Mapping[str, Any] | None) -> Judge:
    """The judge ``given`` describes, wrapped in a :class:`SpotCheckedJudge` when it asks
    for spot checks."""
    spec = judge_spec(given)
    if JudgeKind(spec.kind) is JudgeKind.oracle:
        return OracleJudge()
    judge = openai_judge(spec)
    if spec.spot_check > 0:
        return SpotCheckedJudge(judge, spec.spot_check, spec.spot_check_min,
                                spec.spot_check_seed)
    return judge


@dataclass(frozen=True)
class SpotCheck:
    """One group's spot check: ``indices`` into its segments, the judge's and the
    oracle's roles there, and the running totals after it."""

    indices: tuple[int, ...]
    judge: tuple[Role, ...]
    oracle: tuple[Role, ...]
    running_agreement: float | None
    running_kappa: float | None

    def metrics(self) -> dict[str, float]:
        out = {"spot_checked": float(len(self.indices))}
        if self.indices:
            n = len(self.indices)
            out["spot_agreement"] = sum(a is b for a, b in zip(self.judge, self.oracle)) / n
            for name in ROLE_NAMES:
                out[f"oracle_role/{name}"] = sum(r.value == name for r in self.oracle) / n
        if self.running_agreement is not None:
            out["judge_agreement"] = self.running_agreement
            out["judge_kappa"] = self.running_kappa
        return out


@runtime_checkable
class SpotChecks(Protocol):
    """A judge that also checks a sample of its own labels against the oracle
    (``judge.spot_check``); ``role_judge`` logs ``spot_check(...).metrics()``."""

    def spot_check(self, segments: Sequence[Segment], roles: Sequence[Role]) -> SpotCheck: ...


class SpotCheckedJudge:
    """``inner``'s labels, plus oracle labels on a seeded random ``fraction`` (at least
    ``minimum``) of each call's segments that carry oracle info; the confusion matrix
    over all checks so far is :attr:`confusion` (rows oracle, columns judge, in
    ``ROLE_NAMES`` order)."""

    def __init__(self, inner: Judge, fraction: float, minimum: int = 1, seed: int = 0):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"spot-check fraction must be in (0, 1], got {fraction}")
        self.inner, self.fraction, self.minimum = inner, float(fraction), max(1, int(minimum))
        self._rng = np.random.default_rng([90417, int(seed)])
        self.confusion = np.zeros((len(ROLE_NAMES), len(ROLE_NAMES)), dtype=np.int64)
        self._warned = False

    def label(self, segments: Sequence[Segment]) -> tuple[list[Role], int]:
        return self.inner.label(segments)

    def choose(self, segments: Sequence[Segment]) -> list[int]:
        eligible = [i for i, s in enumerate(segments) if has_oracle_info(s)]
        m = len(eligible)
        if m == 0:
            if segments and not self._warned:
                self._warned = True
                warnings.warn("judge.spot_check: this env's info has no "
                              f"{'/'.join(('progress', 'state_key'))}: nothing to check "
                              "against the oracle", RuntimeWarning, stacklevel=3)
            return []
        want = self.fraction * m
        k = int(want) + int(self._rng.random() < want - int(want))  # unbiased rounding
        k = min(m, max(k, self.minimum))
        return sorted(int(x) for x in self._rng.choice(eligible, size=k, replace=False))

    def spot_check(self, segments: Sequence[Segment], roles: Sequence[Role]) -> SpotCheck:
        idx = self.choose(segments)
        judge = tuple(Role(roles[i]) for i in idx)
        oracle = tuple(oracle_role(segments[i]) for i in idx)
        pos = {r: k for k, r in enumerate(ROLE_NAMES)}
        for o, j in zip(oracle, judge):
            self.confusion[pos[o.value], pos[j.value]] += 1
        seen = self.confusion.sum() > 0
        return SpotCheck(tuple(idx), judge, oracle,
                         agreement(self.confusion) if seen else None,
                         cohen_kappa(self.confusion) if seen else None)
