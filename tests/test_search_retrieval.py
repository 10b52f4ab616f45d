"""Retrieval quality and mechanics: BM25 and MiniLM+faiss recall@3 of gold passages,
index caching (built once, memory-mapped reload), HNSW, any-HF-encoder path."""

import numpy as np
import pytest
from conftest import SMALL_WIKI

from turngym.envs.search.dataset import get_dataset
from turngym.envs.search.encoders import HFEncoder, encoder_spec
from turngym.envs.search.retrieval import (BM25Retriever, DenseRetriever, make_retriever,
                                           recall_at_k)


def _oracle_queries(split):
    qs = [(q, g) for ex in split for q, g in zip(ex.oracle_queries, ex.gold_passages)]
    return [q for q, _ in qs], [g for _, g in qs]


def test_bm25_recall_at_3_on_bundled_corpus():
    ds = get_dataset(None)
    r = BM25Retriever(ds.passages)
    queries, gold = _oracle_queries(ds.splits["test"])
    rec = recall_at_k(r, queries, gold, topk=3)
    assert rec >= 0.9, rec
    # the question itself finds the first hop's passage
    q1 = [ex.question for ex in ds.splits["test"]]
    assert recall_at_k(r, q1, [ex.gold_passages[0] for ex in ds.splits["test"]]) >= 0.9
    # a second construction reuses the saved index
    again = BM25Retriever(ds.passages)
    assert not again.built
    assert [h.passage.id for h in again.search(queries[:5], 3)[0]] == \
           [h.passage.id for h in r.search(queries[:5], 3)[0]]


@pytest.fixture(scope="module")
def small_dense():
    ds = get_dataset(SMALL_WIKI)
    return ds, DenseRetriever(ds.passages)


def test_minilm_dense_recall_and_cached_mmap_reload(small_dense):
    ds, r = small_dense
    queries, gold = _oracle_queries(ds.splits["train"][:300])
    rec = recall_at_k(r, queries, gold, topk=3)
    assert rec >= 0.9, rec
    assert r.index_path.exists()
    again = DenseRetriever(ds.passages)
    assert not again.built and again.index.ntotal == len(ds.passages)
    a, b = r.search(queries[:8], 3), again.search(queries[:8], 3)
    assert [[h.passage.id for h in row] for row in a] == [[h.passage.id for h in row] for row in b]
    # scores are cosines of unit vectors, sorted
    s = np.array([[h.score for h in row] for row in a])
    assert (s <= 1.0 + 1e-5).all() and (np.diff(s, axis=1) <= 1e-6).all()


def test_batched_search_equals_one_by_one(small_dense):
    ds, r = small_dense
    queries, _ = _oracle_queries(ds.splits["test"][:20])
    batched = r.search(queries, 3)
    single = [r.search([q], 3)[0] for q in queries]
    assert [[h.passage.id for h in x] for x in batched] == [[h.passage.id for h in x]
                                                             for x in single]
    for x, y in zip(batched, single):
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-5)


def test_hnsw_agrees_with_flat(small_dense):
    ds, flat = small_dense
    hnsw = make_retriever(ds.passages, {"kind": "dense", "index": "hnsw", "ef_search": 128})
    queries, _ = _oracle_queries(ds.splits["test"])
    f, h = flat.search(queries, 3), hnsw.search(queries, 3)
    agree = np.mean([a[0].passage.id in {x.passage.id for x in b} for a, b in zip(f, h)])
    assert agree >= 0.95, agree


def test_bad_retriever_options():
    ds = get_dataset(SMALL_WIKI)
    with pytest.raises(ValueError, match="unknown retriever kind"):
        make_retriever(ds.passages, {"kind": "nope"})
    with pytest.raises(ValueError, match="bad options"):
        make_retriever(ds.passages, {"kind": "bm25", "colour": 1})
    with pytest.raises(ValueError, match="index must be"):
        DenseRetriever(ds.passages, index="ivf")
    r = BM25Retriever(ds.passages)
    with pytest.raises(ValueError, match="topk"):
        r.search(["x"], 0)
    assert r.search(["the of and"], 3) == [[]]  # only stopwords: nothing, no crash
    with pytest.raises(ValueError, match="unknown encoder options"):
        encoder_spec({"name": "minilm", "colour": 1})


def _tiny_bert_dir(tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizerFast
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "query", ":", "passage", "alpha",
             "beta", "gamma", "x"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    cfg = BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    import torch
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return str(tmp_path)


def test_any_hf_encoder_path_with_e5_prefixes_and_cls_pooling(tmp_path):
    path = _tiny_bert_dir(tmp_path)
    e5 = HFEncoder(encoder_spec({"name": "e5", "path": path}))
    plain = HFEncoder(encoder_spec({"name": "hf", "path": path}))
    q = e5.encode(["alpha beta"], is_query=True)
    assert q.shape == (1, 16)
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert np.allclose(q, plain.encode(["query: alpha beta"], is_query=True), atol=1e-5)
    assert np.allclose(e5.encode(["gamma"], is_query=False),
                       plain.encode(["passage: gamma"], is_query=False), atol=1e-5)
    cls = HFEncoder(encoder_spec({"name": "hf", "path": path, "pooling": "cls"}))
    assert not np.allclose(cls.encode(["alpha beta"], True), plain.encode(["alpha beta"], True))
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        HFEncoder(encoder_spec({"name": "hf", "path": str(tmp_path / "missing")}))
    with pytest.raises(ValueError, match="needs a local model directory"):
        encoder_spec({"name": "e5"}).resolved_path()


@pytest.mark.slow
def test_minilm_recall_at_3_on_full_bundled_corpus():
    ds = get_dataset(None)
    r = DenseRetriever(ds.passages)
    queries, gold = _oracle_queries(ds.splits["test"])
    assert recall_at_k(r, queries, gold, topk=3) >= 0.95


def test_two_processes_building_one_bm25_index_both_get_it(tmp_path, monkeypatch):
    """Two builders of the same BM25 index in one cache (torchrun ranks, parallel runs):
    the one that publishes second finds the directory taken.  It must use the published
    index, not crash at env construction, and leave no temporary directory behind."""
    import bm25s

    ds = get_dataset(SMALL_WIKI)
    real_save = bm25s.BM25.save
    rival = {}

    def save_after_a_rival_published(self, path, *a, **k):
        if not rival:  # while this builder saves, another one builds and publishes
            rival["r"] = None
            rival["r"] = BM25Retriever(ds.passages, index_dir=str(tmp_path))
        return real_save(self, path, *a, **k)
    monkeypatch.setattr(bm25s.BM25, "save", save_after_a_rival_published)
    late = BM25Retriever(ds.passages, index_dir=str(tmp_path))
    first = rival["r"]
    assert first.built and not late.built
    q = [ex.question for ex in ds.splits["test"][:5]]
    assert [[h.passage.id for h in hits] for hits in late.search(q, 3)] == \
           [[h.passage.id for h in hits] for hits in first.search(q, 3)]
    assert [p.name for p in tmp_path.iterdir()] == [first.index_path.name]


def test_a_query_with_a_lone_surrogate_is_searched_not_raised(small_dense):
    """The agent's text can hold a lone surrogate; the search action hands the retriever
    valid text (the dense encoder's tokenizer raised TypeError on it)."""
    from turngym.envs.search.protocol import parse_search_action
    ds, r = small_dense
    act = parse_search_action("<search> caf\ud800 capital </search>")
    assert act.kind == "search" and act.content == "caf? capital"
    assert len(r.search([act.content], 3)[0]) == 3
