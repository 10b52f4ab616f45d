"""gymnasium contract: registry, check_env, determinism, replay, snapshot/restore."""

import random

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401  (registers envs)
from turngym.envs.textworld import TextWorldEnv


def test_registered_and_checker_passes():
    env = gym.make("turngym/TextWorld-v0")
    # one turn limit: the env's own max_turns (ALFWorld's 50), no second TimeLimit wrapper
    assert env.spec.max_episode_steps is None and env.unwrapped.max_turns == 50
    check_env(env.unwrapped, skip_render_check=True)
    short = gym.make("turngym/TextWorld-v0", max_turns=2)
    short.reset(seed=0)
    short.step("look")
    assert short.step("look")[3]  # truncated at the env's own limit


def test_reset_is_deterministic_and_privileged_info_stays_out():
    env = TextWorldEnv()
    o1, i1 = env.reset(seed=11)
    o2, i2 = env.reset(seed=11)
    assert o1 == o2 and i1["state_key"] == i2["state_key"]
    assert env.observation_space.contains(o1)
    for key in ("state_key", "task_type"):
        assert i1[key] not in o1
    assert "admissible" not in o1.lower()


def test_replay_reproduces_state_exactly():
    env = TextWorldEnv(split="valid_unseen")
    rng = random.Random(0)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        actions, keys, observations = [], [], []
        for _ in range(15):
            a = rng.choice(info["admissible_commands"] + ["nonsense"])
            obs, r, term, trunc, info = env.step(a)
            actions.append(a)
            keys.append(info["state_key"])
            observations.append(obs)
            if term or trunc:
                break
        other = TextWorldEnv(split="valid_unseen")
        for k in range(len(actions)):
            obs_k, info_k = other.replay(seed, actions[: k + 1])
            assert obs_k == observations[k] and info_k["state_key"] == keys[k]


def test_snapshot_restore_matches_replay():
    env = TextWorldEnv()
    _, info = env.reset(seed=3)
    env.step(info["admissible_commands"][0])
    snap = env.snapshot()
    obs_a, *_ , info_a = env.step("look")
    env.step(env.unwrapped.oracle_action())
    env.restore(snap)
    obs_b, *_, info_b = env.step("look")
    assert obs_a == obs_b and info_a["state_key"] == info_b["state_key"]


def test_step_limit_truncates_and_reward_is_zero():
    env = gym.make("turngym/TextWorld-v0", max_turns=5)
    env.reset(seed=0)
    for k in range(5):
        obs, r, term, trunc, info = env.step("look")
        assert r == 0.0 and not term
    assert trunc


def test_default_limit_is_fifty_steps():
    env = gym.make("turngym/TextWorld-v0")
    env.reset(seed=0)
    n = 0
    while True:
        n += 1
        *_, term, trunc, _ = env.step("inventory")
        if term or trunc:
            break
    assert n == 50 and trunc


def test_oracle_episode_gets_reward_one():
    env = gym.make("turngym/TextWorld-v0")
    env.reset(seed=5)
    total, term = 0.0, False
    while not term:
        _, r, term, trunc, info = env.step(env.unwrapped.oracle_action())
        total += r
        assert not trunc
    assert total == 1.0 and info["won"]


def test_bad_constructor_arguments_fail_clearly():
    with pytest.raises(ValueError, match="split"):
        TextWorldEnv(split="nope")
    with pytest.raises(ValueError, match="unknown world options"):
        TextWorldEnv(world={"rooms": 3})
    env = TextWorldEnv()
    with pytest.raises(RuntimeError):
        env.step("look")
