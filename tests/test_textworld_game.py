"""turngym/TextWorldGame-v0 on real TextWorld games generated offline by ``tw-make``.

Needs ``pip install 'turngym[textworld]'``; skipped with that reason otherwise.
"""

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from turngym.envs.base import HasOracle, HasVocabulary

textworld = pytest.importorskip("textworld", reason="TextWorld games need "
                                "pip install 'turngym[textworld]'")
from turngym.envs.textworld_game import TextWorldGameEnv  # noqa: E402
from turngym.envs.textworld_game.env import CHAIN_REFUSED, META_REFUSED  # noqa: E402


def tw_make(out: Path, *args: str) -> Path:
    exe = shutil.which("tw-make") or str(Path(sys.executable).parent / "tw-make")
    subprocess.run([sys.executable, exe, *args, "--output", str(out)], check=True,
                   capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def simple_game(tmp_path_factory):
    d = tmp_path_factory.mktemp("tw")
    return tw_make(d / "simple.z8", "tw-simple", "--rewards", "dense", "--goal", "detailed",
                   "--seed", "1")


def test_registered_checker_and_capabilities(simple_game):
    env = gym.make("turngym/TextWorldGame-v0", games=str(simple_game))
    check_env(env.unwrapped, skip_render_check=True)
    assert isinstance(env.unwrapped, HasOracle) and isinstance(env.unwrapped, HasVocabulary)
    words = env.unwrapped.vocabulary()
    assert {"milk", "stove", "antique", "trunk", "take"} <= set(words)


def test_reset_is_deterministic_and_info_is_complete(simple_game):
    env = TextWorldGameEnv(games=simple_game)
    obs, info = env.reset(seed=7)  # one game: every seed names game 0
    obs2, info2 = env.reset(seed=0)
    assert obs == obs2 and info == info2
    assert info["task_id"] == "train-0" and info["task_type"].startswith("tw-simple-rDense")
    assert info["max_score"] == 8 and info["score"] == 0 and info["progress"] == ()
    assert "open antique trunk" in info["admissible_commands"]
    assert env.observation_space.contains(obs) and info["state_key"] not in obs
    assert "-= Bedroom =-" in obs and not obs.rstrip().endswith(">")  # prompt line removed
    assert obs.startswith("Hey, thanks for coming over") and "$$" not in obs  # title art
    raw, _ = TextWorldGameEnv(games=simple_game, strip_banner=False).reset(seed=0)
    assert "$$$$" in raw and raw.endswith(obs)


def test_walkthrough_wins_and_score_reward_sums_to_one(simple_game):
    env = TextWorldGameEnv(games=simple_game, reward="score")
    obs, info = env.reset(seed=0)
    total, progress = 0.0, []
    for _ in range(20):
        obs, r, term, trunc, info = env.step(env.oracle_action())
        total += r
        progress.append(len(info["progress"]))
        if term:
            break
    assert info["won"] and term and abs(total - 1.0) < 1e-9
    assert progress == sorted(progress) and progress[-1] == 8  # one entry per point


def test_no_step_after_a_win_or_the_turn_cap(simple_game):
    """As every turngym env: a finished episode refuses further steps (the engine would
    keep paying the win) until reset."""
    env = TextWorldGameEnv(games=simple_game, reward="won")
    env.reset(seed=0)
    term = False
    while not term:
        _, r, term, _, _ = env.step(env.oracle_action())
    assert r == 1.0
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("look")
    env = TextWorldGameEnv(games=simple_game, max_turns=2)
    env.reset(seed=0)
    assert not env.step("look")[3] and env.step("look")[3]  # truncated on the 2nd
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("look")
    env.reset(seed=0)
    assert env.step("look")[0]  # a reset starts over


def test_expert_recovers_from_detours(simple_game):
    env = TextWorldGameEnv(games=simple_game)
    rng = random.Random(3)
    obs, info = env.reset(seed=0)
    for _ in range(60):
        # random detours, except eating: eating the milk loses this game for good
        options = [c for c in info["admissible_commands"] if not c.startswith("eat")]
        a = rng.choice(options) if rng.random() < 0.4 else env.oracle_action()
        obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            break
    assert info["won"] and r == 1.0


def test_replay_reproduces_the_state_exactly(simple_game):
    env = TextWorldGameEnv(games=simple_game)
    rng = random.Random(0)
    obs, info = env.reset(seed=0)
    actions, observations, keys = [], [], []
    for _ in range(15):
        a = rng.choice(info["admissible_commands"] + ["dance", "x trunk", "save", "look"])
        obs, r, term, trunc, info = env.step(a)
        actions.append(a), observations.append(obs), keys.append(info["state_key"])
        if term or trunc:
            break
    other = TextWorldGameEnv(games=simple_game)
    for k in range(len(actions)):
        o, i = other.replay(0, actions[: k + 1])
        assert o == observations[k] and i["state_key"] == keys[k], actions[: k + 1]


def test_commands_that_would_desync_the_tracker_never_reach_the_game(simple_game):
    env = TextWorldGameEnv(games=simple_game)
    obs, info = env.reset(seed=0)
    env.step("open antique trunk")
    before = env.step("look")[4]["state_key"]
    # the game would run both commands while TextWorld's tracker records one
    for attack, refusal in [
        ("take old key from antique trunk. unlock wooden door with old key", CHAIN_REFUSED),
        ("take old key from antique trunk then unlock wooden door with old key", CHAIN_REFUSED),
        ("take all", CHAIN_REFUSED),
        ("save", META_REFUSED), ("restore", META_REFUSED), ("quit", META_REFUSED),
        ("restart", META_REFUSED), ("undo", META_REFUSED),
    ]:
        obs, r, term, trunc, info = env.step(attack)
        assert obs == refusal and not info["valid_action"] and info["state_key"] == before
    # a newline would queue a second command; a NUL byte hangs the interpreter
    t0 = time.perf_counter()
    obs, *_, info = env.step("inventory\nlook")
    obs, *_, info = env.step("\x00")
    assert time.perf_counter() - t0 < 5 and info["state_key"] == before
    obs, *_, info = env.step("inventory")
    assert obs.startswith("You are carrying nothing")  # nothing queued from before
    for _ in range(20):  # still in sync: the expert wins
        obs, r, term, trunc, info = env.step(env.oracle_action())
        if term:
            break
    assert info["won"]


def test_bad_game_sources_are_clear_errors(tmp_path, simple_game):
    with pytest.raises(FileNotFoundError, match="no TextWorld game"):
        TextWorldGameEnv(games=tmp_path / "nothing.z8")
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(simple_game, lone / "g.z8")
    with pytest.raises(FileNotFoundError, match="g.json"):
        TextWorldGameEnv(games=lone)
    with pytest.raises(ValueError, match="no games for split 'valid'"):
        TextWorldGameEnv(games={"train": str(simple_game)}, split="valid")
    with pytest.raises(ValueError, match="needs games="):
        TextWorldGameEnv()
    with pytest.raises(ValueError, match="reward"):
        TextWorldGameEnv(games=simple_game, reward="points")
    shutil.copy(simple_game.with_suffix(".json"), lone / "g.json")
    with pytest.warns(UserWarning, match="same games as every other split"):
        TextWorldGameEnv(games=lone, split="valid")


@pytest.mark.slow
def test_directory_splits_of_several_challenges(tmp_path):
    for split, seeds in (("train", (1, 2)), ("valid", (3,))):
        d = tmp_path / "games" / split
        d.mkdir(parents=True)
        for s in seeds:
            tw_make(d / f"cooking{s}.z8", "tw-cooking", "--recipe", "1", "--take", "1",
                    "--go", "1", "--seed", str(s))
        tw_make(d / f"simple{seeds[0]}.z8", "tw-simple", "--rewards", "sparse", "--goal",
                "brief", "--seed", str(seeds[0]))
    train = TextWorldGameEnv(games=tmp_path / "games", split="train")
    valid = TextWorldGameEnv(games=tmp_path / "games", split="valid")
    assert [g.name for g in train.game_files] == ["cooking1.z8", "cooking2.z8", "simple1.z8"]
    assert len(valid.game_files) == 2
    kinds = set()
    for env, n in ((train, 3), (valid, 2)):
        for seed in range(n):
            obs, info = env.reset(seed=seed)
            kinds.add(info["task_type"].split("-")[1])
            for _ in range(60):
                obs, r, term, trunc, info = env.step(env.oracle_action())
                if term or trunc:
                    break
            assert info["won"], (env.split, seed, info["task_type"])
    assert kinds == {"cooking", "simple"}
