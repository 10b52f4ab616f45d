"""Typed configuration: dataclass schema + YAML file + CLI dot-overrides (omegaconf).

``load_config("quickstart", ["rl.steps=10"])`` finds ``configs/quickstart.yaml``
(a bundled name or a path), merges it onto the schema, applies overrides and
validates the whole config before anything runs: unknown keys, wrong types and
closed choices (enums) are refused by omegaconf; ranges, the credit estimator and
its typed params, and the env id and kwargs by :func:`validate`.  Every problem is
reported at once, as one :class:`ConfigError`.
"""

from __future__ import annotations

import enum
import inspect
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .types import ContextMode


class ConfigError(ValueError):
    """A configuration that cannot run; the message lists every problem found."""


# ---------------------------------------------------------------------- closed choices
class ModelKind(str, enum.Enum):
    tiny = "tiny"  # word-level tokenizer + small Llama built in code (CPU default)
    hf = "hf"  # a local Hugging Face model directory (model.path)


class Dtype(str, enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Backend(str, enum.Enum):
    hf = "hf"  # transformers, CPU or GPU, KV sessions across turns
    vllm = "vllm"  # a colocated vLLM engine, synced after every update


class LossAgg(str, enum.Enum):
    token_mean = "token_mean"
    seq_mean_token_mean = "seq_mean_token_mean"


class DataParallel(str, enum.Enum):
    replicate = "replicate"  # weights, grads and Adam state on every rank; grads summed
    fsdp = "fsdp"  # FSDP2: all three sharded over the ranks


class Tracker(str, enum.Enum):
    jsonl = "jsonl"  # always on: metrics.jsonl
    tensorboard = "tensorboard"
    wandb = "wandb"


# ---------------------------------------------------------------------- schema
@dataclass
class EnvConfig:
    id: str = "turngym/TextWorld-v0"
    kwargs: dict = field(default_factory=dict)
    train_split: str = "train"
    eval_splits: list = field(default_factory=lambda: ["valid_seen", "valid_unseen"])
    split_kwarg: str = "split"


@dataclass
class ModelConfig:
    kind: ModelKind = ModelKind.tiny
    path: Optional[str] = None  # HF model dir (kind=hf) or a turngym checkpoint
    gguf_file: Optional[str] = None
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: Optional[int] = None
    max_positions: int = 2048
    fuse_entities: bool = True  # tiny tokenizer: "cabinet 1" is one token
    dtype: Dtype = Dtype.float32  # weights
    device: str = "cpu"  # cpu | cuda | cuda:N (under torchrun: cuda:<local_rank>)
    autocast: Optional[Dtype] = None  # bfloat16 | float16: mixed precision in SFT/RL forwards
    gradient_checkpointing: bool = False


@dataclass
class VLLMConfig:
    """Engine settings for ``agent.backend=vllm`` (colocated with the trainer)."""
    dtype: Dtype = Dtype.bfloat16
    gpu_memory_utilization: float = 0.35
    enable_prefix_caching: bool = True
    enable_sleep_mode: bool = False  # offload weights / drop KV while the trainer updates
    max_model_len: Optional[int] = None
    enforce_eager: bool = False
    engine_kwargs: dict = field(default_factory=dict)  # any other vllm.EngineArgs


@dataclass
class SamplingConfig:
    """How actions are sampled (training rollouts: ``agent.sampling``; evaluation:
    ``eval.sampling``)."""
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


@dataclass
class AgentConfig:
    system_prompt: str = ("You are a household agent. Act with one command per turn as "
                          "<action> command </action> .")
    action_format: str = "<action> {action} </action>"
    # THE turn limit: rollouts, evaluation and warm-start demos; envs whose constructor
    # takes ``max_turns`` receive it from here (so env.kwargs must not set it)
    max_turns: int = 50
    max_new_tokens: int = 24
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_context_tokens: int = 2048
    # full: one growing context; window: each turn sees the task + the last
    # ``window_turns`` turns + the current observation (one training row per turn)
    context_mode: ContextMode = ContextMode.FULL
    window_turns: int = 4
    max_invalid_streak: int = 0
    require_think: bool = False
    show_admissible: bool = False
    show_inventory: bool = False  # append the env's info["inventory"] (what the agent holds)
    # sample each response only among the env's info["admissible_commands"] written in
    # action_format (+ stop token): no malformed or impossible action (agents.constraints)
    constrain_actions: bool = False
    action_parser: str = "action_tag"  # a name in agents.parsing.PARSERS
    max_batch_size: int = 64
    backend: Backend = Backend.hf
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class WarmstartConfig:
    enabled: bool = True
    num_demos: int = 1000
    epsilon: float = 0.2  # random admissible action
    corrupt: float = 0.0  # corrupted (usually invalid) expert action
    train_on_noise: bool = False  # imitate injected actions too (else loss mask 0)
    epochs: int = 3
    lr: float = 3e-3
    weight_decay: float = 0.0
    batch_size: int = 32
    token_budget: int = 16384
    warmup_steps: int = 20
    # language-model passes over the env's own text (HasLMCorpus, e.g. the search
    # corpus) before the demos: every word embedding gets trained, not only those the
    # demos happen to show, which tiny word-level models need to copy unseen names
    lm_epochs: int = 0
    lm_row_tokens: int = 256
    # true: the corpus rows join the demo rows in every SFT epoch instead (the names stay
    # trained while the demos' softmax pushes unused ones down; lm_epochs is then unused)
    lm_mix: bool = False
    # probability that a demonstration is replaced by a consistently renamed copy
    # (HasRenaming, e.g. the text world: receptacle types and name numbers permuted),
    # so every name the env can print is an action target: a tiny model then copies
    # the names the observation prints instead of memorising the seen layouts' names
    rename: float = 0.0
    # DAgger-style round after SFT (HasOracle): the warm-started policy plays this many
    # training episodes (the training sampler); each gives a demo that replays a random
    # prefix of the learner's actions (masked) and lets the expert finish from there.
    # Then ``rollin_epochs`` SFT epochs over those demos plus as many of the originals.
    rollin: int = 0
    rollin_epochs: int = 1


@dataclass
class CreditConfig:
    name: str = "grpo"
    params: dict = field(default_factory=dict)  # checked against the estimator's dataclass


@dataclass
class LoraConfig:
    """LoRA adapters for the RL phase (needs peft: ``pip install 'turngym[lora]'``)."""
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list = field(default_factory=list)  # [] = every linear layer


@dataclass
class RLConfig:
    steps: int = 50
    tasks_per_step: int = 8
    group_size: int = 8
    task_pool: Optional[int] = None  # sample train tasks from [0, task_pool); None = fresh
    lr: float = 1e-4
    weight_decay: float = 0.0
    ppo_epochs: int = 1
    minibatches: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    grad_clip: float = 1.0
    token_budget: int = 32768
    loss_agg: LossAgg = LossAgg.token_mean
    recompute_logprobs: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)
    data_parallel: DataParallel = DataParallel.replicate
    credit: CreditConfig = field(default_factory=CreditConfig)


@dataclass
class EvalConfig:
    num_tasks: int = 60
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    every: int = 0  # RL steps between evals (0: only before and after RL)
    seed_offset: int = 0
    # episodes per task (independent samples; a task's success is their mean): more
    # samples per task when the task set is small, e.g. a fixed training pool
    samples_per_task: int = 1


@dataclass
class CheckpointConfig:
    every: int = 10
    keep: int = 2


@dataclass
class LoggingConfig:
    trackers: list = field(default_factory=lambda: ["jsonl"])  # + tensorboard, wandb
    project: str = "turngym"  # wandb project (offline unless WANDB_MODE says otherwise)
    samples_per_step: int = 2  # trajectory groups kept per RL step for `turngym view`
    samples_max_mb: float = 20.0  # cap on samples.jsonl per run


@dataclass
class TrainConfig:
    seed: int = 0
    output_dir: str = "runs/default"
    threads: int = 2
    plugins: list = field(default_factory=list)  # modules imported first (custom envs/credit)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# ---------------------------------------------------------------------- loading
def _is_path(name: str) -> bool:
    return Path(name).suffix in (".yaml", ".yml") or "/" in name or os.sep in name


def config_path(name: str, relative_to: Path | None = None) -> Path:
    """A bundled config name (``quickstart``) or a path to a YAML file (relative to
    ``relative_to``, the directory of the config that names it, if given).  A path that
    does not exist is an error, never a bundled config of the same name."""
    if _is_path(name):
        p = Path(name)
        if relative_to is not None and not p.is_absolute():
            p = relative_to / p
        if not p.is_file():
            raise ConfigError(f"no config file {str(p)!r}")
        return p
    bundled = resources.files("turngym.configs").joinpath(f"{name}.yaml")
    if bundled.is_file():
        return Path(str(bundled))
    names = sorted(x.name[:-5] for x in resources.files("turngym.configs").iterdir()
                   if x.name.endswith(".yaml"))
    raise ConfigError(f"no config {name!r}: bundled configs are {names} (or give a path to "
                      "a .yaml file)")


def _load_yaml(name: str, seen: tuple[str, ...] = (), relative_to: Path | None = None
               ) -> DictConfig:
    """A YAML config; ``base: other`` in it first loads ``other`` (a bundled name, or a
    path relative to this file) and merges this file on top, so variants state only what
    differs."""
    path = config_path(name, relative_to).resolve()
    if str(path) in seen:
        raise ConfigError(f"config inheritance cycle: {' -> '.join(seen + (str(path),))}")
    raw = OmegaConf.load(path)
    base = raw.pop("base", None) if isinstance(raw, DictConfig) else None
    if base is None:
        return raw
    return _merge_layer(_load_yaml(str(base), seen + (str(path),), path.parent), raw)


def _env_id(cfg) -> str | None:
    env = cfg.get("env") if isinstance(cfg, DictConfig) else None
    return env.get("id") if isinstance(env, DictConfig) else None


def _merge_layer(lower: DictConfig, upper: DictConfig) -> DictConfig:
    """``upper`` on ``lower``; env kwargs belong to their env, so a layer that names
    another env id starts from its own kwargs instead of merging the other env's."""
    new_id = _env_id(upper)
    if new_id is not None and new_id != _env_id(lower):
        lower = OmegaConf.merge(lower, {})
        if isinstance(lower.get("env"), DictConfig) and "kwargs" in lower.env:
            lower.env.kwargs = {}
    return OmegaConf.merge(lower, upper)


def load_config(name: str | None = None, overrides: Sequence[str] = (),
                validate_now: bool = True, training: bool = True) -> DictConfig:
    """Schema <- YAML <- overrides, then :func:`validate` (unless ``validate_now=False``;
    ``training=False`` -- evaluation only -- skips the checks that concern the trainer)."""
    cfg = OmegaConf.structured(TrainConfig)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"overrides must look like key=value, got {bad}")
    try:
        if name is not None:
            cfg = _merge_layer(cfg, _load_yaml(name))
        if overrides:
            cfg = _merge_layer(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from None
    except yaml.YAMLError:  # an override whose value is no YAML (output_dir=@x)
        raise ConfigError(_yaml_override_message(overrides)) from None
    if validate_now:
        validate(cfg, training)
    return cfg


def _yaml_override_message(overrides: Sequence[str]) -> str:
    """Names the first override whose value YAML cannot read, and how to quote it."""
    for o in overrides:
        try:
            OmegaConf.from_dotlist([o])
        except yaml.YAMLError as exc:
            key = o.split("=", 1)[0]
            return (f"override {o!r}: the value is not valid YAML ({str(exc).splitlines()[0]}); "
                    f"quote it, e.g. {key}='\"...\"'")
    return "an override is not valid YAML"


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    key = getattr(exc, "full_key", None)
    head = lines[0] if lines else type(exc).__name__
    return f"{key}: {head}" if key and key not in head else head


def to_dict(cfg: Any) -> dict:
    """Plain containers (enums as their values), e.g. for YAML/JSON dumps."""
    if not isinstance(cfg, DictConfig):
        return dict(cfg)
    return _plain(OmegaConf.to_container(cfg, resolve=True))


def _plain(x):
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))


# ---------------------------------------------------------------------- validation
def import_plugins(modules: Sequence[str]) -> None:
    """Imports plugin modules (custom envs / estimators register themselves on import)
    and every ``turngym.plugins`` entry point."""
    import importlib
    from importlib.metadata import entry_points

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugin module {name!r} could not be imported: {exc}") from None
    for ep in entry_points(group="turngym.plugins"):
        ep.load()


def validate(cfg: DictConfig, training: bool = True) -> None:
    """Every check that can run before work starts; raises one ConfigError listing all
    problems.  ``training=False`` (evaluating a checkpoint) skips the sampler-vs-trainer
    numerics check, which only matters for the PPO ratio."""
    bad = [m for m in cfg.plugins if not isinstance(m, str)]
    if bad:
        raise ConfigError(f"plugins must be a list of module names (strings), got {bad}")
    import_plugins(list(cfg.plugins))
    errors: list[str] = []
    _check_ranges(cfg, errors)
    _check_credit(cfg, errors)
    _check_env(cfg, errors)
    _check_agent(cfg, errors, training)
    if errors:
        raise ConfigError("\n  ".join(["invalid configuration:"] + errors))


def _positive(errors: list[str], cfg: DictConfig, keys: Sequence[str], zero_ok: bool = False):
    for key in keys:
        v = OmegaConf.select(cfg, key)
        if v is None:
            continue
        bad = (v < 0) if zero_ok else (v <= 0)
        if bad or (isinstance(v, float) and not math.isfinite(v)):
            errors.append(f"{key} must be {'>= 0' if zero_ok else '> 0'}, got {v}")


def sampling_errors(s, key: str) -> list[str]:
    """What is wrong with a :class:`SamplingConfig` found at ``key`` (empty when fine)."""
    errors = []
    if not s.greedy and not (math.isfinite(s.temperature) and s.temperature > 0):
        errors.append(f"{key}.temperature must be > 0 when sampling "
                      f"(or set {key}.greedy=true), got {s.temperature}")
    if not (0 < s.top_p <= 1):
        errors.append(f"{key}.top_p must be in (0, 1], got {s.top_p}")
    return errors


def _check_ranges(cfg: DictConfig, errors: list[str]) -> None:
    _positive(errors, cfg, ["threads", "model.hidden_size", "model.num_layers", "model.num_heads",
                            "model.max_positions", "agent.max_turns", "agent.max_new_tokens",
                            "agent.max_context_tokens", "agent.window_turns",
                            "agent.max_batch_size", "warmstart.num_demos", "warmstart.lr",
                            "warmstart.batch_size", "warmstart.token_budget",
                            "warmstart.rollin_epochs", "rl.tasks_per_step",
                            "rl.group_size", "rl.lr", "rl.ppo_epochs", "rl.minibatches",
                            "rl.grad_clip", "rl.token_budget", "eval.num_tasks",
                            "eval.samples_per_task",
                            "checkpoint.keep", "logging.samples_max_mb"])
    _positive(errors, cfg, ["seed", "rl.steps", "warmstart.epochs", "warmstart.lm_epochs",
                            "warmstart.epsilon", "warmstart.corrupt", "warmstart.weight_decay",
                            "warmstart.warmup_steps", "warmstart.rename", "warmstart.rollin",
                            "rl.weight_decay",
                            "rl.clip_low", "rl.clip_high", "rl.kl_coef", "rl.entropy_coef", "eval.every",
                            "eval.seed_offset", "checkpoint.every", "logging.samples_per_step",
                            "agent.max_invalid_streak"], zero_ok=True)
    for key in ("agent.sampling", "eval.sampling"):
        errors += sampling_errors(OmegaConf.select(cfg, key), key)
    if cfg.warmstart.epsilon + cfg.warmstart.corrupt > 1:
        errors.append("warmstart.epsilon + warmstart.corrupt must be <= 1")
    if cfg.warmstart.rename > 1:
        errors.append(f"warmstart.rename must be in [0, 1], got {cfg.warmstart.rename}")
    if cfg.warmstart.rollin > 0 and not cfg.warmstart.enabled:
        errors.append("warmstart.rollin > 0 needs warmstart.enabled (the round follows the SFT)")
    if cfg.rl.clip_low >= 1:
        errors.append(f"rl.clip_low must be < 1, got {cfg.rl.clip_low}")
    if cfg.rl.task_pool is not None and cfg.rl.task_pool <= 0:
        errors.append(f"rl.task_pool must be > 0 or null, got {cfg.rl.task_pool}")
    if cfg.model.kind is ModelKind.hf and not cfg.model.path:
        errors.append("model.kind=hf needs model.path (a local model directory)")
    if (cfg.model.kind is ModelKind.tiny and cfg.model.num_heads > 0
            and cfg.model.hidden_size % cfg.model.num_heads):
        errors.append("model.hidden_size must be divisible by model.num_heads")
    for t in cfg.logging.trackers:
        if not isinstance(t, str) or t not in {x.value for x in Tracker}:
            errors.append(f"logging.trackers: unknown tracker {t!r}; "
                          f"choose from {[x.value for x in Tracker]}")
    if not cfg.env.eval_splits:
        errors.append("env.eval_splits must name at least one split")


def _check_credit(cfg: DictConfig, errors: list[str]) -> None:
    from . import credit

    name = cfg.rl.credit.name
    if name not in credit.list_estimators():
        errors.append(f"rl.credit.name: unknown estimator {name!r}; registered: "
                      f"{credit.list_estimators()}")
        return
    params = OmegaConf.to_container(cfg.rl.credit.params, resolve=True) or {}
    try:
        credit.make_params(name, params)
    except ValueError as exc:
        errors.append(f"rl.credit.params: {exc}")


def env_constructor(env_id: str):
    """The class (or callable) gymnasium builds ``env_id`` from."""
    import gymnasium as gym

    from . import envs  # noqa: F401  (registers turngym/*)

    try:
        spec = gym.spec(env_id)
    except Exception as exc:
        raise ConfigError(f"env.id: {exc}") from None
    entry = spec.entry_point
    if callable(entry):
        return entry, spec
    mod, _, attr = str(entry).partition(":")
    import importlib
    return getattr(importlib.import_module(mod), attr), spec


def _check_env(cfg: DictConfig, errors: list[str]) -> None:
    try:
        ctor, spec = env_constructor(cfg.env.id)
    except ConfigError as exc:
        errors.append(str(exc))
        return
    params = inspect.signature(ctor).parameters
    open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given = dict(OmegaConf.to_container(cfg.env.kwargs, resolve=True) or {})
    if cfg.env.split_kwarg:
        if cfg.env.split_kwarg in given:
            errors.append(f"env.kwargs.{cfg.env.split_kwarg}: the split comes from "
                          "env.train_split / env.eval_splits")
        given[cfg.env.split_kwarg] = cfg.env.train_split
    if "max_turns" in given and "max_turns" in params:
        errors.append("env.kwargs.max_turns: the turn limit is agent.max_turns "
                      "(the env receives it from there)")
    if not open_kwargs:
        known = [p for p in params if p != "self"]
        unknown = sorted(set(given) - set(known))
        if unknown:
            errors.append(f"env.kwargs: {cfg.env.id} takes no {unknown}; it takes {known}")


def _check_agent(cfg: DictConfig, errors: list[str], training: bool = True) -> None:
    from .agents.parsing import PARSERS

    if cfg.agent.action_parser not in PARSERS:
        errors.append(f"agent.action_parser: unknown parser {cfg.agent.action_parser!r}; "
                      f"registered: {sorted(PARSERS)}")
    try:
        cfg.agent.action_format.format(action="x")
    except (KeyError, IndexError, ValueError):
        errors.append("agent.action_format must contain {action} and no other field")
    if cfg.agent.backend is Backend.vllm and training:
        from .agents.vllm_backend import check_compatible
        try:
            check_compatible(cfg)
        except ValueError as exc:
            errors.append(str(exc))
    if cfg.agent.max_new_tokens >= cfg.agent.max_context_tokens:
        errors.append("agent.max_new_tokens must be below agent.max_context_tokens")
    if cfg.agent.constrain_actions and cfg.agent.require_think:
        errors.append("agent.constrain_actions with agent.require_think: a constrained response "
                      "is exactly one admissible command, so it can hold no <think> block")
    if training and cfg.rl.steps > 0 and cfg.agent.sampling.greedy:
        errors.append("agent.sampling.greedy with rl.steps > 0: RL needs sampled rollouts (every "
                      "episode of a group would be the same); set a temperature instead")
    if (training and cfg.rl.steps > 0 and not cfg.rl.recompute_logprobs
            and cfg.agent.sampling.top_p < 1):
        errors.append("agent.sampling.top_p < 1 with rl.recompute_logprobs=false: the rollout's "
                      "log-probs are of the top-p-truncated distribution, which the trainer "
                      "does not apply, so every PPO ratio would be off on truncated steps. Set "
                      "rl.recompute_logprobs=true or agent.sampling.top_p=1")
