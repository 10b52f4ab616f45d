"""Shared run set-up: env factories, rollout settings, quiet libraries, seeding."""

from __future__ import annotations

import inspect
import random
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..agents.rollout import RolloutConfig
from ..config import env_constructor


def env_factory(cfg: DictConfig, split: str) -> Callable[[], gym.Env]:
    """Builds ``cfg.env.id`` for ``split``.  ``agent.max_turns`` is the one turn limit:
    an env whose constructor takes ``max_turns`` receives it from there."""
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) or {}
    if cfg.env.split_kwarg:
        kwargs = dict(kwargs, **{cfg.env.split_kwarg: split})
    ctor, _ = env_constructor(cfg.env.id)
    if "max_turns" in inspect.signature(ctor).parameters:
        kwargs = dict(kwargs, max_turns=int(cfg.agent.max_turns))
    env_id = cfg.env.id

    def make() -> gym.Env:
        from ..config import ConfigError
        try:
            return gym.make(env_id, **kwargs)
        except (TypeError, ValueError) as exc:  # e.g. env.kwargs.world.min_objects=abc
            raise ConfigError(f"{env_id} could not be built from env.kwargs {kwargs}: "
                              f"{type(exc).__name__}: {exc}") from exc
    return make


def check_env_offers(cfg: DictConfig) -> None:
    """Refuses, before any work, agent options the env cannot serve: constrained decoding
    needs ``info["admissible_commands"]`` (one reset of the training split tells)."""
    if not cfg.agent.constrain_actions:
        return
    from ..agents.constraints import ADMISSIBLE_KEY
    from ..config import ConfigError

    env = env_factory(cfg, cfg.env.train_split)()
    try:
        _, info = env.reset(seed=int(cfg.seed))
    finally:
        env.close()
    if not info.get(ADMISSIBLE_KEY):
        raise ConfigError(f"agent.constrain_actions=true: {cfg.env.id} does not list "
                          f"{ADMISSIBLE_KEY!r} in its info, so there is nothing to choose "
                          "among; set agent.constrain_actions=false (free generation)")


def rollout_config(cfg: DictConfig, *, evaluation: bool = False) -> RolloutConfig:
    """Rollout settings of ``agent`` with the training sampler, or the evaluation one."""
    a = cfg.agent
    s = cfg.eval.sampling if evaluation else a.sampling
    return RolloutConfig(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens,
                         temperature=s.temperature, top_p=s.top_p, greedy=s.greedy,
                         max_context_tokens=a.max_context_tokens,
                         max_invalid_streak=a.max_invalid_streak, require_think=a.require_think,
                         show_admissible=a.show_admissible,
                         show_inventory=a.show_inventory, action_parser=a.action_parser,
                         context_mode=a.context_mode, window_turns=a.window_turns,
                         constrain_actions=a.constrain_actions, action_format=a.action_format)


def quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # pragma: no cover
        pass


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
