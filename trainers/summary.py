"""Summaries of trajectory groups: success per task type, mean turns, invalid-action and
format-error rates, tool-call and QA metrics (train steps and evaluations alike)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Sequence

from ..types import Trajectory, TrajectoryGroup


def without_tokens(groups: Sequence[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """The groups as metrics see them: token ids and log-probs dropped, so gathering
    every rank's episodes for a log record moves kilobytes, not the whole batch."""
    empty = dict(prompt_ids=(), response_ids=(), response_mask=(), logprobs=())
    return [TrajectoryGroup(tuple(
        dataclasses.replace(t, history=(), turns=tuple(dataclasses.replace(x, **empty)
                                                       for x in t.turns)) for t in g),
        g.task_id) for g in groups]


def summarize(groups: Sequence[TrajectoryGroup]) -> dict:
    """Aggregate metrics over trajectories (used for both train batches and eval)."""
    trajs: list[Trajectory] = [t for g in groups for t in g]
    if not trajs:
        return {}
    n_turns = sum(t.num_turns for t in trajs)
    invalid = sum(1 for t in trajs for x in t.turns if not x.info.get("valid_action", True))
    bad_fmt = sum(1 for t in trajs for x in t.turns if not x.info.get("valid_format", True))
    by_type: dict[str, list[float]] = defaultdict(list)
    stops: dict[str, int] = defaultdict(int)
    for t in trajs:
        by_type[str(t.info.get("task_type", "all"))].append(float(t.success))
        stops[t.stop_reason.value] += 1
    out = {
        "success": sum(t.success for t in trajs) / len(trajs),
        "mean_reward": sum(t.outcome_reward for t in trajs) / len(trajs),
        "mean_turns": n_turns / len(trajs),
        "invalid_action_rate": invalid / max(1, n_turns),
        "format_error_rate": bad_fmt / max(1, n_turns),
        "episodes": len(trajs),
        "success_by_type": {k: sum(v) / len(v) for k, v in sorted(by_type.items())},
        "stop_reasons": dict(sorted(stops.items())),
    }
    # tool envs: calls per episode and the share of calls that were invalid
    if any("tool_calls" in x.info for t in trajs for x in t.turns):
        calls = sum(int(x.info.get("tool_calls", 0)) for t in trajs for x in t.turns)
        bad = sum(int(x.info.get("invalid_calls", 0)) for t in trajs for x in t.turns)
        out["tool_calls_per_episode"] = calls / len(trajs)
        out["invalid_call_rate"] = bad / max(1, calls)
    # QA envs report token F1 on the answering step; unanswered episodes score 0
    if any("f1" in x.info or "gold_answer" in x.info for t in trajs for x in t.turns[-1:]):
        f1s: dict[str, list[float]] = defaultdict(list)
        for t in trajs:
            last = t.turns[-1].info if t.turns else {}
            f1s[str(t.info.get("task_type", "all"))].append(float(last.get("f1", 0.0)))
        out["f1"] = sum(sum(v) for v in f1s.values()) / len(trajs)
        out["f1_by_type"] = {k: sum(v) / len(v) for k, v in sorted(f1s.items())}
        out["answered_rate"] = stops.get("answered", 0) / len(trajs)
    return out


def format_report(name: str, m: dict) -> str:
    lines = [f"{name}: success {m['success']:.3f} | mean turns {m['mean_turns']:.2f} | "
             f"invalid-action rate {m['invalid_action_rate']:.3f} | "
             f"format errors {m['format_error_rate']:.3f} | episodes {m['episodes']}"]
    if "f1" in m:
        lines[0] += f" | F1 {m['f1']:.3f} | answered {m['answered_rate']:.3f}"
    if "tool_calls_per_episode" in m:
        lines[0] += (f" | tool calls/episode {m['tool_calls_per_episode']:.2f} | "
                     f"invalid calls {m['invalid_call_rate']:.3f}")
    f1 = m.get("f1_by_type", {})
    for k, v in m.get("success_by_type", {}).items():
        extra = f"   F1 {f1[k]:.3f}" if k in f1 else ""
        lines.append(f"    {k:<28s} {v:.3f}{extra}")
    return "\n".join(lines)
