"""ALFWorld's own engine: ``turngym/ALFWorld-v0`` over the user's ALFWorld data, and our
generated tasks written as ALFWorld games for a differential check of our rules.

Needs the optional ``alfworld`` package (``pip install 'turngym[alfworld]'``) to play;
importing this package does not, and a missing data directory is reported without it.
"""

from .env import (
    DOWNLOAD_HINT,
    SPLIT_DIRS,
    TASK_TYPES,
    ALFWorldEnv,
    collect_alfworld_games,
    data_root,
)

__all__ = [
    "DOWNLOAD_HINT",
    "SPLIT_DIRS",
    "TASK_TYPES",
    "ALFWorldEnv",
    "collect_alfworld_games",
    "data_root",
]
