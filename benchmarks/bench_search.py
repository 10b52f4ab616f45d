"""Search QA speed: retriever queries/s (MiniLM encoder + faiss, BM25), the faiss
BLAS-threshold crossover, and env steps/s with and without batched prefetch.

Uses the bundled wiki (22k passages); the dense index is built on first use and
cached (about 70 s on 2 cores), later runs memory-map it.
"""

from __future__ import annotations

import argparse
import time

import faiss

import turngym  # noqa: F401
from turngym.envs.search.dataset import get_dataset, get_retriever
from turngym.envs.search.env import SearchQAEnv


def _qps(fn, queries, batch, repeats=1):
    t0 = time.perf_counter()
    n = 0
    for _ in range(repeats):
        for s in range(0, len(queries), batch):
            fn(queries[s:s + batch])
            n += len(queries[s:s + batch])
    return n / (time.perf_counter() - t0)


def bench_retrievers(queries):
    dense = get_retriever(None, {"kind": "dense", "progress": True})
    bm25 = get_retriever(None, {"kind": "bm25"})
    print("retriever queries/s (top-3, 22k passages):")
    for b in (1, 8, 64):
        d = _qps(lambda q: dense.search(q, 3), queries, b)
        enc = _qps(lambda q: dense.encode_queries(q), queries, b)
        k = _qps(lambda q: bm25.search(q, 3), queries, b)
        print(f"  batch {b:>3}: dense (MiniLM+faiss) {d:8.0f} | MiniLM encoding only {enc:8.0f}"
              f" | BM25 {k:8.0f}")
    return dense


def bench_blas_threshold(dense, queries):
    """faiss flat search only (pre-encoded queries), SIMD loop vs BLAS GEMM."""
    q = dense.encode_queries(queries)
    print("faiss IndexFlatIP search only, queries/s (SIMD loop vs BLAS):")
    for b in (1, 4, 8, 16, 32, 64):
        res = {}
        for name, thr in (("simd", 10**9), ("blas", 1)):
            faiss.cvar.distance_compute_blas_threshold = thr
            res[name] = _qps(lambda x: dense.index.search(x, 3), q, b, repeats=2)
        print(f"  batch {b:>3}: simd {res['simd']:9.0f} | blas {res['blas']:9.0f} | "
              f"blas/simd {res['blas'] / res['simd']:.2f}x")
    faiss.cvar.distance_compute_blas_threshold = 8


def bench_env(kind: str, episodes: int, batch: int):
    envs = [SearchQAEnv(split="test", retriever={"kind": kind}) for _ in range(batch)]
    out = {}
    for mode in ("one-by-one", "batched"):
        steps, t0 = 0, time.perf_counter()
        for start in range(0, episodes, batch):
            for i, e in enumerate(envs):
                e.reset(seed=start + i)
            live = list(envs)
            while live:
                acts = [e.oracle_action() for e in live]
                if mode == "batched":
                    SearchQAEnv.prepare_steps(live, acts)
                for e, a in zip(live, acts):
                    e.step(a)
                    steps += 1
                live = [e for e in live if not e.state.done]
        out[mode] = steps / (time.perf_counter() - t0)
    print(f"env steps/s ({kind}, {batch} envs, oracle actions): one-by-one "
          f"{out['one-by-one']:7.0f} | batched prefetch {out['batched']:7.0f} | "
          f"ratio {out['batched'] / out['one-by-one']:.2f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--queries", type=int, default=512)
    p.add_argument("--episodes", type=int, default=256)
    a = p.parse_args()
    ds = get_dataset(None)
    queries = [q for ex in ds.splits["test"] for q in ex.oracle_queries][: a.queries]
    dense = bench_retrievers(queries)
    bench_blas_threshold(dense, queries)
    bench_env("bm25", a.episodes, 64)
    bench_env("dense", a.episodes, 64)
