"""Text environments, registered with gymnasium under the ``turngym/`` namespace.

Registration uses gymnasium's own registry with ``"module:Class"`` entry points,
so ``gymnasium.make("turngym/TextWorld-v0")`` works after ``import turngym``.
"""

from __future__ import annotations

import gymnasium as gym

from .base import TextEnv

ENV_SPECS: dict[str, dict] = {
    "turngym/TextWorld-v0": {
        "entry_point": "turngym.envs.textworld.env:TextWorldEnv",
        "max_episode_steps": None,  # the env's own max_turns truncates (one source)
        "description": "ALFWorld-like household tasks (6 task types, seen/unseen layouts)",
    },
    "turngym/TextWorldGame-v0": {
        "entry_point": "turngym.envs.textworld_game.env:TextWorldGameEnv",
        "max_episode_steps": None,  # the env's own max_turns truncates
        "description": "any TextWorld game (tw-make .z8/.ulx, or a directory as a split); "
                       "extra [textworld]",
    },
    "turngym/ALFWorld-v0": {
        "entry_point": "turngym.envs.alfworld.env:ALFWorldEnv",
        "max_episode_steps": None,
        "description": "ALFWorld's own text engine over $ALFWORLD_DATA (train / valid_seen / "
                       "valid_unseen); extra [alfworld]",
    },
    "turngym/SearchQA-v0": {
        "entry_point": "turngym.envs.search.env:SearchQAEnv",
        "max_episode_steps": None,  # the env's own max_turns truncates
        "description": "Search-R1 style multi-hop QA over a FAISS/BM25 retriever (bundled wiki)",
    },
    "turngym/ToolMath-v0": {
        "entry_point": "turngym.envs.tools.math_env:ToolMathEnv",
        "max_episode_steps": None,
        "description": "word problems with calculator + sandboxed Python tools (Hermes calls)",
    },
    "turngym/ToolShop-v0": {
        "entry_point": "turngym.envs.tools.shop_env:ToolShopEnv",
        "max_episode_steps": None,
        "description": "tau-bench style retail back office; reward iff final DB == gold DB",
    },
}


def register_all() -> None:
    """Registers every bundled env (idempotent)."""
    for env_id, spec in ENV_SPECS.items():
        if env_id in gym.registry:
            continue
        gym.register(id=env_id, entry_point=spec["entry_point"],
                     max_episode_steps=spec.get("max_episode_steps"),
                     disable_env_checker=False)


def list_envs() -> list[tuple[str, str]]:
    return [(k, v.get("description", "")) for k, v in ENV_SPECS.items()]


register_all()

__all__ = ["TextEnv", "ENV_SPECS", "register_all", "list_envs"]
