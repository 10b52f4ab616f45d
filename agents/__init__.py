"""Policies, prompting, parsing and the multi-turn rollout loop."""

from .hf_backend import HFPolicy
from .parsing import ParsedAction, parse_action
from .policy import Policy, Sample, SamplingParams
from .prompting import ChatPrompter
from .rollout import EnvPool, RolloutConfig, rollout

__all__ = ["HFPolicy", "ParsedAction", "parse_action", "Policy", "Sample", "SamplingParams",
           "ChatPrompter", "EnvPool", "RolloutConfig", "rollout"]
