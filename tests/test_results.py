"""The results writers, run on tiny configs: quickstart seeds -> quickstart.json, compare
and probe records in the documented schema, and the markdown rendered from them."""

import json

from test_trainer import SMOKE

from turngym.cli import main


def test_quickstart_writer_and_render(tmp_path):
    res = tmp_path / "results"
    overrides = [o for o in SMOKE if not o.startswith("checkpoint.")] + ["rl.steps=1"]
    assert main(["results", "quickstart", "--seeds", "0,1", "--dir", str(res), "--runs",
                 str(tmp_path / "runs"), "--no-progress", *overrides]) == 0
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
    assert main(["results", "render", "--dir", str(res), "--out", str(out),
                 "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text
    assert "+-" in text and "seeds 0, 1" in text and "valid_unseen, greedy" in text
    md = out.read_text()
    assert "## Quickstart" in md and "| mean |" in md and "| std |" in md
    assert "greedy decoding" in md
    assert f"**{rec['runs'][1]['greedy']['final']['valid_unseen']:.3f}**" in md
    assert "Credit-quality probe, text world" in md and "step_groups" in md
    assert "compare_search.json" in md  # listed as not measured yet
    first = rec["runs"][0]["final"]["valid_unseen"]
    assert f"**{first:.3f}**" in md
    assert md.rstrip().endswith("notes-marker")  # the hand-written analysis comes last
