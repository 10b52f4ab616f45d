"""What the agent is shown of an env step: the observation text, plus (optionally)
the admissible commands the env lists in ``info`` — verl-agent's ALFWorld prompt
does the same.  Kept separate from the env so the env stays text-only and
prompt choices stay agent-side.
"""

from __future__ import annotations

from typing import Any, Mapping


def render_observation(obs: str, info: Mapping[str, Any] | None, show_admissible: bool) -> str:
    if not show_admissible or not info:
        return obs
    cmds = info.get("admissible_commands")
    if not cmds:
        return obs
    return f"{obs}\nAdmissible: " + " | ".join(cmds)
