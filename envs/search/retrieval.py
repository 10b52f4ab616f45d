"""Retrievers: dense (faiss over an HF encoder), BM25 (no model), HTTP (a remote server).

All share one batched call, ``search(queries, topk) -> [[Hit, ...], ...]``, so an
env pool can send every live episode's query in one encoder forward and one
faiss search.

Indexes are built once per (corpus, encoder, index kind) and saved under the
cache directory (``index_dir``, else ``$TURNGYM_CACHE/search``, else
``~/.cache/turngym/search``); later loads memory-map them.  Files are written to
a temporary name and renamed, so an interrupted build never leaves a torn index.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from .data import Passage
from .encoders import HFEncoder, encoder_spec


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float


class Retriever(Protocol):
    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]: ...


def corpus_digest(passages: Sequence[Passage]) -> str:
    h = hashlib.sha1()
    for p in passages:
        h.update(p.id.encode())
        h.update(b"\x00")
        h.update(p.title.encode())
        h.update(b"\x00")
        h.update(p.text.encode())
        h.update(b"\x01")
    return h.hexdigest()[:16]


def cache_dir(index_dir: str | None = None) -> Path:
    if index_dir:
        d = Path(index_dir)
    elif os.environ.get("TURNGYM_CACHE"):
        d = Path(os.environ["TURNGYM_CACHE"]) / "search"
    else:
        d = Path.home() / ".cache" / "turngym" / "search"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _check_topk(topk: int) -> int:
    if not isinstance(topk, (int, np.integer)) or topk < 1:
        raise ValueError(f"topk must be a positive integer, got {topk!r}")
    return int(topk)


# ------------------------------------------------------------------ dense
class DenseRetriever:
    """faiss inner-product search over L2-normalised embeddings (cosine).

    ``index="flat"`` (exact ``IndexFlatIP``, default) or ``"hnsw"``
    (``IndexHNSWFlat``, ``hnsw_m`` links, ``ef_search`` at query time).
    ``blas_threshold`` sets ``faiss.cvar.distance_compute_blas_threshold``: a flat
    search with at least that many queries uses one BLAS GEMM instead of per-query
    SIMD loops (benchmarks/bench_search.py measures the crossover).
    """

    def __init__(self, passages: Sequence[Passage], encoder: dict | str | None = None,
                 index: str = "flat", hnsw_m: int = 32, ef_construction: int = 80,
                 ef_search: int = 64, blas_threshold: int | None = 8,
                 index_dir: str | None = None, progress: bool = False):
        import faiss

        if index not in ("flat", "hnsw"):
            raise ValueError(f"index must be 'flat' or 'hnsw', got {index!r}")
        self.passages = list(passages)
        if not self.passages:
            raise ValueError("empty corpus")
        self.spec = encoder_spec(encoder)
        self.encoder = HFEncoder(self.spec)
        self._faiss = faiss
        self._lock = threading.Lock()  # torch forward + faiss search from server threads
        if blas_threshold is not None:
            faiss.cvar.distance_compute_blas_threshold = int(blas_threshold)
        key = hashlib.sha1(f"{corpus_digest(self.passages)}|{self.spec.key()}|{index}|"
                           f"{hnsw_m}|{ef_construction}".encode()).hexdigest()[:20]
        self.index_path = cache_dir(index_dir) / f"dense-{key}.faiss"
        if self.index_path.exists():
            self.index = self._load(self.index_path)
            self.built = False
        else:
            self.index = self._build(index, hnsw_m, ef_construction, progress)
            self.built = True
        if index == "hnsw":
            self.index.hnsw.efSearch = int(ef_search)
        if self.index.ntotal != len(self.passages):
            raise RuntimeError(f"index {self.index_path} has {self.index.ntotal} vectors for "
                               f"{len(self.passages)} passages; delete it to rebuild")

    def _load(self, path: Path):
        faiss = self._faiss
        flag = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP)
        try:
            return faiss.read_index(str(path), flag)
        except RuntimeError:  # an index type without mmap support
            return faiss.read_index(str(path))

    def _build(self, kind: str, hnsw_m: int, ef_construction: int, progress: bool):
        faiss = self._faiss
        texts = [f"{p.title}. {p.text}" if p.title else p.text for p in self.passages]
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(texts), desc="encoding passages", leave=False)
        emb = self.encoder.encode(texts, is_query=False, progress=bar.update if bar else None)
        if bar is not None:
            bar.close()
        dim = emb.shape[1]
        if kind == "flat":
            index = faiss.IndexFlatIP(dim)
        else:
            index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = ef_construction
        index.add(emb)
        tmp = self.index_path.with_suffix(f".tmp{os.getpid()}")
        faiss.write_index(index, str(tmp))
        os.replace(tmp, self.index_path)
        return self._load(self.index_path)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encoder.encode(list(queries), is_query=True)

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        topk = _check_topk(topk)
        if not queries:
            return []
        with self._lock:
            q = self.encode_queries(queries)
            scores, ids = self.index.search(q, min(topk, len(self.passages)))
        return [[Hit(self.passages[j], float(s)) for s, j in zip(srow, irow) if j >= 0]
                for srow, irow in zip(scores, ids)]


# ------------------------------------------------------------------ BM25
class BM25Retriever:
    """Lexical BM25 (the ``bm25s`` package, sparse matrices); needs no model.

    The index is saved next to dense ones and loaded memory-mapped.
    """

    def __init__(self, passages: Sequence[Passage], k1: float = 1.5, b: float = 0.75,
                 stopwords: str | None = "en", index_dir: str | None = None,
                 progress: bool = False):
        import bm25s

        self.passages = list(passages)
        if not self.passages:
            raise ValueError("empty corpus")
        self._bm25s = bm25s
        self.stopwords = stopwords
        self._lock = threading.Lock()
        key = hashlib.sha1(f"{corpus_digest(self.passages)}|bm25|{k1}|{b}|{stopwords}"
                           .encode()).hexdigest()[:20]
        self.index_path = cache_dir(index_dir) / f"bm25-{key}"
        if (self.index_path / "params.index.json").exists():
            self.model = bm25s.BM25.load(str(self.index_path), mmap=True)
            self.built = False
        else:
            texts = [f"{p.title} {p.text}" for p in self.passages]
            tokens = bm25s.tokenize(texts, stopwords=stopwords, show_progress=progress)
            model = bm25s.BM25(k1=k1, b=b)
            model.index(tokens, show_progress=progress)
            # a private staging dir: builders on other hosts sharing the cache may have our pid
            tmp = Path(tempfile.mkdtemp(prefix=self.index_path.name + ".tmp",
                                        dir=self.index_path.parent))
            try:
                model.save(str(tmp))
                os.replace(tmp, self.index_path)
                self.built = True
            except OSError:
                # another process (a torchrun rank, a parallel run) published the same
                # index first: a directory cannot be renamed over a non-empty one; use theirs
                if not (self.index_path / "params.index.json").exists():
                    raise
                self.built = False
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            self.model = bm25s.BM25.load(str(self.index_path), mmap=True)

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        topk = _check_topk(topk)
        if not queries:
            return []
        k = min(topk, len(self.passages))
        with self._lock:
            toks = self._bm25s.tokenize(list(queries), stopwords=self.stopwords,
                                        show_progress=False)
            if not any(len(t) for t in toks.ids):  # nothing searchable in any query
                return [[] for _ in queries]
            ids, scores = self.model.retrieve(toks, k=k, show_progress=False, n_threads=1)
        return [[Hit(self.passages[int(j)], float(s)) for j, s in zip(irow, srow) if s > 0]
                for irow, srow in zip(ids, scores)]


# ------------------------------------------------------------------ registry
RetrieverFactory = Callable[..., Retriever]
_KINDS: dict[str, RetrieverFactory] = {}


def register_retriever(kind: str):
    def deco(factory: RetrieverFactory) -> RetrieverFactory:
        _KINDS[kind] = factory
        return factory
    return deco


register_retriever("dense")(DenseRetriever)
register_retriever("bm25")(BM25Retriever)


@register_retriever("http")
def _http(passages, url: str = "http://127.0.0.1:8000", **kw) -> Retriever:
    from .client import HTTPRetriever
    return HTTPRetriever(url, **kw)


def make_retriever(passages: Sequence[Passage], spec: dict | None) -> Retriever:
    """``spec = {"kind": "dense"|"bm25"|"http", ...kind options}``."""
    spec = dict(spec or {})
    kind = spec.pop("kind", "dense")
    if kind not in _KINDS:
        raise ValueError(f"unknown retriever kind {kind!r}; registered: {sorted(_KINDS)}")
    try:
        return _KINDS[kind](passages, **spec)
    except TypeError as exc:
        raise ValueError(f"bad options for retriever {kind!r}: {exc}") from None


def recall_at_k(retriever: Retriever, queries: Sequence[str], gold_ids: Sequence[str],
                topk: int = 3, batch_size: int = 256) -> float:
    """Fraction of queries whose gold passage id is in the top ``topk``."""
    hit = 0
    for s in range(0, len(queries), batch_size):
        res = retriever.search(list(queries[s:s + batch_size]), topk)
        hit += sum(g in {h.passage.id for h in r} for g, r in zip(gold_ids[s:s + batch_size], res))
    return hit / max(1, len(queries))
