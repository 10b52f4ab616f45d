"""Shared run set-up: env factories, rollout settings, quiet libraries, seeding."""

from __future__ import annotations

import random
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..agents.rollout import RolloutConfig


def env_factory(cfg: DictConfig, split: str) -> Callable[[], gym.Env]:
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) or {}
    kwargs = dict(kwargs, **{cfg.env.split_kwarg: split}) if cfg.env.split_kwarg else kwargs
    env_id = cfg.env.id

    def make() -> gym.Env:
        return gym.make(env_id, **kwargs)
    return make


def rollout_config(cfg: DictConfig, *, temperature: float | None = None, greedy: bool = False
                   ) -> RolloutConfig:
    a = cfg.agent
    return RolloutConfig(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens,
                         temperature=a.temperature if temperature is None else temperature,
                         top_p=a.top_p, greedy=greedy, max_context_tokens=a.max_context_tokens,
                         max_invalid_streak=a.max_invalid_streak, require_think=a.require_think,
                         show_admissible=a.show_admissible, action_parser=a.action_parser)


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
