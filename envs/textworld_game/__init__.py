"""Any TextWorld game (``tw-make`` output) as ``turngym/TextWorldGame-v0``.

Needs the optional ``textworld`` package (``pip install 'turngym[textworld]'``); importing
this package does not.
"""

from .env import GameEnv, TextWorldGameEnv, clean_command, clean_feedback, collect_games

__all__ = ["GameEnv", "TextWorldGameEnv", "clean_command", "clean_feedback", "collect_games"]
