"""Credit modules: trajectory groups in, per-turn advantages out."""

from . import grpo as _grpo  # noqa: F401  (registers "grpo")
from .registry import (CreditContext, assign_credit, get_estimator, list_estimators,
                       register_estimator)

__all__ = ["CreditContext", "assign_credit", "get_estimator", "list_estimators",
           "register_estimator"]
