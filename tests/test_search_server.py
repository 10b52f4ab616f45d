"""Search-R1 compatible retrieval server on loopback and the httpx client backend."""

import socket

import gymnasium as gym
import httpx
import pytest
from conftest import SMALL_WIKI

import turngym  # noqa: F401
from turngym.envs.search.client import HTTPRetriever, RetrieverUnavailable
from turngym.envs.search.dataset import get_dataset
from turngym.envs.search.retrieval import BM25Retriever
from turngym.envs.search.server import serve_in_thread


@pytest.fixture(scope="module")
def served():
    ds = get_dataset(SMALL_WIKI)
    local = BM25Retriever(ds.passages)
    server, url = serve_in_thread(local, num_passages=len(ds.passages))
    yield ds, local, url
    server.shutdown()
    server.server_close()


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


@pytest.mark.parametrize("body,status", [
    ({"queries": [1, 2]}, 400), ({"queries": ["x"], "topk": 0}, 400),
    ({"queries": ["x"], "topk": "3"}, 400), ([1, 2], 400),
])
def test_bad_requests_get_400_and_server_survives(served, body, status):
    _, _, url = served
    r = httpx.post(f"{url}/retrieve", json=body)
    assert r.status_code == status and "error" in r.json()
    assert httpx.post(f"{url}/retrieve", content=b"{not json").status_code == 400
    assert httpx.get(f"{url}/nope").status_code == 404
    assert httpx.get(f"{url}/health").status_code == 200


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
            s.shutdown()
            s.server_close()


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
