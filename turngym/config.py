"""Typed configuration: dataclass schema + YAML file + CLI dot-overrides (omegaconf).

``load_config("quickstart", ["rl.steps=10"])`` finds ``configs/quickstart.yaml``
(a bundled name or a path), merges it onto the schema and applies overrides.
Unknown keys and wrongly typed values fail with omegaconf's clear message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf


@dataclass
class EnvConfig:
    id: str = "turngym/TextWorld-v0"
    kwargs: dict = field(default_factory=dict)
    train_split: str = "train"
    eval_splits: list = field(default_factory=lambda: ["valid_seen", "valid_unseen"])
    split_kwarg: str = "split"


@dataclass
class ModelConfig:
    kind: str = "tiny"  # tiny | hf
    path: Optional[str] = None  # HF model dir (kind=hf) or a turngym checkpoint
    gguf_file: Optional[str] = None
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: Optional[int] = None
    max_positions: int = 2048
    fuse_entities: bool = True  # tiny tokenizer: "cabinet 1" is one token
    dtype: str = "float32"  # weights: float32 | bfloat16 | float16
    device: str = "cpu"  # cpu | cuda (under torchrun: cuda:<local_rank> automatically)
    autocast: Optional[str] = None  # bfloat16 | float16: mixed precision in SFT/RL forwards
    gradient_checkpointing: bool = False


@dataclass
class VLLMConfig:
    """Engine settings for ``agent.backend=vllm`` (colocated with the trainer)."""
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.35
    enable_prefix_caching: bool = True
    enable_sleep_mode: bool = False  # offload weights / drop KV while the trainer updates
    max_model_len: Optional[int] = None
    enforce_eager: bool = False
    engine_kwargs: dict = field(default_factory=dict)  # any other vllm.EngineArgs


@dataclass
class AgentConfig:
    system_prompt: str = ("You are a household agent. Act with one command per turn as "
                          "<action> command </action> .")
    action_format: str = "<action> {action} </action>"
    max_turns: int = 50
    max_new_tokens: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    max_context_tokens: int = 2048
    max_invalid_streak: int = 0
    require_think: bool = False
    show_admissible: bool = False
    action_parser: str = "action_tag"  # action_tag | raw (env parses, e.g. Search-R1 tags)
    max_batch_size: int = 64
    backend: str = "hf"  # hf (transformers, CPU or GPU) | vllm (GPU)
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
    max_turns: int = 0  # step cap of a demo episode (0: agent.max_turns)
    # language-model passes over the env's own text (env.unwrapped.lm_corpus(), e.g. the
    # search corpus) before the demos: every word embedding gets trained, not only those
    # the demos happen to show, which tiny word-level models need to copy unseen names
    lm_epochs: int = 0
    lm_row_tokens: int = 256


@dataclass
class CreditConfig:
    name: str = "grpo"
    params: dict = field(default_factory=dict)


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
    grad_clip: float = 1.0
    token_budget: int = 32768
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_mean
    recompute_logprobs: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)
    # under torchrun: replicate (weights/grads/Adam state on every rank, gradients summed)
    # or fsdp (FSDP2: all three sharded over the ranks; see trainers/fsdp.py)
    data_parallel: str = "replicate"
    credit: CreditConfig = field(default_factory=CreditConfig)


@dataclass
class EvalConfig:
    num_tasks: int = 60
    temperature: float = 1.0
    greedy: bool = False
    every: int = 0  # RL steps between evals (0: only before and after RL)
    seed_offset: int = 0


@dataclass
class CheckpointConfig:
    every: int = 10
    keep: int = 2


@dataclass
class TrainConfig:
    seed: int = 0
    output_dir: str = "runs/default"
    threads: int = 2
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def config_path(name: str) -> Path:
    """A bundled config name (``quickstart``) or a path to a YAML file."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    stem = p.stem if p.suffix in (".yaml", ".yml") else name
    bundled = resources.files("turngym.configs").joinpath(f"{stem}.yaml")
    if bundled.is_file():
        return Path(str(bundled))
    names = sorted(x.name[:-5] for x in resources.files("turngym.configs").iterdir()
                   if x.name.endswith(".yaml"))
    raise FileNotFoundError(f"no config {name!r}: not a file, and bundled configs are {names}")


def _load_yaml(name: str, seen: tuple[str, ...] = ()) -> DictConfig:
    """A YAML config; ``base: other`` in it first loads ``other`` (a bundled name or a
    path) and merges this file on top, so variants state only what differs."""
    path = config_path(name)
    if str(path) in seen:
        raise ValueError(f"config inheritance cycle: {' -> '.join(seen + (str(path),))}")
    raw = OmegaConf.load(path)
    base = raw.pop("base", None) if isinstance(raw, DictConfig) else None
    if base is None:
        return raw
    return OmegaConf.merge(_load_yaml(str(base), seen + (str(path),)), raw)


def load_config(name: str | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    cfg = OmegaConf.structured(TrainConfig)
    if name is not None:
        cfg = OmegaConf.merge(cfg, _load_yaml(name))
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ValueError(f"overrides must look like key=value, got {bad}")
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    return cfg


def to_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
