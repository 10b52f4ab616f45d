"""Each turn-level estimator runs inside the real training loop (tiny sizes)."""

import json

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
    assert all(0 <= r["flat_outcome_group_frac"] <= 1 and 0 <= r["zero_adv_turn_frac"] <= 1
               for r in recs)


def test_compare_two_seeds_share_one_warm_start_per_seed(tmp_path):
    import json

    from turngym.cli import main
    out = tmp_path / "cmp"
    overrides = [o for o in TW_SMOKE if not o.startswith(("rl.steps=", "eval.num_tasks="))]
    code = main(["compare", "--config", "quickstart", "--credits", "grpo,step_groups",
                 "--seeds", "0,1", "--no-progress", f"output_dir={out}", "rl.steps=1",
                 "eval.num_tasks=4", "--results", str(tmp_path / "compare_textworld.json"),
                 *overrides])
    assert code == 0
    rec = json.loads((tmp_path / "compare_textworld.json").read_text())
    assert rec["episodes_per_eval"] == 4 and rec["split"] == "valid_unseen"
    assert set(rec["estimators"]) == {"grpo", "step_groups"}
    assert set(rec["vs_grpo"]) == {"step_groups"}
    assert set(rec["estimators"]["grpo"]) >= {"seeds", "final", "mean", "ci95"}
    assert (tmp_path / "compare_textworld.png").exists()
    res = json.loads((out / "compare.json").read_text())
    assert res["seeds"] == [0, 1] and res["baseline"] == "grpo"
    assert res["command"].startswith("turngym compare")
    st = res["splits"]["valid_unseen"]
    assert set(st["estimators"]) == {"grpo", "step_groups"} and st["tasks_per_seed"] == 4
    for name, e in st["estimators"].items():
        assert e["seeds"] == [0, 1] and len(e["final"]) == 2
        assert e["ci95"][0] <= e["mean"] <= e["ci95"][1]
    d = st["vs_baseline"]["step_groups"]
    assert d["ci95"][0] <= d["diff_mean"] <= d["ci95"][1]
    for seed in (0, 1):
        shared = (out / f"seed_{seed}" / "shared" / "warmstart" / "model.safetensors")
        for n in ("grpo", "step_groups"):  # every estimator starts from the seed's warm start
            run = out / f"seed_{seed}" / n
            assert (run / "warmstart" / "model.safetensors").read_bytes() == shared.read_bytes()
            summary = json.loads((run / "summary.json").read_text())
            assert summary["warmstart_eval"] == json.loads(
                (out / f"seed_{seed}" / "shared" / "warmstart_eval.json").read_text())
    # seeds differ: their warm starts differ
    a, b = ((out / f"seed_{s}" / "shared" / "warmstart" / "model.safetensors").read_bytes()
            for s in (0, 1))
    assert a != b
    assert (out / "compare.png").stat().st_size > 1000
    # a rerun reuses everything (nothing is retrained) and gives the same numbers
    assert main(["compare", "--config", "quickstart", "--credits", "grpo,step_groups",
                 "--seeds", "0,1", "--no-progress", f"output_dir={out}", "rl.steps=1",
                 "eval.num_tasks=4", *overrides]) == 0
    assert json.loads((out / "compare.json").read_text())["splits"] == res["splits"]
    # the page renders a follow-up record (fresh seeds) under its own title; an optional
    # record that is absent is not listed as missing, a required one is
    (tmp_path / "compare_search_confirm.json").write_text(
        (tmp_path / "compare_textworld.json").read_text())
    md = tmp_path / "results.md"
    assert main(["results", "render", "--dir", str(tmp_path), "--out", str(md)]) == 0
    page = md.read_text()
    assert "## Search QA, confirmatory test on fresh seeds" in page
    assert page.count("\n| step_groups |") == 2 and "compare_search.json" in page  # its rows
    assert "compare_textworld_long.json" not in page


def test_compare_variants_pair_rl_settings_from_one_warm_start(tmp_path, capsys):
    """Arms that differ in an RL setting (not the estimator) share each seed's warm start
    and evaluation tasks; a variant that would change either is refused before any run."""
    import json

    import torch
    from omegaconf import OmegaConf

    from turngym.cli import main
    out = tmp_path / "cmp"
    overrides = [o for o in TW_SMOKE if not o.startswith(("rl.steps=", "eval.num_tasks="))]
    base = ["compare", "--config", "quickstart", "--seeds", "0", "--no-progress",
            f"output_dir={out}", "rl.steps=2", "eval.num_tasks=4", *overrides]
    for bad, why in ((["--variant", "a: rl.lr=1e-4", "--variant", "b: agent.max_turns=3"],
                      "agent.max_turns"),
                     (["--variant", "a: rl.lr=1e-4", "--variant", "b: eval.num_tasks=8"],
                      "eval.num_tasks"),
                     (["--variant", "a/b: rl.lr=1e-4"], "variant name"),
                     (["--variant", "a: rl.lr=1e-4", "--variant", "a: rl.lr=2e-4"], "twice"),
                     (["--variant", "a: rl.lr=1e-4", "--baseline", "grpo"], "not one of"),
                     (["--variant", "a: rl.lr=1e-4", "--also-vs", "b"], "--also-vs 'b' is not"),
                     (["--variant", "a: rl.lr=1e-4", "--variant", "b: rl.lr=2e-4",
                       "--also-vs", "a"], "the baseline already"),
                     (["--variant", "a: rl.no_such_key=1"], "no_such_key")):
        assert main(base + bad) != 0
        assert why in capsys.readouterr().err
        assert not out.exists()  # refused before anything was built
    code = main(base + ["--variant", "slow: rl.lr=1e-6", "--variant", "fast: rl.lr=1e-2",
                        "--variant", "mid: rl.lr=1e-3", "--also-vs", "fast",
                        "--results", str(tmp_path / "compare_lr.json")])
    assert code == 0
    rec = json.loads((tmp_path / "compare_lr.json").read_text())
    assert rec["baseline"] == "slow" and set(rec["vs_slow"]) == {"fast", "mid"}
    assert rec["arms"]["fast"] == ["rl.lr: 0.0001 -> 0.01"]
    # a second baseline (e.g. a compute-matched one): every other arm paired with it too,
    # from the same bootstrap replicates, and rendered as its own columns
    assert rec["also_vs"] == ["fast"] and set(rec["vs_fast"]) == {"slow", "mid"}
    assert rec["vs_fast"]["slow"]["diff_mean"] == pytest.approx(
        -rec["vs_slow"]["fast"]["diff_mean"])
    assert rec["vs_fast"]["slow"]["ci95"] == pytest.approx(
        [-x for x in reversed(rec["vs_slow"]["fast"]["ci95"])])
    from turngym.trainers.results import render_compare
    table = [ln for ln in render_compare(rec, "t") if ln.startswith("|")]
    assert "| vs fast [95% CI] | vs fast, seed-level t 95% CI |" in table[0]
    assert len({ln.count("|") for ln in table}) == 1  # every row has every column
    assert "vs fast:" in capsys.readouterr().out
    ws = (out / "seed_0" / "shared" / "warmstart" / "model.safetensors").read_bytes()
    for arm, lr in (("slow", 1e-6), ("fast", 1e-2)):
        run = out / "seed_0" / arm
        assert (run / "warmstart" / "model.safetensors").read_bytes() == ws
        assert json.loads((run / "summary.json").read_text())["warmstart_eval"] == \
            json.loads((out / "seed_0" / "shared" / "warmstart_eval.json").read_text())
        assert OmegaConf.load(run / "config.yaml").rl.lr == lr  # the arm's own setting ...
        opt = torch.load(run / "checkpoints" / "step_000002" / "optimizer.pt",
                         weights_only=True)
        assert [g["lr"] for g in opt["param_groups"]] == [lr]  # ... is what it trained with


def test_paired_bootstrap_detects_a_real_difference_and_not_noise():
    import numpy as np

    from turngym.trainers.compare import paired_bootstrap
    rng = np.random.default_rng(0)
    base = [(rng.random(300) < 0.3).astype(float) for _ in range(3)]
    better = [np.maximum(b, (rng.random(300) < 0.2)) for b in base]  # strictly more successes
    same = [(rng.random(300) < 0.3).astype(float) for _ in range(3)]
    st = paired_bootstrap({"grpo": base, "better": better, "same": same}, "grpo", n_boot=2000)
    assert st["vs_baseline"]["better"]["ci95"][0] > 0
    lo, hi = st["vs_baseline"]["same"]["ci95"]
    assert lo < 0 < hi
    assert st["estimators"]["grpo"]["mean"] == pytest.approx(np.mean(base))


def test_compare_adopts_warm_starts_of_earlier_runs_only_when_configs_agree(tmp_path):
    """--warm-starts RUNS: the quickstart's own warm starts are reused (bit for bit), and
    a run warm-started with another model is refused before any work."""
    from turngym.cli import main
    runs = tmp_path / "runs"
    base = [o for o in TW_SMOKE if not o.startswith(("rl.steps=", "eval.num_tasks="))]
    train(load_config("quickstart", base + ["rl.steps=1", "eval.num_tasks=2", "seed=3",
                                            "env.eval_splits=[valid_seen,valid_unseen]",
                                            f"output_dir={runs / 'seed_3'}"]), progress=False)
    out = tmp_path / "cmp"
    assert main(["compare", "--credits", "grpo", "--seeds", "3", "--no-progress",
                 "--warm-starts", str(runs), f"output_dir={out}", "rl.steps=1",
                 "eval.num_tasks=2", *base]) == 0
    adopted = out / "seed_3" / "shared" / "warmstart" / "model.safetensors"
    assert adopted.read_bytes() == (runs / "seed_3" / "warmstart" / "model.safetensors"
                                    ).read_bytes()
    assert (out / "seed_3" / "shared" / "adopted_from.txt").read_text().strip() == str(
        (runs / "seed_3").resolve())
    # the adopted warm start carries the config it was adopted under
    assert (out / "seed_3" / "shared" / "config.yaml").exists()
    # another model size: refused with the difference named, nothing built
    other = tmp_path / "cmp2"
    assert main(["compare", "--credits", "grpo", "--seeds", "3", "--no-progress",
                 "--warm-starts", str(runs), f"output_dir={other}", "rl.steps=1",
                 "eval.num_tasks=2", *base, "model.hidden_size=48"]) == 2
    assert not (other / "seed_3" / "grpo").exists()
    # a seed the runs do not have: refused too
    assert main(["compare", "--credits", "grpo", "--seeds", "4", "--no-progress",
                 "--warm-starts", str(runs), f"output_dir={other}", "rl.steps=1",
                 "eval.num_tasks=2", *base]) == 2


def test_compare_refuses_to_mix_a_finished_run_of_another_budget(tmp_path):
    from turngym.cli import main
    base = [o for o in TW_SMOKE if not o.startswith(("rl.steps=", "eval.num_tasks="))]
    args = ["compare", "--credits", "grpo", "--seeds", "0", "--no-progress",
            f"output_dir={tmp_path / 'cmp'}", "eval.num_tasks=2", *base]
    assert main(args + ["rl.steps=1"]) == 0
    assert main(args + ["rl.steps=2"]) == 2  # grpo finished with 1 step: not reused
    assert main(args + ["rl.steps=1", "eval.num_tasks=3"]) == 2  # nor another evaluation
    assert main(args + ["rl.steps=1", "threads=1"]) == 0  # how it runs may change


def test_compare_reuses_a_seeds_warm_start_only_for_its_config(tmp_path, capsys):
    """A later comparison in the same output_dir: another evaluation re-evaluates the
    shared warm start (never reports the old one); another model is refused."""
    from turngym.cli import main
    base = [o for o in TW_SMOKE if not o.startswith(("rl.steps=", "eval.num_tasks="))]
    out = tmp_path / "cmp"
    args = ["compare", "--seeds", "0", "--no-progress", f"output_dir={out}", "rl.steps=1",
            *base]
    assert main(args + ["--credits", "grpo", "eval.num_tasks=2"]) == 0
    shared = out / "seed_0" / "shared"
    weights = (shared / "warmstart" / "model.safetensors").read_bytes()
    ev = json.loads((shared / "warmstart_eval.json").read_text())
    assert [len(m["per_task_success"]) for m in ev.values()] == [2]
    # a new arm evaluated on 3 tasks: the same warm start, evaluated again on 3 tasks
    assert main(args + ["--credits", "step_groups", "--baseline", "step_groups",
                        "eval.num_tasks=3"]) == 0
    assert (shared / "warmstart" / "model.safetensors").read_bytes() == weights
    ev = json.loads((shared / "warmstart_eval.json").read_text())
    assert [len(m["per_task_success"]) for m in ev.values()] == [3]
    run = json.loads((out / "seed_0" / "step_groups" / "summary.json").read_text())
    assert [len(m["per_task_success"]) for m in run["warmstart_eval"].values()] == [3]
    # another model size cannot reuse that warm start: refused, naming the difference
    capsys.readouterr()
    assert main(args + ["--credits", "role_judge", "--baseline", "role_judge",
                        "eval.num_tasks=3", "model.hidden_size=48"]) == 2
    assert "model.hidden_size" in capsys.readouterr().err
    assert not (out / "seed_0" / "role_judge").exists()

    # an arm killed before it finished cannot be resumed under another evaluation: refused
    # before any work, the warm start's evaluation untouched
    (out / "seed_0" / "step_groups" / "summary.json").unlink()
    before = (shared / "warmstart_eval.json").read_bytes()
    assert main(args + ["--credits", "step_groups", "--baseline", "step_groups",
                        "eval.num_tasks=2"]) == 2
    assert "eval.num_tasks" in capsys.readouterr().err
    assert (shared / "warmstart_eval.json").read_bytes() == before


def test_a_warm_start_built_with_other_plugins_is_not_reused():
    from turngym.trainers.compare import warm_start_differences
    assert warm_start_differences({"plugins": []}, {"plugins": ["my_pkg.envs"]})
    assert not warm_start_differences({"plugins": ["a"]}, {"plugins": ["a"]})


def test_comparison_curves_keep_an_eval_split_named_train_apart_from_training(tmp_path):
    """An evaluation on the training pool (split "train") is its own panel, never mixed
    into the training-rollout curve."""
    from turngym.trainers.compare import arm_curves, plot_comparison
    run = tmp_path / "seed_0" / "grpo"
    run.mkdir(parents=True)
    recs = [{"phase": "rl", "step": k, "success_rate": 0.1 * k} for k in range(1, 11)]
    recs += [{"phase": "eval", "step": k, "split": "train", "success": 0.5} for k in (0, 5, 10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rollouts, pool = arm_curves(tmp_path, "grpo", [0], ["train"])
    assert rollouts[0][0] == list(range(1, 11))
    assert pool == [([0, 5, 10], [0.5, 0.5, 0.5])]
    assert plot_comparison(tmp_path, ["grpo"], [0], tmp_path / "c.png").stat().st_size > 0
