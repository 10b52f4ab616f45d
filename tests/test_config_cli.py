import subprocess
import sys

import pytest
from omegaconf.errors import ConfigKeyError, ValidationError

from turngym.cli import main
from turngym.config import config_path, load_config


def test_bundled_config_and_overrides():
    cfg = load_config("quickstart", ["rl.steps=3", "env.kwargs.max_steps=7"])
    assert cfg.rl.steps == 3 and cfg.env.kwargs.max_steps == 7
    assert cfg.model.kind == "tiny"
    assert config_path("quickstart").name == "quickstart.yaml"


def test_unknown_keys_and_bad_types_fail_clearly():
    with pytest.raises(ConfigKeyError):
        load_config("quickstart", ["rl.stepz=3"])
    with pytest.raises(ValidationError):
        load_config("quickstart", ["rl.steps=many"])
    with pytest.raises(ValueError, match="key=value"):
        load_config("quickstart", ["rl.steps"])
    with pytest.raises(FileNotFoundError, match="bundled configs"):
        load_config("no_such_config")


def test_cli_lists_envs_and_rejects_bad_config(capsys):
    assert main(["envs"]) == 0
    assert "turngym/TextWorld-v0" in capsys.readouterr().out
    assert main(["credits"]) == 0
    assert "grpo" in capsys.readouterr().out
    assert main(["train", "--config", "quickstart", "rl.bogus=1"]) == 2
    assert "bad configuration" in capsys.readouterr().err


def test_console_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "turngym", "envs"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "TextWorld" in out.stdout


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
    monkeypatch.setattr(pipeline, "train", lambda cfg, resume, progress: seen.update(
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
    with pytest.raises(ValueError, match="cycle"):
        load_config(str(a))


@pytest.mark.parametrize("name", ["gpu_search", "gpu_textworld", "gpu_tool_math",
                                  "gpu_tool_shop"])
def test_real_model_gpu_configs_resolve_and_demand_a_model_path(name):
    from turngym.agents.factory import build_model
    cfg = load_config(name)
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
