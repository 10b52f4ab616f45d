"""Our retrieval server and search env against the request/parse logic of the two real
clients, written here from their code's formats (not imported: neither package installs
without its trainer stack):

* Search-R1, ``search_r1/llm_agent/generation.py`` (PeterGriffinJin/Search-R1):
  ``postprocess_predictions`` takes the first ``<(search|answer)>(.*?)</\\1>`` (DOTALL) and
  strips its content; ``_batch_search`` posts ``{"queries", "topk", "return_scores": True}``
  with ``requests.post(url, json=payload).json()``; ``batch_search`` renders each result
  row with ``_passages2string`` (title = ``contents.split("\\n")[0]``, text = the other
  lines joined by ``"\\n"``, ``f"Doc {i}(Title: {title}) {text}\\n"``) and
  ``execute_predictions`` makes the observation
  ``f"\\n\\n<information>{rendered.strip()}</information>\\n\\n"``.
* SkyRL-gym, ``skyrl-gym/skyrl_gym/tools/search.py`` (NovaSky-AI/SkyRL): one
  ``requests.Session`` shared per host; ``call_search_api`` posts ``{"query", "topk",
  "return_scores"}`` with JSON headers and a timeout, retries 500/502/503/504 and
  connection errors, ``raise_for_status()`` otherwise; ``SearchToolGroup.search`` renders
  every row of ``result`` with its own ``_passages2string`` (``f"Doc {i}: {contents.strip()}\\n"``),
  joins rows with ``"\\n---\\n"`` and returns ``json.dumps({"result": ...})``; an error
  becomes ``{"result": "Search error: ..."}``.  ``skyrl_gym/envs/search/env.py`` wraps it
  as ``"\\n<information>" + output + "</information>\\n"``.

The comparison is byte for byte: our env's observation for an action equals Search-R1's
rendering of the server's answer to the query Search-R1 extracts from the same action.
"""

import json
import re
import time

import gymnasium as gym
import pytest
import requests
from conftest import SMALL_WIKI

import turngym  # noqa: F401
from turngym.envs.search.data import QAExample, write_qa_jsonl
from turngym.envs.search.dataset import get_dataset
from turngym.envs.search.retrieval import BM25Retriever
from turngym.envs.search.server import serve_in_thread


# ------------------------------------------------------------ Search-R1 (generation.py)
def search_r1_query(prediction: str) -> tuple[str | None, str]:
    m = re.search(r"<(search|answer)>(.*?)</\1>", prediction, re.DOTALL)
    return (m.group(1), m.group(2).strip()) if m else (None, "")


def search_r1_render(row: list[dict]) -> str:
    out = ""
    for i, item in enumerate(row):
        lines = item["document"]["contents"].split("\n")
        out += f"Doc {i + 1}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n"
    return out


def search_r1_observations(search_url: str, predictions: list[str], topk: int = 3) -> list[str]:
    """Search-R1's next observation for each search prediction of one batch."""
    queries = [q for kind, q in map(search_r1_query, predictions) if kind == "search"]
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    results = requests.post(search_url, json=payload).json()["result"]
    return [f"\n\n<information>{search_r1_render(row).strip()}</information>\n\n"
            for row in results]


# -------------------------------------------------------------- SkyRL-gym (tools/search.py)
def skyrl_search(session: requests.Session, search_url: str, query: str, topk: int = 3,
                 retries: int = 3) -> str:
    payload = {"query": query.strip(), "topk": topk, "return_scores": True}
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    error, response = None, None
    for _ in range(retries):
        try:
            r = session.post(search_url, headers=headers, json=payload, timeout=30)
            if r.status_code in (500, 502, 503, 504):
                error = f"Server Error ({r.status_code})"
                continue
            r.raise_for_status()
            response, error = r.json(), None
            break
        except requests.exceptions.RequestException as exc:
            error = f"API Request Error: {exc}"
            break
    if error:
        return json.dumps({"result": f"Search error: {error}"})
    rows = response.get("result", [])
    if not rows:
        return json.dumps({"result": "No search results found."})
    rendered = ["".join(f"Doc {i + 1}: {d['document']['contents'].strip()}\n"
                        for i, d in enumerate(row)) for row in rows]
    return json.dumps({"result": "\n---\n".join(rendered)})


# ------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def wiki_server():
    ds = get_dataset(SMALL_WIKI)
    server, url = serve_in_thread(BM25Retriever(ds.passages), num_passages=len(ds.passages))
    yield ds, url
    server.stop()


def _env(url=None, dataset=SMALL_WIKI, topk=3):
    retriever = {"kind": "http", "url": url} if url else {"kind": "bm25"}
    return gym.make("turngym/SearchQA-v0", split="test", dataset=dataset, topk=topk,
                    retriever=retriever).unwrapped


def test_env_observation_is_search_r1s_rendering_byte_for_byte(wiki_server):
    ds, url = wiki_server
    remote, local = _env(url), _env()
    preds, ours, ours_local = [], [], []
    for seed in range(12):
        for env in (remote, local):
            env.reset(seed=seed)
        for q in ds.splits["test"][seed].oracle_queries:
            pred = f"<think>hop</think>\n<search>  {q} </search>"
            preds.append(pred)
            ours.append(remote.step(pred)[0])
            ours_local.append(local.step(pred)[0])
    theirs = search_r1_observations(f"{url}/retrieve", preds)  # one batch, as Search-R1 does
    assert len(theirs) == len(ours) > 12
    assert ours == theirs
    assert ours_local == theirs  # a local index renders exactly as the server's answer does
    assert all('(Title: "' in o for o in ours)  # FlashRAG's quoted title line, kept


def test_search_r1_rendering_of_flashrag_contents_in_every_shape(tmp_path):
    """A FlashRAG-style corpus with the shapes real dumps have: quoted titles, an unquoted
    one, multi-line and space-padded text, a title-only row."""
    rows = [
        {"id": "0", "contents": '"Kredas Hufel"\nKredas Hufel works for the Vel Ora mill.'},
        {"id": "1", "contents": 'Kredas Hufel (painter)\nKredas Hufel painted the mill.'},
        {"id": "2", "contents": '"Vel Ora"\n  Vel Ora is a town.\nIts mill employs Kredas.  '},
        {"id": "3", "contents": '"Kredas"'},
        {"id": "4", "contents": '"Mill "Kredas" works"\nThe mill is named after Kredas.'},
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    qa = tmp_path / "qa.jsonl"
    write_qa_jsonl([QAExample("q0", "Who works for the Vel Ora mill?", ("Kredas Hufel",))], qa)
    dataset = {"kind": "files", "corpus": str(corpus), "qa": {"test": str(qa)}}
    passages = get_dataset(dataset).passages
    assert [p.contents for p in passages] == [r["contents"] for r in rows]  # kept exactly
    server, url = serve_in_thread(BM25Retriever(passages))
    try:
        remote, local = _env(url, dataset, 5), _env(None, dataset, 5)
        preds = ["<search>Kredas mill</search>", "<search> Vel Ora town </search>",
                 "<search>\nKredas\n</search>"]
        ours, ours_local = [], []
        for p in preds:
            for env in (remote, local):
                env.reset(seed=0)
            ours.append(remote.step(p)[0])
            ours_local.append(local.step(p)[0])
        theirs = search_r1_observations(f"{url}/retrieve", preds, topk=5)
        assert ours == theirs and ours_local == theirs
        row = requests.post(f"{url}/retrieve", json={"queries": ["Kredas mill"], "topk": 5,
                                                      "return_scores": True}).json()["result"][0]
        rendered = search_r1_render(row)
        assert len(row) == 5
        for doc in ['(Title: "Kredas Hufel") Kredas Hufel works for the Vel Ora mill.\n',
                    "(Title: Kredas Hufel (painter)) Kredas Hufel painted the mill.\n",
                    '(Title: "Vel Ora")   Vel Ora is a town.\nIts mill employs Kredas.  \n',
                    '(Title: "Kredas") \n',
                    '(Title: "Mill "Kredas" works") The mill is named after Kredas.\n']:
            assert doc in rendered  # every shape, as Search-R1 splits it
            assert doc.rstrip() in theirs[0]
    finally:
        server.stop()


def test_skyrl_gym_search_tool_gets_results_not_errors(wiki_server):
    ds, url = wiki_server
    local = BM25Retriever(ds.passages)
    with requests.Session() as session:  # shared per host, as SearchToolGroup does
        for ex in ds.splits["test"][:10]:
            q = ex.oracle_queries[0]
            out = json.loads(skyrl_search(session, f"{url}/retrieve", f"  {q}\n"))["result"]
            assert not out.startswith("Search error"), out
            want = "".join(f"Doc {i + 1}: {h.passage.contents.strip()}\n"
                           for i, h in enumerate(local.search([q], 3)[0]))
            assert out == want  # one query, one row: no "---" separator
    # the same tool against a server that is failing answers "Search error", as upstream
    with requests.Session() as session:
        bad = skyrl_search(session, f"{url}/nope", "x")
        assert json.loads(bad)["result"].startswith("Search error")


class Failing:
    def __init__(self, n, inner):
        self.n, self.inner = n, inner

    def search(self, queries, topk):
        if self.n:
            self.n -= 1
            raise RuntimeError("shard offline")
        return self.inner.search(queries, topk)


def test_skyrl_gym_retries_a_500_on_the_same_session(wiki_server):
    ds, _ = wiki_server
    server, url = serve_in_thread(Failing(2, BM25Retriever(ds.passages)))
    try:
        with requests.Session() as session:
            t0 = time.monotonic()
            out = json.loads(skyrl_search(session, f"{url}/retrieve", "capital"))["result"]
            assert out.startswith("Doc 1: ") and time.monotonic() - t0 < 10
    finally:
        server.stop()
