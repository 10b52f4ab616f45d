"""Evaluation on fixed task sets: several independent episodes per task."""

from types import SimpleNamespace

import pytest

from turngym.config import ConfigError, load_config
from turngym.trainers.evaluate import evaluate_model

BASE = ["agent.max_turns=3", "agent.system_prompt=You are a household agent.",
        "env.eval_splits=[valid_seen]", "threads=1"]


def _traj(seed: int, success: bool):
    return SimpleNamespace(success=success, info={"task_seed": seed})


def test_per_task_success_is_the_mean_over_each_tasks_episodes_in_seed_order():
    from turngym.trainers.evaluate import per_task_success
    groups = [[_traj(7, True), _traj(7, False), _traj(7, True)],
              [_traj(2, False), _traj(2, False)], [_traj(2, True)]]
    assert per_task_success(groups) == pytest.approx([1 / 3, 2 / 3])


def test_samples_per_task_plays_each_task_that_many_times(tiny_stack):
    tok, model, _ = tiny_stack
    one = evaluate_model(model, tok, load_config("quickstart", BASE + ["eval.num_tasks=3"]),
                         "valid_seen", progress=False)
    assert one["episodes"] == 3 and len(one["per_task_success"]) == 3
    assert set(one["per_task_success"]) <= {0.0, 1.0}
    cfg = load_config("quickstart", BASE + ["eval.num_tasks=3", "eval.samples_per_task=4",
                                            "agent.max_batch_size=5"])
    four = evaluate_model(model, tok, cfg, "valid_seen", progress=False)
    assert four["episodes"] == 12 and len(four["per_task_success"]) == 3
    assert all(round(4 * s) == 4 * s for s in four["per_task_success"])
    # the tasks' mean equals the episodes' mean (every task has the same number of samples)
    assert sum(four["per_task_success"]) / 3 == pytest.approx(four["success"])


def test_samples_per_task_must_be_positive():
    with pytest.raises(ConfigError, match="eval.samples_per_task"):
        load_config("quickstart", ["eval.samples_per_task=0"])
