"""Search-R1 compatible retrieval server on loopback and the httpx client backend."""

import socket
import threading
import time

import gymnasium as gym
import httpx
import pytest
from conftest import SMALL_WIKI

import turngym  # noqa: F401
from turngym.envs.search.client import HTTPRetriever, RetrieverUnavailable
from turngym.envs.search.data import Passage
from turngym.envs.search.dataset import get_dataset
from turngym.envs.search.retrieval import BM25Retriever, Hit
from turngym.envs.search.server import RetrieverLimits, serve_in_thread
from turngym.jsonhttp import Limits


@pytest.fixture(scope="module")
def served():
    ds = get_dataset(SMALL_WIKI)
    local = BM25Retriever(ds.passages)
    server, url = serve_in_thread(local, num_passages=len(ds.passages))
    yield ds, local, url
    server.stop()


def test_round_trip_matches_local_retriever(served):
    ds, local, url = served
    client = HTTPRetriever(url)
    assert client.health() == {"status": "ok", "passages": len(ds.passages)}
    queries = [q for ex in ds.splits["test"][:10] for q in ex.oracle_queries]
    remote, here = client.search(queries, 3), local.search(queries, 3)
    assert [[h.passage for h in r] for r in remote] == [[h.passage for h in r] for r in here]
    for r, h in zip(remote, here):
        assert [x.score for x in r] == pytest.approx([x.score for x in h])


def test_search_r1_wire_format(served):
    ds, local, url = served
    body = {"queries": ["Kredas works for", "capital"], "topk": 2, "return_scores": True}
    res = httpx.post(f"{url}/retrieve", json=body).json()["result"]
    assert len(res) == 2 and len(res[0]) == 2
    doc = res[0][0]
    assert set(doc) == {"document", "score"} and set(doc["document"]) == {"id", "contents"}
    assert doc["document"]["contents"].startswith('"')  # quoted title line first
    plain = httpx.post(f"{url}/retrieve", json={**body, "return_scores": False}).json()
    assert set(plain["result"][0][0]) == {"id", "contents"}
    assert [d["id"] for d in plain["result"][0]] == [d["document"]["id"] for d in res[0]]
    # Search-R1 and SkyRL default: topk missing or null -> the server's default (3);
    # return_scores missing -> false
    for b in ({"queries": ["capital"]}, {"queries": ["capital"], "topk": None}):
        rows = httpx.post(f"{url}/retrieve", json=b).json()["result"]
        assert len(rows[0]) == 3 and set(rows[0][0]) == {"id", "contents"}
    assert httpx.post(f"{url}/retrieve", json={"queries": []}).json() == {"result": []}


def test_skyrl_single_query_form_answers_one_row(served):
    _, local, url = served
    q = "capital of"
    one = httpx.post(f"{url}/retrieve", json={"query": q, "topk": 3, "return_scores": True})
    batch = httpx.post(f"{url}/retrieve", json={"queries": [q], "topk": 3, "return_scores": True})
    assert one.status_code == 200 and one.json() == batch.json()
    rows = one.json()["result"]
    assert len(rows) == 1 and [d["document"]["id"] for d in rows[0]] == [
        h.passage.id for h in local.search([q], 3)[0]]


@pytest.mark.parametrize("body,param", [
    ({"queries": [1, 2]}, "queries"), ({"queries": ["x"], "topk": 0}, "topk"),
    ({"queries": ["x"], "topk": "3"}, "topk"), ({"queries": ["x"], "topk": True}, "topk"),
    ({"queries": ["x"], "topk": 101}, "topk"), ({"queries": ["x"], "topk": 2.0}, "topk"),
    ({"query": ["x"]}, "query"), ({"query": "x", "queries": ["x"]}, "queries"), ({}, "queries"),
    ({"queries": ["x"], "return_scores": "yes"}, "return_scores"),
    ({"queries": ["x"], "top_k": 3}, "top_k"), ([1, 2], None),
])
def test_bad_requests_get_400_and_server_survives(served, body, param):
    _, _, url = served
    r = httpx.post(f"{url}/retrieve", json=body)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    if param:
        assert repr(param)[1:-1] in r.json()["error"]
    assert httpx.post(f"{url}/retrieve", content=b"{not json").status_code == 400
    assert httpx.get(f"{url}/nope").status_code == 404
    assert httpx.get(f"{url}/health").status_code == 200


def test_lone_surrogates_get_400_not_500(served):
    """JSON escapes can carry text no tokenizer accepts (a dense encoder raised: 500)."""
    import json
    _, _, url = served
    for body, field in (({"queries": ["ok", "caf\ud800"]}, "queries"),
                        ({"query": "\udfff"}, "query")):
        r = httpx.post(f"{url}/retrieve", content=json.dumps(body),
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and f"'{field}'" in r.json()["error"], r.text


def test_per_request_caps():
    limits = RetrieverLimits(max_queries=5, max_topk=4, max_results=16,
                             http=Limits(max_body_bytes=2000))
    server, url = serve_in_thread(Slow(0.0), limits=limits)
    try:
        ok = httpx.post(f"{url}/retrieve", json={"queries": ["a"] * 4, "topk": 4})
        assert ok.status_code == 200 and len(ok.json()["result"]) == 4
        r = httpx.post(f"{url}/retrieve", json={"queries": ["a"] * 5, "topk": 4})
        assert r.status_code == 400 and "at most 16" in r.json()["error"]
        r = httpx.post(f"{url}/retrieve", json={"queries": ["a"] * 6})
        assert r.status_code == 400 and "at most 5" in r.json()["error"]
        r = httpx.post(f"{url}/retrieve", json={"queries": ["a"], "topk": 5})
        assert r.status_code == 400 and "[1, 4]" in r.json()["error"]
        r = httpx.post(f"{url}/retrieve", json={"query": "q" * 3000})
        assert r.status_code == 413 and "2000 bytes" in r.json()["error"]
    finally:
        server.stop()


class Slow:
    """Answers every query after ``delay`` seconds, logging which request each call served."""

    def __init__(self, delay):
        self.delay, self.calls = delay, []

    def search(self, queries, topk):
        time.sleep(self.delay * len(queries))
        self.calls.append(tuple(queries))
        return [[Hit(Passage(q, q, q), 1.0)] * topk for q in queries]


def test_a_long_batch_does_not_starve_a_short_request():
    slow = Slow(0.004)
    server, url = serve_in_thread(slow, limits=RetrieverLimits(chunk_queries=4))
    try:
        big = [f"big{i}" for i in range(400)]  # 100 chunks, ~1.6 s of work
        done = {}

        def send_big():
            done["big"] = httpx.post(f"{url}/retrieve", json={"queries": big}, timeout=60)

        t = threading.Thread(target=send_big)
        t.start()
        while len(slow.calls) < 3:
            time.sleep(0.005)
        sent_at = len(slow.calls)
        small = httpx.post(f"{url}/retrieve", json={"query": "small"}, timeout=60)
        t.join()
        assert small.status_code == 200 and done["big"].status_code == 200
        order = slow.calls.index(("small",))
        # served between two chunks of the batch while most of it was still to do (one
        # lock hold for the whole batch would put it after all 100 chunks)
        assert sent_at <= order < 50
        got = [row[0]["id"] for row in done["big"].json()["result"]]
        assert got == big  # chunks reassembled in order
    finally:
        server.stop()


def test_env_over_http_equals_local(served):
    ds, _, url = served
    remote = gym.make("turngym/SearchQA-v0", split="test", dataset=SMALL_WIKI,
                      retriever={"kind": "http", "url": url}).unwrapped
    local = gym.make("turngym/SearchQA-v0", split="test", dataset=SMALL_WIKI,
                     retriever={"kind": "bm25"}).unwrapped
    for seed in range(5):
        for env in (remote, local):
            env.reset(seed=seed)
        while not local.state.done:
            a = local.oracle_action()
            assert remote.oracle_action() == a
            assert remote.step(a)[:4] == local.step(a)[:4]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down_gives_clear_error_after_retries():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(RetrieverUnavailable, match=f"{url} unavailable after 3 tries"):
        HTTPRetriever(url, retries=2, backoff=0.01)
    client = HTTPRetriever(url, retries=0, check=False)
    with pytest.raises(RetrieverUnavailable, match="serve-retriever"):
        client.search(["x"], 3)


class Flaky:
    """Fails its first ``n`` calls (the server answers 500), then works."""

    def __init__(self, inner, n):
        self.inner, self.n = inner, n

    def search(self, queries, topk):
        if self.n > 0:
            self.n -= 1
            raise RuntimeError("index shard offline")
        return self.inner.search(queries, topk)


def test_5xx_is_retried_then_succeeds_or_gives_up(served):
    ds, local, _ = served
    ok_after_two, url = serve_in_thread(Flaky(local, 2))
    never_ok, url2 = serve_in_thread(Flaky(local, 10**6))
    try:
        client = HTTPRetriever(url, retries=2, backoff=0.01)
        hit = client.search(["capital"], 1)[0][0]
        assert hit.passage == local.search(["capital"], 1)[0][0].passage
        bad = HTTPRetriever(url2, retries=1, backoff=0.01)
        with pytest.raises(RetrieverUnavailable, match="HTTP 500"):
            bad.search(["x"], 3)
        assert bad.health()["status"] == "ok"  # the server itself survived
    finally:
        for s in (ok_after_two, never_ok):
            s.stop()


def test_serve_retriever_cli_on_a_jsonl_corpus(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from turngym.envs.search.data import Passage, write_corpus_jsonl

    corpus = tmp_path / "c.jsonl"
    write_corpus_jsonl([Passage(str(i), f"Town {i}", f"Town {i} lies on river R{i}.")
                        for i in range(50)], corpus)
    port = _free_port()
    env = dict(os.environ, TURNGYM_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "turngym", "serve-retriever", "--retriever",
                             "bm25", "--corpus", str(corpus), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                client = HTTPRetriever(url, retries=0)
                break
            except RetrieverUnavailable:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.time() < deadline, "server did not come up"
                time.sleep(0.3)
        assert client.health()["passages"] == 50
        hits = client.search(["river R17"], 2)[0]
        assert hits[0].passage == Passage("17", "Town 17", "Town 17 lies on river R17.")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
