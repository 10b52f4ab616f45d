"""The search_grpo config end to end (tiny sizes): oracle demos -> SFT -> GRPO -> eval by hop."""

import json

from turngym.config import load_config
from turngym.trainers.metrics import read_metrics
from turngym.trainers.pipeline import train

SMOKE = ["warmstart.num_demos=24", "warmstart.epochs=1", "warmstart.batch_size=8",
         "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
         "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2", "eval.num_tasks=6",
         "eval.every=0", "checkpoint.every=1",
         "env.kwargs.retriever.kind=bm25",
         "env.kwargs.dataset.num_people=300", "env.kwargs.dataset.num_orgs=80",
         "env.kwargs.dataset.num_cities=40", "env.kwargs.dataset.num_countries=6",
         "env.kwargs.dataset.questions_per_template=20"]


def test_search_grpo_config_runs_end_to_end(tmp_path):
    out = tmp_path / "run"
    cfg = load_config("search_grpo", SMOKE + [f"output_dir={out}"])
    assert cfg.agent.action_parser == "raw" and cfg.env.id == "turngym/SearchQA-v0"
    summary = train(cfg, progress=False)
    final = summary["final_eval"]["test"]
    assert final["episodes"] == 6
    assert set(final["f1_by_type"]) == set(final["success_by_type"])
    assert set(final["success_by_type"]) <= {"1-hop", "2-hop", "3-hop"}
    assert 0.0 <= final["f1"] <= 1.0 and 0.0 <= final["answered_rate"] <= 1.0
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs if r["phase"] == "rl"] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["warmstart_eval"]["test"]
