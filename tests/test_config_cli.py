import subprocess
import sys

import pytest
from turngym.cli import main
from turngym.config import ConfigError, config_path, load_config


def test_bundled_config_and_overrides():
    cfg = load_config("quickstart", ["rl.steps=3", "env.kwargs.world.min_objects=2"])
    assert cfg.rl.steps == 3 and cfg.env.kwargs.world.min_objects == 2
    assert cfg.model.kind == "tiny"
    assert config_path("quickstart").name == "quickstart.yaml"


def test_unknown_keys_and_bad_types_fail_clearly():
    with pytest.raises(ConfigError, match="stepz"):
        load_config("quickstart", ["rl.stepz=3"])
    with pytest.raises(ConfigError, match="rl.steps"):
        load_config("quickstart", ["rl.steps=many"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config("quickstart", ["rl.steps"])
    with pytest.raises(ConfigError, match="bundled configs"):
        load_config("no_such_config")
    with pytest.raises(ConfigError, match="context_mode"):  # closed choices are enums
        load_config("quickstart", ["agent.context_mode=sometimes"])


def test_whole_config_validated_before_any_work():
    """Every problem at once, before anything runs: credit name, typed credit params,
    env kwargs against the env's constructor, ranges, the one turn limit."""
    with pytest.raises(ConfigError) as e:
        load_config("quickstart", ["rl.credit.name=grpoo", "rl.lr=-1", "rl.group_size=0",
                                   "env.kwargs.wrold={}", "agent.sampling.temperature=nan"])
    msg = str(e.value)
    for part in ("unknown estimator 'grpoo'", "rl.lr must be > 0", "rl.group_size must be > 0",
                 "takes no ['wrold']", "agent.sampling.temperature must be > 0"):
        assert part in msg, (part, msg)
    with pytest.raises(ConfigError, match=r"grpo takes no \['std_normalise'\]"):
        load_config("quickstart", ["rl.credit.params.std_normalise=false"])
    with pytest.raises(ConfigError, match="info_gain"):  # enum-valued param
        load_config("search_igpo", ["rl.credit.params.score=probability"])
    with pytest.raises(ConfigError, match="agent.max_turns"):
        load_config("search_grpo", ["env.kwargs.max_turns=3"])
    with pytest.raises(ConfigError, match="judge.base_url"):
        load_config("textworld_triage", ["rl.credit.params.judge={kind: openai}"])
    ok = load_config("search_igpo", ["rl.credit.params.gamma=0.5"])
    from turngym.credit import make_params
    p = make_params("info_gain", dict(ok.rl.credit.params))
    assert p.gamma == 0.5 and p.score.value == "prob" and p.gold_tokens_only


def test_cli_lists_envs_and_rejects_bad_config(capsys):
    assert main(["envs"]) == 0
    assert "turngym/TextWorld-v0" in capsys.readouterr().out
    assert main(["credits"]) == 0
    assert "grpo" in capsys.readouterr().out
    assert main(["train", "--config", "quickstart", "rl.bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turngym: error:") and "bogus" in err and len(err.splitlines()) == 1
    assert main(["eval", "--checkpoint", "/no/such/model"]) == 2
    assert "no such model directory" in capsys.readouterr().err
    assert main(["train", "--plugin", "no_such_plugin_module"]) == 2
    assert "no_such_plugin_module" in capsys.readouterr().err


def test_console_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "turngym", "envs"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "TextWorld" in out.stdout


def test_a_long_command_writing_to_a_pipe_shows_each_line_when_printed():
    """`turngym compare ... > log &`: the log must show progress while the run is still
    going, not when a block buffer fills or the process ends."""
    import os
    import selectors
    code = ("import time; from turngym.cli import main; main(['credits']); time.sleep(120)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a plain shell's
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout=90), "nothing arrived while the command was still running"
        assert proc.poll() is None  # still sleeping: the line came before the process ended
        assert "grpo" in proc.stdout.readline() + proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()


def test_wheel_installs_only_the_turngym_package(tmp_path):
    """No top-level envs/credit/... module may land in site-packages."""
    import pathlib
    import zipfile
    root = pathlib.Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path), str(root)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    (wheel,) = tmp_path.glob("turngym-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"turngym", next(t for t in tops if t.endswith(".dist-info"))}
    names = zipfile.ZipFile(wheel).namelist()
    for mod in ("envs/textworld/env.py", "agents/rollout.py", "credit/grpo.py",
                "trainers/pipeline.py", "configs/quickstart.yaml", "types.py"):
        assert f"turngym/{mod}" in names


def test_overrides_may_follow_flags(monkeypatch):
    seen = {}
    import turngym.trainers.pipeline as pipeline
    monkeypatch.setattr(pipeline, "train", lambda cfg, resume, progress, overwrite: seen.update(
        cfg=cfg, resume=resume, progress=progress) or {})
    assert main(["train", "rl.steps=4", "--resume", "--no-progress", "rl.lr=0.5"]) == 0
    assert seen["cfg"].rl.steps == 4 and seen["cfg"].rl.lr == 0.5
    assert seen["resume"] and not seen["progress"]
    with pytest.raises(SystemExit):
        main(["envs", "--bogus"])


def test_config_inheritance_with_base(tmp_path):
    cfg = load_config("search_igpo", ["rl.credit.params.gamma=0.5"])
    assert cfg.env.id == "turngym/SearchQA-v0" and cfg.agent.action_parser == "raw"
    assert cfg.rl.credit.name == "info_gain" and cfg.rl.credit.params.gamma == 0.5
    assert cfg.output_dir == "runs/search_igpo"
    assert load_config("textworld_gigpo").env.id == "turngym/TextWorld-v0"
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"base: {b}\nseed: 1\n")
    b.write_text(f"base: {a}\nseed: 2\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(str(a))



def test_a_config_path_is_a_path_and_base_is_read_from_the_including_file(tmp_path,
                                                                           monkeypatch):
    """A user's sub/child.yaml saying ``base: quickstart.yaml`` means sub/quickstart.yaml
    wherever it is run from; a path that does not exist is an error, never the bundled
    config of the same name (both silently loaded the bundled quickstart)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "quickstart.yaml").write_text("base: quickstart\nrl:\n  steps: 7\n")
    (sub / "child.yaml").write_text("base: quickstart.yaml\nseed: 3\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("sub/child.yaml")
    assert (cfg.rl.steps, cfg.seed) == (7, 3)
    for missing in (str(tmp_path / "nothere" / "quickstart.yaml"), "quickstart.yml"):
        with pytest.raises(ConfigError, match="no config file"):
            load_config(missing)


@pytest.mark.parametrize("overrides,why", [
    (["output_dir=@x"], "override 'output_dir=@x': the value is not valid YAML"),
    (["rl.lr=1e-3", "rl.steps=["], "override 'rl.steps=['"),
    (["plugins=[1]"], "plugins must be a list of module names"),
    (["logging.trackers=[[1]]"], "unknown tracker [1]"),
    (["model.num_heads=0"], "model.num_heads must be > 0"),
])
def test_malformed_overrides_exit_2_with_one_message_not_a_traceback(overrides, why, capsys):
    assert main(["train", "--no-progress", *overrides]) == 2
    assert why in capsys.readouterr().err


def test_env_kwargs_of_the_wrong_type_are_a_config_error(tmp_path):
    from turngym.trainers.runtime import env_factory
    cfg = load_config("quickstart", ["env.kwargs.world.min_objects=abc"])
    with pytest.raises(ConfigError, match="could not be built from env.kwargs"):
        env_factory(cfg, "train")()


@pytest.mark.parametrize("name", ["gpu_search", "gpu_textworld", "gpu_tool_math",
                                  "gpu_tool_shop"])
def test_real_model_gpu_configs_resolve_and_demand_a_model_path(name):
    from turngym.agents.factory import build_model
    with pytest.raises(ConfigError, match="needs model.path"):
        load_config(name)
    cfg = load_config(name, validate_now=False)
    assert cfg.model.kind == "hf" and cfg.agent.backend == "vllm"
    assert cfg.model.autocast == "bfloat16" and cfg.model.gradient_checkpointing
    assert cfg.rl.recompute_logprobs  # vLLM numerics never enter the importance ratio
    import gymnasium as gym
    kwargs = dict(cfg.env.kwargs)
    if "retriever" in kwargs:  # BM25 instead of a 70 s dense index build on the full wiki
        kwargs["retriever"] = {"kind": "bm25"}
    env = gym.make(cfg.env.id, **kwargs)  # the env part is real and builds
    env.close()
    with pytest.raises(ValueError, match="needs model.path"):
        build_model(cfg.model)


def test_results_records_are_written_whole_and_replacing_one_is_said(tmp_path, capsys):
    from turngym.cli import _publish
    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG one")
    rec = tmp_path / "docs" / "results" / "compare_x.json"
    _publish(rec, '{"a": 1}', png)
    assert rec.read_text() == '{"a": 1}' and rec.with_suffix(".png").read_bytes() == png.read_bytes()
    assert capsys.readouterr().out.strip() == f"written {rec}"
    _publish(rec, '{"a": 2}')
    assert rec.read_text() == '{"a": 2}'
    assert capsys.readouterr().out.strip() == f"replaced {rec}"
    assert sorted(p.name for p in rec.parent.iterdir()) == ["compare_x.json", "compare_x.png"]
