"""Builds (model, tokenizer) from a ModelConfig: the tiny embedded default or any HF path."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from .tiny import build_tiny_model, build_tiny_tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_of(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}") from None


def load_pretrained(path: str, dtype: str = "float32", device: str = "cpu",
                    gguf_file: str | None = None):
    """A local HF model directory (or a turngym checkpoint, which is one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path).exists():
        raise FileNotFoundError(f"model path {path!r} does not exist (hub downloads are not used)")
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(path, **kw)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype_of(dtype), **kw)
    if gguf_file:
        _forget_gguf(model)
    return model.to(device), tok


def _forget_gguf(model) -> None:
    """transformers dequantizes GGUF tensors into plain float parameters but keeps the
    model marked as quantized, which blocks ``save_pretrained`` (warm starts,
    checkpoints).  The weights really are plain floats, so drop the marks."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")


def build_model(mcfg, corpus: Iterable[str] = (), extra_words: Iterable[str] = (), seed: int = 0,
                phrases: Iterable[str] = ()):
    """``kind=tiny``: fit a word-level tokenizer on ``corpus`` and init a small Llama;
    ``kind=hf``: load ``path``."""
    if mcfg.kind == "tiny":
        tok = build_tiny_tokenizer(corpus, extra_words,
                                   fuse_entities=mcfg.fuse_entities,
                                   phrases=phrases)
        model = build_tiny_model(tok, mcfg.hidden_size, mcfg.num_layers, mcfg.num_heads,
                                 mcfg.intermediate_size, mcfg.max_positions, seed=seed)
        return model.to(dtype_of(mcfg.dtype)).to(mcfg.device), tok
    if mcfg.kind == "hf":
        if not mcfg.path:
            raise ValueError("model.kind=hf needs model.path (a local model directory)")
        return load_pretrained(mcfg.path, mcfg.dtype, mcfg.device, mcfg.gguf_file)
    raise ValueError(f"unknown model.kind {mcfg.kind!r}; use tiny or hf")


def build_policy(acfg, model, tokenizer, model_dir: str | None = None, seed: int | None = None,
                 precision: str | None = None):
    """The rollout policy ``agent.backend`` names: ``hf`` samples with ``model``
    itself; ``vllm`` starts a colocated engine from ``model_dir`` (a full HF
    directory, e.g. the warm start) whose weights the trainer syncs after updates."""
    if acfg.backend == "hf":
        from .hf_backend import HFPolicy
        return HFPolicy(model, tokenizer, max_batch_size=acfg.max_batch_size,
                        generator_seed=seed, precision=precision)
    if acfg.backend == "vllm":
        from .vllm_backend import VLLMPolicy
        if model_dir is None:
            raise ValueError("agent.backend=vllm needs a model directory to start the engine")
        v = acfg.vllm
        return VLLMPolicy(model_dir, tokenizer, dtype=v.dtype,
                          gpu_memory_utilization=v.gpu_memory_utilization,
                          enable_prefix_caching=v.enable_prefix_caching,
                          enable_sleep_mode=v.enable_sleep_mode, max_model_len=v.max_model_len,
                          enforce_eager=v.enforce_eager, seed=seed or 0,
                          engine_kwargs=dict(v.engine_kwargs or {}),
                          constrain_actions=bool(acfg.constrain_actions))
    raise ValueError(f"unknown agent.backend {acfg.backend!r}; use hf or vllm")
