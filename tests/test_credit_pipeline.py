"""Each turn-level estimator runs inside the real training loop (tiny sizes)."""

import pytest
from test_search_train import SMOKE as SEARCH_SMOKE
from test_trainer import SMOKE as TW_SMOKE

from turngym.config import load_config
from turngym.trainers.metrics import read_metrics
from turngym.trainers.pipeline import train


@pytest.mark.parametrize("config,credit,smoke,metric", [
    ("search_grpo", "info_gain", SEARCH_SMOKE, "credit/ig_mean"),
    ("search_grpo", "td_log_ratio", SEARCH_SMOKE, "credit/td_reward_mean"),
    ("quickstart", "step_groups", TW_SMOKE, "credit/grouped_turn_frac"),
    ("quickstart", "role_judge", TW_SMOKE, "credit/role/useful_exploration"),
    ("search_grpo", "role_judge", SEARCH_SMOKE, "credit/env_facing_turns_per_episode"),
    ("quickstart", "branch_contrast", TW_SMOKE, "credit/nodes"),
])
def test_estimator_in_training_loop(tmp_path, config, credit, smoke, metric):
    out = tmp_path / "run"
    overrides = [o for o in smoke if not o.startswith("rl.steps=")]
    cfg = load_config(config, overrides + [f"output_dir={out}", "rl.steps=2",
                                           f"rl.credit.name={credit}", "eval.num_tasks=2"])
    train(cfg, progress=False)
    recs = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(recs) == 2
    assert all(metric in r and r["credit_s"] >= 0 for r in recs)


def test_compare_shares_one_warm_start(tmp_path):
    from turngym.cli import main

    out = tmp_path / "cmp"
    overrides = [o for o in TW_SMOKE if not o.startswith("rl.steps=")]
    code = main(["compare", "--config", "quickstart", "--credits", "grpo,step_groups",
                 "--no-progress", f"output_dir={out}", "rl.steps=1", "eval.num_tasks=2",
                 *overrides])
    assert code == 0
    import json
    res = json.loads((out / "compare.json").read_text())
    assert set(res["runs"]) == {"grpo", "step_groups"}
    w = [(out / n / "warmstart" / "model.safetensors").read_bytes() for n in res["runs"]]
    assert w[0] == w[1] == (out / "shared" / "warmstart" / "model.safetensors").read_bytes()
    # the same warm start evaluates identically in both runs
    assert res["runs"]["grpo"]["warmstart_eval"] == res["runs"]["step_groups"]["warmstart_eval"]
    assert (out / "compare.png").stat().st_size > 1000
