"""`turngym compare` killed (SIGKILL-like: ``os._exit``, no cleanup) at every durable
filesystem step of preparing a seed's shared warm start, then rerun: the rerun finishes
and reports the warm start evaluated with *its* config -- never a stale evaluation, never
a half-adopted checkpoint.

The child process counts the calls to ``os.replace``, ``os.rename``, ``os.unlink``,
``shutil.copytree`` and ``shutil.rmtree`` made while ``shared_warm_start`` runs and dies
just before the k-th one (k = 1 .. all of them + 1, the last kill lands after the warm
start's evaluation was written, before training starts)."""

import json
import shutil
import subprocess
import sys

from test_trainer import SMOKE as TW_SMOKE

from turngym.cli import main
from turngym.config import load_config
from turngym.trainers.pipeline import train

CHILD = r"""
import json, os, shutil, sys
from turngym.trainers import compare

kill_at, count_file, argv = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
state = {"n": 0, "on": False}

def counted(fn):
    def wrapper(*a, **k):
        if state["on"]:
            state["n"] += 1
            if state["n"] == kill_at:
                os._exit(137)
        return fn(*a, **k)
    return wrapper

for mod, name in [(os, "replace"), (os, "rename"), (os, "unlink"),
                  (shutil, "copytree"), (shutil, "rmtree")]:
    setattr(mod, name, counted(getattr(mod, name)))
inner = compare.shared_warm_start

def shared_warm_start(*a, **k):
    state["on"] = True
    out = inner(*a, **k)
    state["on"] = False
    state["n"] += 1  # the kill point after everything the warm start wrote
    if state["n"] == kill_at:
        os._exit(137)
    with open(count_file, "w") as f:
        f.write(str(state["n"]))
    os._exit(0)  # the arms' training is not what this test kills

compare.shared_warm_start = shared_warm_start
from turngym.cli import main
sys.exit(main(argv))
"""

BASE = [o for o in TW_SMOKE if not o.startswith(("rl.steps=", "eval.num_tasks="))]


def _child(tmp_path, kill_at: int, argv: list[str]) -> subprocess.CompletedProcess:
    count = tmp_path / "count.txt"
    return subprocess.run([sys.executable, "-c", CHILD, str(kill_at), str(count),
                           json.dumps(argv)], capture_output=True, text=True, timeout=300,
                          check=False)


def _kill_points(tmp_path, template, work, argv) -> int:
    """How many counted steps preparing the warm start takes (a run with no kill)."""
    shutil.copytree(template, work)
    res = _child(tmp_path, 0, argv)
    assert res.returncode == 0, res.stderr[-2000:]
    shutil.rmtree(work)
    return int((tmp_path / "count.txt").read_text())


def _each_kill_then_rerun(tmp_path, template, work, argv, min_points: int):
    """For every kill point k (at least ``min_points``): ``work`` starts as a copy of
    ``template``, the child dies at k, the same command is rerun to the end; yields k
    for the caller's checks of ``work``."""
    points = _kill_points(tmp_path, template, work, argv)
    assert points >= min_points
    for k in range(1, points + 1):
        shutil.copytree(template, work)
        res = _child(tmp_path, k, argv)
        assert res.returncode == 137, (k, res.stderr[-2000:])
        assert main(argv) == 0, k
        yield k
        shutil.rmtree(work)


def _tasks(ev: dict) -> list[int]:
    return [len(m["per_task_success"]) for m in ev.values()]


def test_compare_killed_while_re_evaluating_a_shared_warm_start_never_reports_a_stale_one(
        tmp_path):
    template = tmp_path / "template"
    common = ["compare", "--seeds", "0", "--no-progress", "rl.steps=1", *BASE]
    assert main(common + [f"output_dir={template}", "--credits", "grpo",
                          "eval.num_tasks=2"]) == 0
    weights = (template / "seed_0/shared/warmstart/model.safetensors").read_bytes()
    work = tmp_path / "work"
    # a new arm, evaluated on 3 tasks: the shared warm start must be evaluated again
    argv = common + [f"output_dir={work}", "--credits", "step_groups", "--baseline",
                     "step_groups", "eval.num_tasks=3"]
    # >= 3: the old evaluation removed, the config recorded, the new one written
    for k in _each_kill_then_rerun(tmp_path, template, work, argv, min_points=3):
        shared = work / "seed_0" / "shared"
        assert (shared / "warmstart/model.safetensors").read_bytes() == weights, k
        assert _tasks(json.loads((shared / "warmstart_eval.json").read_text())) == [3], k
        run = json.loads((work / "seed_0/step_groups/summary.json").read_text())
        assert _tasks(run["warmstart_eval"]) == [3], k


def test_compare_killed_while_adopting_a_warm_start_adopts_it_whole_on_rerun(tmp_path):
    runs = tmp_path / "runs"
    train(load_config("quickstart", BASE + ["rl.steps=1", "eval.num_tasks=2", "seed=3",
                                            f"output_dir={runs / 'seed_3'}"]), progress=False)
    source = (runs / "seed_3/warmstart/model.safetensors").read_bytes()
    template = tmp_path / "template"
    template.mkdir()
    work = tmp_path / "work"
    argv = ["compare", "--credits", "grpo", "--seeds", "3", "--no-progress",
            "--warm-starts", str(runs), f"output_dir={work}", "rl.steps=1",
            "eval.num_tasks=2", *BASE]
    # >= 4: copied, config recorded, renamed into place, evaluation written
    for k in _each_kill_then_rerun(tmp_path, template, work, argv, min_points=4):
        shared = work / "seed_3" / "shared"
        assert (shared / "warmstart/model.safetensors").read_bytes() == source, k
        assert (shared / "adopted_from.txt").read_text().strip() == str(
            (runs / "seed_3").resolve()), k
        rec = (shared / "config.yaml").read_text()
        assert "num_tasks: 2" in rec, k
        assert _tasks(json.loads((shared / "warmstart_eval.json").read_text())) == [2], k
        assert not (work / "seed_3" / "shared.adopting").exists(), k
