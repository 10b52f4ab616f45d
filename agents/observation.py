"""What the agent is shown of an env step: the observation text, plus (optionally)
what the env lists in ``info``: the admissible commands (verl-agent's ALFWorld prompt
does the same) and the inventory (what ALFWorld's ``inventory`` command prints).
Kept separate from the env so the env stays text-only and prompt choices stay
agent-side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ObservationView:
    """What the agent is shown besides the env's text (``agent.show_admissible`` /
    ``agent.show_inventory``): one value shared by rollouts and warm-start demos."""

    admissible: bool = False
    inventory: bool = False

    def render(self, obs: str, info: Mapping[str, Any] | None) -> str:
        return render_observation(obs, info, self.admissible, self.inventory)

    def first(self, obs: str, info: Mapping[str, Any], env: object) -> str:
        """The reset observation as shown; an env lacking what is asked is refused."""
        if self.inventory:
            require_inventory(info, env)
        return self.render(obs, info)


PLAIN_VIEW = ObservationView()  # the env's text alone
