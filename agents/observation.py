"""What the agent is shown of an env step: the observation text, plus (optionally)
what the env lists in ``info``: the admissible commands (verl-agent's ALFWorld prompt
does the same) and the inventory (what ALFWorld's ``inventory`` command prints).
Kept separate from the env so the env stays text-only and prompt choices stay
agent-side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

INVENTORY_KEY = "inventory"


def render_observation(obs: str, info: Mapping[str, Any] | None, show_admissible: bool = False,
                       show_inventory: bool = False) -> str:
    if not info:
        return obs
    if show_inventory and info.get(INVENTORY_KEY):
        obs = f"{obs}\n{info[INVENTORY_KEY]}"
    if show_admissible and info.get("admissible_commands"):
        obs = f"{obs}\nAdmissible: " + " | ".join(info["admissible_commands"])
    return obs


def require_inventory(info: Mapping[str, Any], env: object) -> None:
    """``agent.show_inventory`` needs an env that says what the agent holds: refuse
    at the first reset rather than silently showing nothing."""
    if INVENTORY_KEY not in info:
        raise ValueError(f"agent.show_inventory needs an env whose info carries "
                         f"{INVENTORY_KEY!r} (the text world does); "
                         f"{type(getattr(env, 'unwrapped', env)).__name__} does not")
