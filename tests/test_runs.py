"""Runs that never lose or lie: refusal of old directories, resume from the newest valid
checkpoint, config changes on resume, kill -9 during a save, corrupted weights, safe
loads, torn metrics lines, eval with the run's own config, trackers read back."""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from turngym.cli import main
from turngym.config import load_config
from turngym.trainers.checkpoint import CheckpointManager
from turngym.trainers.metrics import MetricsLogger, read_metrics
from turngym.trainers.pipeline import train
from turngym.trainers.run import RunError

SMOKE = ["warmstart.num_demos=12", "warmstart.epochs=1", "warmstart.batch_size=8",
         "warmstart.epsilon=0.0", "model.hidden_size=32", "model.num_layers=1",
         "model.num_heads=2", "rl.tasks_per_step=2", "rl.group_size=2", "eval.num_tasks=2",
         "agent.max_turns=8", "checkpoint.every=1", "checkpoint.keep=3",
         "env.eval_splits=[valid_unseen]"]


def _cfg(out, *extra):
    return load_config("quickstart", SMOKE + [f"output_dir={out}", *extra])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-step run (checkpoints at steps 1, 2, 3), copied per test."""
    out = tmp_path_factory.mktemp("runs") / "base"
    train(_cfg(out, "rl.steps=3"), progress=False)
    return out


@pytest.fixture()
def run(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _rl_steps(out):
    return [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]


def test_fresh_run_into_an_old_directory_is_refused_unless_overwrite(run):
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(RunError, match="not empty"):
        train(_cfg(run, "rl.steps=1"), progress=False)
    assert (run / "metrics.jsonl").read_text() == before  # nothing was touched
    assert main(["train", "--no-progress", *SMOKE, f"output_dir={run}", "rl.steps=1"]) == 2
    train(_cfg(run, "rl.steps=1"), progress=False, overwrite=True)
    assert _rl_steps(run) == [1]
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == ["step_000001"]


def test_overwrite_never_wipes_a_directory_that_holds_no_run(tmp_path):
    """``output_dir=.`` or a mistyped path with --overwrite used to delete everything in it."""
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "NOTES.md").write_text("mine")
    with pytest.raises(RunError, match="holds none"):
        train(_cfg(proj, "rl.steps=1"), progress=False, overwrite=True)
    assert sorted(p.name for p in proj.iterdir()) == ["NOTES.md", "src"]


def test_resume_past_the_asked_steps_is_refused_not_labelled_final(run):
    """A run killed after its step-3 checkpoint, resumed with rl.steps=1, would save the
    step-3 weights as final/ of a 1-step run."""
    (run / "summary.json").unlink()  # killed before it finished
    with pytest.raises(RunError, match="checkpoint at step 3, past rl.steps=1"):
        train(_cfg(run, "rl.steps=1"), resume=True, progress=False)


def test_resume_removes_a_half_written_copy_of_final_in_the_run_directory(run):
    """A kill inside the final/ (or warmstart/) save leaves a whole model copy beside it."""
    from turngym.trainers.run import prepare_run_dir
    leftover = run / ".final.tmp4242"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"x" * 1000)
    point = prepare_run_dir(_cfg(run, "rl.steps=4"), resume=True, overwrite=False)
    assert not leftover.exists() and (run / "final").is_dir()
    assert "removed an interrupted save: .final.tmp4242" in point.notes


def test_resume_continues_the_mini_batch_order_exactly(tmp_path):
    """With several mini-batches the trainer's shuffle RNG decides the update: 2 steps +
    --resume to 3 equals 3 uninterrupted steps, bit for bit."""
    from safetensors.torch import load_file
    extra = ["rl.minibatches=4", "rl.entropy_coef=0.5", "rl.lr=0.01"]
    a, b = tmp_path / "a", tmp_path / "b"
    train(_cfg(a, "rl.steps=3", *extra), progress=False)
    train(_cfg(b, "rl.steps=2", *extra), progress=False)
    train(_cfg(b, "rl.steps=3", *extra), resume=True, progress=False)
    wa = load_file(a / "checkpoints" / "step_000003" / "model.safetensors")
    wb = load_file(b / "checkpoints" / "step_000003" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_with_nothing_to_resume_says_so(run, tmp_path):
    with pytest.raises(RunError, match="nothing to resume.*no config.yaml"):
        train(_cfg(tmp_path / "empty", "rl.steps=3"), resume=True, progress=False)
    with pytest.raises(RunError, match="finished at step 3"):
        train(_cfg(run, "rl.steps=3"), resume=True, progress=False)
    assert main(["train", "--no-progress", "--resume", *SMOKE, f"output_dir={run}",
                 "rl.steps=3"]) == 2


def test_resume_refuses_changed_config_but_allows_listed_keys(run):
    with pytest.raises(RunError, match=r"rl.lr: [0-9.e-]+ -> 0.1"):
        train(_cfg(run, "rl.steps=4", "rl.lr=0.1"), resume=True, progress=False)
    with pytest.raises(RunError, match="model.hidden_size"):
        train(_cfg(run, "rl.steps=4", "model.hidden_size=64"), resume=True, progress=False)
    train(_cfg(run, "rl.steps=4", "eval.num_tasks=3"), resume=True, progress=False)
    assert _rl_steps(run) == [1, 2, 3, 4]
    notes = [r["note"] for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "resume"]
    assert any("eval.num_tasks: 2 -> 3" in n for n in notes)
    assert json.loads((run / "summary.json").read_text())["final_eval"]["valid_unseen"][
        "episodes"] == 3


def test_resume_of_a_run_older_than_an_option_takes_its_default_only(run):
    """A run saved before an option existed (its config.yaml lacks the key) resumes with
    the option at its default, and is refused with any other value."""
    import yaml
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["warmstart"].pop("lm_mix") is False
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(RunError, match=r"warmstart.lm_mix: None -> True"):
        train(_cfg(run, "rl.steps=4", "warmstart.lm_mix=true"), resume=True, progress=False)
    train(_cfg(run, "rl.steps=4"), resume=True, progress=False)
    assert _rl_steps(run) == [1, 2, 3, 4]


def test_deleted_latest_and_corrupted_newest_checkpoint_fall_back(run):
    (run / "checkpoints" / "latest").unlink()
    weights = run / "checkpoints" / "step_000003" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\x00" * 64  # garbage weights, intact header
    weights.write_bytes(bytes(data))
    ckpts = CheckpointManager(run / "checkpoints")
    latest, skipped = ckpts.newest_valid()
    assert latest.name == "step_000002" and "checksum" in skipped[0]
    train(_cfg(run, "rl.steps=4"), resume=True, progress=False)
    assert _rl_steps(run) == [1, 2, 3, 4]  # step 3 redone from step 2, no duplicates
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r["step"] for r in lines if r["phase"] == "rl"]
    assert rl == sorted(set(rl))  # the dropped records are gone from the file itself


def test_missing_optimizer_state_is_an_error_not_a_silent_reset(run):
    (run / "checkpoints" / "step_000003" / "optimizer.pt").unlink()
    ckpts = CheckpointManager(run / "checkpoints")
    assert ckpts.newest_valid()[0].name == "step_000002"  # the manifest notices


def test_checkpoint_loads_refuse_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))
    torch.save({"state": {}, "param_groups": [], "x": Evil()}, tmp_path / "optimizer.pt")
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(pickle.UnpicklingError):
        CheckpointManager.load_optimizer(tmp_path, opt)
    assert not (tmp_path / "pwned").exists()


KILLER = textwrap.dedent("""
    import os, signal, sys
    from turngym.config import load_config
    from turngym.trainers import checkpoint
    from turngym.trainers.pipeline import train
    real = checkpoint.CheckpointManager.save
    def save(self, step, *a, **k):
        if step == 2:  # die half-way: staging written, nothing renamed yet
            os.makedirs(self.root / ".step_000002.staging999", exist_ok=True)
            (self.root / ".step_000002.staging999" / "model.safetensors").write_bytes(b"x")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, step, *a, **k)
    checkpoint.CheckpointManager.save = save
    train(load_config("quickstart", sys.argv[1:]), progress=False)
""")


def test_kill_minus_9_during_a_checkpoint_save_then_resume(tmp_path):
    out = tmp_path / "killed"
    args = SMOKE + [f"output_dir={out}", "rl.steps=3"]
    res = subprocess.run([sys.executable, "-c", KILLER, *args], capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert (out / "checkpoints" / "step_000001").is_dir()
    assert (out / "checkpoints" / ".step_000002.staging999").exists()
    train(load_config("quickstart", args), resume=True, progress=False)
    assert not (out / "checkpoints" / ".step_000002.staging999").exists()  # cleaned
    assert _rl_steps(out) == [1, 2, 3]
    assert (out / "final" / "model.safetensors").exists()


def test_torn_metrics_line_does_not_swallow_the_next_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "phase": "rl", "x": 1}\n{"step": 2, "phase": "rl", "x"')
    log = MetricsLogger(path)
    log.log(3, "rl", {"x": 3})
    log.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 3]


def test_eval_defaults_to_the_run_config_next_to_the_checkpoint(run, tmp_path, capsys):
    out = tmp_path / "eval.json"
    # no --config: the run's own config.yaml (quickstart smoke: valid_unseen only)
    assert main(["eval", "--checkpoint", str(run / "final"), "--json", str(out)]) == 0
    assert f"config {run / 'config.yaml'}" in capsys.readouterr().out
    assert list(json.loads(out.read_text())) == ["valid_unseen"]
    assert main(["eval", "--checkpoint", str(run / "final"), "--split", "bogus"]) == 2
    assert "this config's splits" in capsys.readouterr().err


def test_trackers_tensorboard_and_wandb_offline_read_back(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLogger(tmp_path / "metrics.jsonl", ["jsonl", "tensorboard", "wandb"],
                        tmp_path, "turngym-test", {"seed": 0})
    for step in (1, 2):
        log.log(step, "rl", {"success_rate": 0.25 * step, "note": "text is skipped"})
    log.log(2, "eval", {"split": "valid_unseen", "success": 0.5})
    log.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("rl/success_rate")] == [0.25, 0.5]
    assert acc.Scalars("eval/success/valid_unseen")[0].value == 0.5
    # wandb >= 0.2x writes an offline run as one protobuf log (run-*.wandb) and no summary
    # file until synced; the metric names and their JSON-encoded values are in that log
    (store,) = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    data = store.read_bytes()
    for key in (b"rl/success_rate", b"eval/success/valid_unseen", b"0.25"):
        assert key in data, key
    assert b"text is skipped" not in data


def test_a_save_killed_between_its_renames_loses_neither_copy(run):
    """Replacing a directory moves the old one aside first (a directory cannot be renamed
    over a non-empty one); killed right after that, the run dir has no final/ and the
    newest checkpoint is only the aside copy.  Resuming puts both back instead of
    deleting them as staging leftovers and falling back to an older checkpoint."""
    from turngym.trainers.run import prepare_run_dir
    ckpts = run / "checkpoints"
    weights = (ckpts / "step_000003" / "model.safetensors").read_bytes()
    os.replace(ckpts / "step_000003", ckpts / ".step_000003.old999")
    os.replace(run / "final", run / ".final.old999")
    (run / ".final.old1").mkdir()  # an older leftover, half deleted: not a checkpoint
    (run / ".final.old1" / "config.json").write_text("{}")
    (ckpts / ".step_000003.staging999").mkdir()  # the half-written replacement
    point = prepare_run_dir(_cfg(run, "rl.steps=4"), resume=True, overwrite=False)
    assert point.step == 3  # not step 2: the newest checkpoint was kept
    assert (ckpts / "step_000003" / "model.safetensors").read_bytes() == weights
    assert (run / "final" / "model.safetensors").exists()
    assert not list(ckpts.glob(".*")) and not list(run.glob(".final*"))
    assert any("restored final/" in n for n in point.notes)
