"""Server fairness: latency of a one-query ``/retrieve`` (and a 1-token chat completion)
while a long request runs, chunked (the default) vs one lock hold for the whole request
(the old behaviour), side by side in one run.

    python benchmarks/bench_servers.py [--queries 4096] [--tokens 400]

Retrieval: BM25 over the bundled wiki (22k passages); a batch of ``--queries`` oracle
queries is sent, and while it runs one-query requests are sent back to back; their
latency (first, median, worst) is reported with the batch's own time, alone and with the
probes running.  Chat: a tiny 2-layer model streams
``--tokens`` tokens while 1-token requests are sent.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx

import turngym  # noqa: F401
from turngym.envs.search.dataset import get_dataset, get_retriever
from turngym.envs.search.server import RetrieverLimits, serve_in_thread


def _probe_while(long_call, probe_call):
    """Runs ``long_call`` on a thread; calls ``probe_call`` back to back until it ends.
    Returns (long seconds, probe latencies)."""
    out = {}

    def run():
        t0 = time.perf_counter()
        long_call()
        out["long"] = time.perf_counter() - t0

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)  # the long request is in
    lat = []
    while t.is_alive():
        t0 = time.perf_counter()
        probe_call()
        lat.append(time.perf_counter() - t0)
    t.join()
    return out["long"], lat


def _row(name, alone_s, long_s, lat):
    lat = lat or [float("nan")]
    print(f"  {name:<32s} long alone {alone_s:6.2f} s, with probes {long_s:6.2f} s | "
          f"probes {len(lat):4d} | probe latency first {lat[0] * 1e3:8.1f} ms, "
          f"median {statistics.median(lat) * 1e3:8.1f} ms, max {max(lat) * 1e3:8.1f} ms")
    return max(lat)


def bench_retrieval(n_queries: int) -> None:
    ds = get_dataset(None)
    bm25 = get_retriever(None, {"kind": "bm25"})
    queries = [q for ex in ds.splits["train"] for q in ex.oracle_queries][:n_queries]
    print(f"retrieval: {len(queries)}-query batch (BM25, 22k passages) vs one-query probes")
    med = {}
    for name, chunk in (("chunked (64 queries per hold)", 64),
                        ("one hold per request (old)", len(queries))):
        server, url = serve_in_thread(bm25, limits=RetrieverLimits(chunk_queries=chunk,
                                                                   max_queries=len(queries)))
        try:
            with httpx.Client(timeout=600) as big, httpx.Client(timeout=600) as small:
                def long_call():
                    assert big.post(f"{url}/retrieve", json={"queries": queries}).is_success

                t0 = time.perf_counter()
                long_call()
                alone = time.perf_counter() - t0
                long_s, lat = _probe_while(
                    long_call, lambda: small.post(f"{url}/retrieve", json={"query": "capital"}))
            med[name] = _row(name, alone, long_s, lat)
        finally:
            server.stop()
    a, b = med.values()
    print(f"  worst probe latency, old / chunked: {b / a:.0f}x")


def bench_chat(tokens: int) -> None:
    import torch

    from turngym.agents.openai_server import ChatLimits, ChatModel
    from turngym.agents.openai_server import serve_in_thread as serve_chat
    from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer

    torch.set_num_threads(1)
    tok = build_tiny_tokenizer(["the quick brown fox jumps over the lazy dog"],
                               fuse_entities=False)
    model = build_tiny_model(tok, 64, 2, 2, seed=0)
    print(f"chat: a {tokens}-token greedy stream vs 1-token probes (tiny 2-layer model)")
    body = {"messages": [{"role": "user", "content": "the quick brown fox"}],
            "max_tokens": tokens, "temperature": 0}
    med = {}
    for name, k in (("sliced (16 tokens per hold)", 16), ("one hold per request (old)", tokens)):
        server, url = serve_chat(ChatModel(model, tok, limits=ChatLimits(
            max_tokens_cap=tokens, slice_tokens=k)))
        try:
            with httpx.Client(timeout=600) as big, httpx.Client(timeout=600) as small:
                def long_call():
                    assert big.post(f"{url}/chat/completions", json=body).is_success

                t0 = time.perf_counter()
                long_call()
                alone = time.perf_counter() - t0
                long_s, lat = _probe_while(long_call, lambda: small.post(
                    f"{url}/chat/completions",
                    json={"messages": body["messages"], "max_tokens": 1}))
            med[name] = _row(name, alone, long_s, lat)
        finally:
            server.stop()
    a, b = med.values()
    print(f"  worst probe latency, old / sliced: {b / a:.0f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=400)
    args = ap.parse_args()
    bench_retrieval(args.queries)
    bench_chat(args.tokens)
