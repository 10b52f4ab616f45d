"""The results writers, run on tiny configs: quickstart seeds -> quickstart.json, compare
and probe records in the documented schema, and the markdown rendered from them."""

import json

import numpy as np

from test_trainer import SMOKE

from turngym.cli import main


def test_quickstart_writer_and_render(tmp_path):
    res = tmp_path / "results"
    overrides = [o for o in SMOKE if not o.startswith("checkpoint.")] + ["rl.steps=1"]
    assert main(["results", "quickstart", "--seeds", "0,1", "--dir", str(res), "--runs",
                 str(tmp_path / "runs"), "--no-progress", "--decoding",
                 "t0.05: temperature=0.05", *overrides]) == 0
    rec = json.loads((res / "quickstart.json").read_text())
    assert rec["command"].startswith("turngym results quickstart")
    assert rec["machine"]["cores"] >= 1 and rec["machine"]["torch"]
    assert [r["seed"] for r in rec["runs"]] == [0, 1]
    for r in rec["runs"]:
        assert r["wall_s"] > 0
        for key in ("warmstart", "final"):
            assert set(r[key]) == {"valid_unseen"} and 0.0 <= r[key]["valid_unseen"] <= 1.0
    # the numbers are the runs' own summaries, not typed
    for r in rec["runs"]:
        s = json.loads((tmp_path / "runs" / f"seed_{r['seed']}" / "summary.json").read_text())
        assert r["final"]["valid_unseen"] == s["final_eval"]["valid_unseen"]["success"]
    assert (res / "quickstart_seed0.png").exists()
    # greedy re-evaluation of both checkpoints, cached beside them and read back as is
    for r in rec["runs"]:
        cache = json.loads((tmp_path / "runs" / f"seed_{r['seed']}" / "greedy_eval.json")
                           .read_text())
        assert r["greedy"] == {k: cache[k] for k in ("warmstart", "final")}
        assert set(r["greedy"]) == {"warmstart", "final"}
        assert all(0.0 <= r["greedy"][k]["valid_unseen"] <= 1.0 for k in r["greedy"])
    # another decoding of the same checkpoints: its own cache, its settings recorded
    for r in rec["runs"]:
        d = r["decodings"]["t0.05"]
        assert d["sampling"] == {"temperature": 0.05}
        cache = json.loads((tmp_path / "runs" / f"seed_{r['seed']}" / "reeval_t0.05.json")
                           .read_text())
        assert cache["measured"]["eval"]["sampling"]["temperature"] == 0.05
        assert {k: d[k] for k in ("warmstart", "final")} == {k: cache[k] for k in
                                                               ("warmstart", "final")}
    # the cache answers only for the checkpoints and evaluation it measured
    from turngym.config import load_config
    from turngym.trainers.results import greedy_reeval
    run0 = tmp_path / "runs" / "seed_0"
    cache_file = run0 / "greedy_eval.json"
    planted = json.loads(cache_file.read_text())
    planted["final"] = {"valid_unseen": 7.0}  # not a success rate: only a cache read says it
    cache_file.write_text(json.dumps(planted))
    run_cfg = load_config(str(run0 / "config.yaml"))
    assert greedy_reeval(run_cfg, run0, progress=False)["final"] == {"valid_unseen": 7.0}
    manifest = run0 / "final" / "manifest.json"  # a resumed run's new final/
    manifest.write_text(manifest.read_text() + "\n")
    again = greedy_reeval(run_cfg, run0, progress=False)
    assert again["final"] == rec["runs"][0]["greedy"]["final"]  # measured again
    cache_file.write_text(json.dumps(dict(planted, measured=json.loads(
        cache_file.read_text())["measured"])))
    other_eval = load_config(str(run0 / "config.yaml"), ["eval.num_tasks=1"])
    assert greedy_reeval(other_eval, run0, progress=False)["final"] != {"valid_unseen": 7.0}
    # probe record through the CLI, then the render
    rc = main(["probe", "--config", "quickstart", "--checkpoint",
               str(tmp_path / "runs" / "seed_0" / "final"), "--tasks", "2", "--group-size", "2",
               "--continuations", "2", "--estimators", "grpo,step_groups", "--no-progress",
               "--results", str(res / "probe_textworld.json"), *SMOKE])
    assert rc == 0
    probe = json.loads((res / "probe_textworld.json").read_text())
    assert set(probe["modules"]) == {"grpo", "step_groups"}
    assert probe["command"].startswith("turngym probe") and "machine" in probe
    out = tmp_path / "results.md"
    (res / "notes.md").write_text("## What was tried\n\nnotes-marker\n")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:quickstart -->\nold\n<!-- /results -->\nrest\n")
    fresh = dict(rec, runs=[dict(r, seed=r["seed"] + 3) for r in rec["runs"]])
    (res / "quickstart_fresh_seeds.json").write_text(json.dumps(fresh))
    assert main(["results", "render", "--dir", str(res), "--out", str(out),
                 "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text
    assert "seeds 3, 4" not in text  # the README reports quickstart.json, not the fresh seeds
    assert "+-" in text and "seeds 0, 1" in text and "valid_unseen, greedy" in text
    assert "valid_unseen, t0.05" in text
    md = out.read_text()
    assert "## Quickstart" in md and "| mean |" in md and "| std |" in md
    fresh_md = md.split("## Free generation on fresh seeds")[1].split("\n## ")[0]
    first_split = next(iter(rec["runs"][0]["warmstart"].values()))
    assert f"| 3 | {first_split:.3f} | **" in fresh_md
    assert "greedy decoding" in md and "`temperature=0.05`" in md
    assert f"**{rec['runs'][1]['greedy']['final']['valid_unseen']:.3f}**" in md
    assert "Credit-quality probe, text world" in md and "step_groups" in md
    assert "compare_search.json" in md  # listed as not measured yet
    first = rec["runs"][0]["final"]["valid_unseen"]
    assert f"**{first:.3f}**" in md
    assert md.rstrip().endswith("notes-marker")  # the hand-written analysis comes last


def test_quickstart_variants_record_pairs_whole_recipes_by_seed_and_task(tmp_path, capsys):
    """A variant may change the recipe (warm start included), never the env, the
    evaluation tasks or the seeds; finished runs are reused only with their own config."""
    import pytest

    from turngym.config import ConfigError
    from turngym.trainers.results import quickstart_variants

    res, runs = tmp_path / "results", tmp_path / "runs"
    overrides = [o for o in SMOKE if not o.startswith("checkpoint.")] + ["rl.steps=1"]
    base = ["results", "quickstart", "--seeds", "0", "--dir", str(res), "--runs", str(runs),
            "--no-progress"]
    # refused before anything runs: each would change what the arms are paired on
    for bad in ("evalx: eval.num_tasks=5", "envx: env.kwargs.world.num_unseen_layouts=3",
                "seedx: seed=7", "baseline: rl.steps=2", "a/b: rl.steps=2"):
        with pytest.raises(ConfigError):
            quickstart_variants(_cfg(overrides), {bad.split(":")[0]: _cfg(
                overrides + [bad.split(": ")[1]])}, [0], res / "q.json", "", runs,
                "valid_unseen", progress=False)
    assert not runs.exists()
    assert main([*base, *overrides, "--variant", "demos: warmstart.num_demos=24",
                 "--variant", "steps: rl.steps=2"]) == 0
    rec = json.loads((res / "quickstart_variants.json").read_text())
    assert not (res / "quickstart.json").exists()  # the quickstart record is its own command's
    assert rec["baseline"] == "baseline" and rec["split"] == "valid_unseen"
    assert set(rec["estimators"]) == {"baseline", "demos", "steps"}
    assert set(rec["vs_baseline"]) == {"demos", "steps"}
    assert rec["arms"]["demos"] == ["warmstart.num_demos: 16 -> 24"]
    assert rec["arms"]["baseline"] == []
    dirs = {"baseline": runs / "seed_0", "demos": runs / "variants" / "demos" / "seed_0",
            "steps": runs / "variants" / "steps" / "seed_0"}
    for name, d in dirs.items():  # the numbers are each run's own summary
        s = json.loads((d / "summary.json").read_text())
        assert rec["estimators"][name]["final"] == [s["final_eval"]["valid_unseen"]["success"]]
        assert rec["estimators"][name]["warmstart"] == [
            s["warmstart_eval"]["valid_unseen"]["success"]]
        assert len(rec["wall_s"][name]) == 1 and rec["wall_s"][name][0] > 0
    for name, n in (("baseline", 1), ("steps", 2)):  # each arm trained its own budget
        recs = [json.loads(x) for x in (dirs[name] / "metrics.jsonl").read_text().splitlines()]
        assert sorted({r["step"] for r in recs if r.get("phase") == "rl"}) == list(
            range(1, n + 1))
    per_task = {n: json.loads((d / "summary.json").read_text())["final_eval"]["valid_unseen"]
                ["per_task_success"] for n, d in dirs.items()}
    assert all(len(v) == 3 for v in per_task.values())  # the same 3 evaluation tasks each
    d = rec["vs_baseline"]["steps"]
    assert abs(d["diff_mean"] - (sum(per_task["steps"]) - sum(per_task["baseline"])) / 3) < 1e-9
    assert d["ci95"][0] <= d["diff_mean"] <= d["ci95"][1]
    out = capsys.readouterr().out
    assert "demos: final valid_unseen" in out and "vs baseline" in out
    # rerun: every run is read back, nothing retrained; now every arm is also
    # re-evaluated at another decoding and compared again there
    mtimes = {n: (d / "summary.json").stat().st_mtime for n, d in dirs.items()}
    assert main([*base, *overrides, "--variant", "demos: warmstart.num_demos=24",
                 "--variant", "steps: rl.steps=2", "--decoding",
                 "t0.05: temperature=0.05"]) == 0
    assert {n: (d / "summary.json").stat().st_mtime for n, d in dirs.items()} == mtimes
    again = json.loads((res / "quickstart_variants.json").read_text())
    assert again["estimators"] == rec["estimators"]  # the configured decoding is unchanged
    dec = again["decodings"]["t0.05"]
    assert dec["sampling"] == {"temperature": 0.05}
    caches = {n: json.loads((d / "reeval_t0.05.json").read_text()) for n, d in dirs.items()}
    for name, c in caches.items():  # the numbers are each run's re-evaluation
        assert c["measured"]["eval"]["sampling"]["temperature"] == 0.05
        assert dec["estimators"][name]["final"] == [c["final"]["valid_unseen"]]
        assert dec["estimators"][name]["warmstart"] == [c["warmstart"]["valid_unseen"]]
    low = {n: c["per_task"]["final"]["valid_unseen"] for n, c in caches.items()}
    d = dec["vs_baseline"]["steps"]
    assert abs(d["diff_mean"] - (sum(low["steps"]) - sum(low["baseline"])) / 3) < 1e-9
    out = capsys.readouterr().out
    assert "steps [t0.05]: final valid_unseen" in out
    # a cache written before per-task results were kept still answers what it has (the
    # success rates) but is measured again, not misread, when per-task results are needed
    from turngym.trainers.results import reeval, reeval_summary
    old = dict(caches["steps"], final={"valid_unseen": 7.0})  # only a cache read says 7
    del old["per_task"]
    (dirs["steps"] / "reeval_t0.05.json").write_text(json.dumps(old))
    step_cfg = _cfg(overrides + ["rl.steps=2", f"output_dir={dirs['steps']}"])
    args = (step_cfg, dirs["steps"], {"temperature": 0.05}, "reeval_t0.05.json")
    assert reeval(*args, progress=False)["final"] == {"valid_unseen": 7.0}
    got = reeval_summary(*args, progress=False)
    assert got["final_eval"]["valid_unseen"]["per_task_success"] == low["steps"]
    assert got["final_eval"]["valid_unseen"]["success"] == caches["steps"]["final"]["valid_unseen"]
    # the same arm name with another recipe must not silently reuse the finished run
    assert main([*base, *overrides, "--variant", "demos: warmstart.num_demos=32"]) == 2
    # and the baseline runs are what `results quickstart` reads, with the same check
    assert main([*base, *overrides]) == 0
    assert main([*base, *overrides[:-1], "rl.steps=3"]) == 2
    # the record renders under its own title, with the arms' changes and wall times
    md = tmp_path / "results.md"
    assert main(["results", "render", "--dir", str(res), "--out", str(md)]) == 0
    text = md.read_text()
    assert "Quickstart recipes side by side" in text and "wall (min) per seed" in text
    assert "`warmstart.num_demos: 16 -> 24`" in text
    assert "Re-evaluated with `eval.sampling` `temperature=0.05` (`t0.05`)" in text


def _cfg(overrides):
    from turngym.config import load_config
    return load_config("quickstart", overrides)


def test_a_decoding_that_is_not_a_sampling_setting_is_refused(tmp_path, capsys):
    for bad in ("t: temp=0.4", "greedy: temperature=0.4", "t: temperature=0", "t:"):
        assert main(["results", "quickstart", "--seeds", "0", "--dir", str(tmp_path), "--runs",
                     str(tmp_path / "runs"), "--decoding", bad, *SMOKE]) == 2
        assert "--decoding" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before anything ran


def test_compare_record_counts_every_episode_of_a_multi_sample_evaluation():
    from turngym.trainers.compare import summarize_comparison
    from turngym.trainers.results import compare_record, render_compare

    def run(final):  # a run's summary: 16 tasks played 16 times each
        ev = {"success": final, "episodes": 256, "per_task_success": [final] * 16}
        return {"final_eval": {"train": ev}, "warmstart_eval": {"train": {**ev, "success": 0.25}}}
    runs = {"grpo": {0: run(0.5), 1: run(0.75)}, "info_gain": {0: run(0.5), 1: run(0.75)}}
    results = summarize_comparison(runs, ["grpo", "info_gain"], ["train"], "grpo")
    assert results["episodes_per_eval"] == 256
    rec = compare_record(results, "train", "turngym compare ...")
    assert (rec["episodes_per_eval"], rec["tasks_per_eval"],
            rec["samples_per_task"]) == (256, 16, 16)
    assert "16 fixed tasks x 16 episodes each" in "\n".join(render_compare(rec, "t"))
    # the record keeps the per-task data: its statistics can be recomputed from it alone
    from turngym.trainers.compare import paired_bootstrap
    kept = {n: e["per_task_success"] for n, e in rec["all_splits"]["train"]["estimators"].items()}
    assert kept["grpo"] == [[0.5] * 16, [0.75] * 16]
    assert paired_bootstrap(kept, "grpo")["vs_baseline"] == rec["vs_grpo"]
    # a record of one episode per task (and results written before the count was kept)
    del results["splits"]["train"]["episodes_per_seed"]
    rec = compare_record(results, "train", "turngym compare ...")
    assert (rec["episodes_per_eval"], rec["samples_per_task"]) == (16, 1)
    assert "16 fixed tasks per seed" in "\n".join(render_compare(rec, "t"))


def test_quickstart_render_names_tasks_and_episodes_of_a_multi_sample_evaluation():
    from turngym.trainers.results import _run_entry, render_quickstart
    ev = {"success": 0.5, "invalid_action_rate": 0.0, "mean_turns": 3.0}
    summary = {"warmstart_eval": {"test": {**ev, "episodes": 64, "per_task_success": [0.5] * 16}},
               "final_eval": {"test": {**ev, "episodes": 64, "per_task_success": [0.5] * 16}}}
    run = _run_entry(0, summary, 60.0, "test")
    assert (run["episodes_per_eval"], run["tasks_per_eval"]) == (64, 16)
    rec = {"command": "c", "machine": {"cpu": "x", "cores": 2}, "runs": [run]}
    assert "16 fixed tasks x 4 episodes each" in "\n".join(render_quickstart(rec))
    one = {**summary, "final_eval": {"test": {**ev, "episodes": 16,
                                              "per_task_success": [0.5] * 16}}}
    rec["runs"] = [_run_entry(0, one, 60.0, "test")]
    assert "(fixed tasks, fixed sampler seed" in "\n".join(render_quickstart(rec))


def test_render_lists_every_credit_contrast_and_which_lie_above_zero(tmp_path):
    """The at-a-glance section reads every compare record present: one row per estimator
    against grpo, recipe arms left out, the per-env count of CIs above 0, a forest plot."""
    from turngym.cli import main as cli
    from turngym.trainers.compare import summarize_comparison
    from turngym.trainers.results import compare_record, contrasts

    rng = np.random.default_rng(0)

    def run(per_task):
        ev = {"success": float(np.mean(per_task)), "episodes": len(per_task),
              "per_task_success": list(map(float, per_task))}
        return {"final_eval": {"valid_unseen": ev}, "warmstart_eval": {"valid_unseen": ev}}

    base = {s: rng.integers(0, 2, 40).astype(float) * 0.5 for s in range(3)}
    arms = {"grpo": {s: run(b) for s, b in base.items()},
            # better on every task of every seed, by a seed-dependent margin
            "step_groups": {s: run(b + 0.3 + 0.05 * s) for s, b in base.items()},
            "lr3e-4": {s: run(b + 0.5) for s, b in base.items()},  # a recipe arm
            "role_judge": {s: run(np.roll(b, 1)) for s, b in base.items()}}
    res = tmp_path / "results"
    res.mkdir()
    for name, keep, also in (
            ("compare_textworld_cons.json", ["grpo", "step_groups", "lr3e-4"], ["lr3e-4"]),
            ("compare_search_pool.json", ["grpo", "role_judge"], [])):
        results = summarize_comparison({k: arms[k] for k in keep}, keep, ["valid_unseen"], "grpo",
                                       also)
        (res / name).write_text(json.dumps(compare_record(results, "valid_unseen", "cmd")))
    rows = contrasts(res)
    # a further baseline (--also-vs) gives each estimator a second, labelled row; the
    # record's baseline is not itself contrasted with it
    assert [(c.env, c.label, c.verdict) for c in rows] == [
        ("text world", "step_groups", "above 0"), ("text world", "step_groups vs lr3e-4",
                                                   "below 0"),
        ("search QA", "role_judge", "includes 0")]
    rows = [rows[0], rows[2]]
    rec = json.loads((res / "compare_textworld_cons.json").read_text())
    assert rows[0].diff == rec["vs_grpo"]["step_groups"]["diff_mean"]
    assert list(rows[0].ci95) == rec["vs_grpo"]["step_groups"]["ci95"]
    assert rows[0].t95[0] > 0 and rows[0].seeds == (0, 1, 2)
    out, readme = tmp_path / "results.md", tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:contrasts -->\nold\n<!-- /results -->\nrest\n")
    assert cli(["results", "render", "--dir", str(res), "--out", str(out),
                "--readme", str(readme)]) == 0
    md = out.read_text().split("## Every credit comparison at a glance")[1].split("\n## ")[0]
    assert "**text world**: 1 of 2 contrasts above 0: step_groups (compare_textworld_cons.json)" in md
    assert "**search QA**: 0 of 1 contrasts above 0." in md
    assert "| lr3e-4 |" not in md and "| step_groups vs lr3e-4 | 3 | -0.150 [" in md
    # each record's section says where a difference comes from, task by task
    section = out.read_text().split("## Text world under constrained decoding, the")[1]
    section = section.split("\n## ")[0]
    assert ("* step_groups vs grpo, per task (mean over seeds): higher on 40 of 40 tasks, "
            "lower on 0; largest gains +0.35, +0.35, +0.35") in section
    assert "* step_groups vs lr3e-4, per task (mean over seeds): higher on 0 of 40 tasks, " \
           "lower on 40" in section
    assert "* lr3e-4 vs grpo, per task (mean over seeds): higher on 40 of 40" in section
    assert section.count(", per task (mean over seeds)") == 3  # every pair, once
    d = rec["vs_grpo"]["step_groups"]
    assert f"{d['diff_mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" in md
    assert (res / "credit_contrasts.png").stat().st_size > 0
    assert "![credit_contrasts](results/credit_contrasts.png)" in md
    # the README's generated sentence: the count per env, the winner named with its CI
    text = readme.read_text()
    assert text.startswith("intro\n<!-- results:contrasts -->\n") and text.endswith(
        "<!-- /results -->\nrest\n") and "old" not in text
    t = rows[0].t95
    assert ("text world: 1 of 2 contrasts above 0; step_groups "
            f"{d['diff_mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], "
            f"t [{t[0]:+.3f}, {t[1]:+.3f}] (3 seeds, `compare_textworld_cons.json`)") in text
    assert "search QA: 0 of 1 contrasts above 0; the highest lower bound role_judge" in text
    assert "; below 0: step_groups vs lr3e-4 -0.150 [" in text
    # a record written before the crossed bootstrap: marked, its section says why
    old = json.loads((res / "compare_search_pool.json").read_text())
    del old["resample"]
    (res / "compare_search_pool.json").write_text(json.dumps(old))
    assert cli(["results", "render", "--dir", str(res), "--out", str(out),
                "--readme", str(readme)]) == 0
    md = out.read_text()
    assert "| `compare_search_pool.json` * | role_judge |" in md
    assert "| `compare_textworld_cons.json` | step_groups |" in md
    section = md.split("## Search QA, learning a fixed pool")[1].split("\n## ")[0]
    assert "bootstrap intervals are too narrow" in section
    assert "1 of the 2 records predate the crossed bootstrap" in readme.read_text()
