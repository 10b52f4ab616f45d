"""Credit phase: the services an estimator declared, and per-turn advantages for a step.

An estimator names what it calls (``register_estimator(..., requires=...)``) and the
trainer builds only that: gold-answer scorers over the current policy or the frozen
reference, a policy exposing the trainer's model (entropies), a brancher resuming
episodes at exact prefixes, a judge.  Episodes that ended because the env raised are
not trained on: they say nothing about the policy, and counting them as failures
would teach it to avoid the env's bugs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from .. import credit as credit_lib
from ..credit.registry import NamesAJudge, ScoresAnswers
from ..agents.branching import BranchPoint, continue_from
from ..agents.hf_backend import HFPolicy
from ..agents.policy import HasModel
from ..agents.prompting import ChatPrompter
from ..agents.rollout import EnvPool, RolloutConfig
from ..types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup
from .distributed import World


@dataclass
class Brancher:
    """Exact-prefix continuations for branch-based credit and the probe; ``version`` is
    the policy version stamped on what it samples (the RL step)."""

    policy: Any
    prompter: ChatPrompter
    pool: EnvPool
    rcfg: RolloutConfig
    version: int = 0

    def __call__(self, points: Sequence[BranchPoint]) -> list[Trajectory]:
        return continue_from(self.policy, self.prompter, self.pool, points, self.rcfg,
                             self.version)


def make_judge(spec):
    """The judge ``rl.credit.params.judge`` describes (a JudgeSpec or a mapping such as
    ``{"kind": "oracle"}``); see :func:`turngym.credit.judges.make_judge`."""
    from ..credit.judges import make_judge as build
    return build(spec)


def credit_context(name: str, params: Any, policy, model, ref, tokenizer,
                   brancher: Brancher | None = None, precision: str | None = None
                   ) -> credit_lib.CreditContext:
    """The services estimator ``name`` declared (``params``: its params dataclass)."""
    needs = credit_lib.requirements(name)
    if not isinstance(policy, HasModel):  # e.g. vLLM: estimators read entropies off the
        policy = HFPolicy(model, tokenizer, precision=precision)  # trainer's copy instead
    ctx = credit_lib.CreditContext(policy=policy, reference=ref, brancher=brancher)
    if brancher is not None:
        ctx.sampling_temperature = brancher.rcfg.logprob_temperature
    template = (params.answer_template if isinstance(params, ScoresAnswers)
                else credit_lib.scoring.DEFAULT_ANSWER_TEMPLATE)
    if "scorer" in needs:
        ctx.scorer = credit_lib.GoldScorer(model, tokenizer, template, precision=precision)
    if "reference_scorer" in needs:
        if ref is None:
            raise ValueError(f"credit estimator {name!r} needs a frozen reference model")
        ctx.reference_scorer = credit_lib.GoldScorer(ref, tokenizer, template,
                                                     precision=precision)
    if "judge" in needs:
        # an estimator whose params name no judge gets the oracle (privileged env progress)
        ctx.judge = make_judge((params.judge if isinstance(params, NamesAJudge) else None)
                               or {"kind": "oracle"})
    return ctx


def drop_errored(groups: Sequence[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], int]:
    """Groups without the episodes the env cut off with an error (a group left empty is
    dropped); and how many episodes were removed."""
    out, n = [], 0
    for g in groups:
        keep = tuple(t for t in g if t.stop_reason is not StopReason.ERROR)
        n += len(g) - len(keep)
        if keep:
            out.append(dataclasses.replace(g, trajectories=keep) if len(keep) < len(g) else g)
    return out, n


def assign_step_credit(name: str, params: Any, groups: Sequence[TrajectoryGroup],
                       ctx: credit_lib.CreditContext
                       ) -> tuple[list[TrajectoryGroup], list[CreditAssignment], dict]:
    """(the groups trained on, their credit, step metrics)."""
    trained, errored = drop_errored(groups)
    credits = credit_lib.assign_credit(name, trained, params, ctx) if trained else []
    return trained, credits, {"env_error_episodes": float(errored)}


def signal_fractions(world: World, groups: Sequence[TrajectoryGroup],
                     credits: Sequence[CreditAssignment]) -> dict:
    """How much of a step's data could train at all, for any estimator:
    ``flat_outcome_group_frac``, the share of groups whose outcome rewards are all equal
    (outcome GRPO gives every turn of them A = 0 -- "advantage collapse"), and
    ``zero_adv_turn_frac``, the share of trained turns (extra rows such as branches
    included) whose advantage is exactly 0 -- for every token, where an estimator
    credits tokens.  Over all ranks' groups."""
    flat = sum(1.0 for g in groups if len(set(g.outcome_rewards())) <= 1)
    zero = n_turns = 0
    for c in credits:
        for i, adv in enumerate(c.turn_advantages):
            toks = c.token_advantages[i] if c.token_advantages is not None else None
            for t, a in enumerate(adv):
                zero += not any(toks[t]) if toks is not None and toks[t] else a == 0.0
            n_turns += len(adv)
        for _, adv in c.extra:
            zero += sum(a == 0.0 for a in adv)
            n_turns += len(adv)
    flat, n_groups, zero, n_turns = world.all_reduce_sum(
        [flat, float(len(groups)), float(zero), float(n_turns)])
    return {"flat_outcome_group_frac": flat / max(n_groups, 1.0),
            "zero_adv_turn_frac": zero / max(n_turns, 1.0)}
