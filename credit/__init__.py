"""Credit modules: trajectory groups in, per-turn advantages out."""

from . import scoring  # noqa: F401
from . import branch_contrast as _branch_contrast  # noqa: F401  (registers "branch_contrast")
from . import grpo as _grpo  # noqa: F401  (registers "grpo")
from . import info_gain as _info_gain  # noqa: F401  (registers "info_gain")
from . import role_judge as _role_judge  # noqa: F401  (registers "role_judge")
from . import step_groups as _step_groups  # noqa: F401  (registers "step_groups")
from . import td_log_ratio as _td_log_ratio  # noqa: F401  (registers "td_log_ratio")
from .registry import (CreditContext, NoParams, assign_credit, get_estimator, list_estimators,
                       unregister_estimator,
                       make_params, params_class, register_estimator, requirements)
from .scoring import GoldScorer

__all__ = ["CreditContext", "NoParams", "assign_credit", "get_estimator", "list_estimators",
           "make_params", "params_class", "register_estimator", "requirements", "unregister_estimator", "GoldScorer"]
