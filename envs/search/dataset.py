"""Datasets (corpus + QA splits) and retrievers, shared by every env in a process.

A rollout pool holds dozens of env instances; they must share one corpus and
one index, not load 64 copies.  Both are memoised on their (JSON-normalised)
spec.

Dataset specs::

    {"kind": "wiki", "seed": 0, "num_people": 6000, ...}   # bundled generator (default)
    {"kind": "files", "corpus": "wiki.jsonl",
     "qa": {"train": "train.parquet", "test": "test.jsonl"}}
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, fields

from .data import Passage, QAExample, load_corpus_jsonl, load_qa
from .retrieval import Retriever, make_retriever
from .wiki import WikiConfig, generate_wiki


@dataclass(frozen=True)
class SearchDataset:
    passages: tuple[Passage, ...]
    splits: dict

    def questions(self, split: str) -> list[QAExample]:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; this dataset has {sorted(self.splits)}")
        return self.splits[split]


_LOCK = threading.Lock()
_DATASETS: dict[str, SearchDataset] = {}
_RETRIEVERS: dict[str, Retriever] = {}


def _key(spec: dict | None) -> str:
    return json.dumps(spec or {}, sort_keys=True, default=str)


def _build_dataset(spec: dict) -> SearchDataset:
    spec = dict(spec)
    kind = spec.pop("kind", "wiki")
    if kind == "wiki":
        known = {f.name for f in fields(WikiConfig)}
        bad = set(spec) - known
        if bad:
            raise ValueError(f"unknown wiki options {sorted(bad)}; known: {sorted(known)}")
        passages, splits = generate_wiki(WikiConfig(**spec))
        return SearchDataset(tuple(passages), splits)
    if kind == "files":
        if "corpus" not in spec or not isinstance(spec.get("qa"), dict) or not spec["qa"]:
            raise ValueError("a 'files' dataset needs 'corpus' (JSONL) and 'qa' "
                             "({split: path, ...})")
        return SearchDataset(tuple(load_corpus_jsonl(spec["corpus"])),
                             {k: load_qa(v) for k, v in spec["qa"].items()})
    raise ValueError(f"unknown dataset kind {kind!r}; use 'wiki' or 'files'")


def get_dataset(spec: dict | None = None) -> SearchDataset:
    key = _key(spec)
    with _LOCK:
        if key not in _DATASETS:
            _DATASETS[key] = _build_dataset(spec or {})
        return _DATASETS[key]


def get_retriever(dataset_spec: dict | None, retriever_spec: dict | None) -> Retriever:
    key = _key(dataset_spec) + "|" + _key(retriever_spec)
    ds = get_dataset(dataset_spec)
    with _LOCK:
        if key not in _RETRIEVERS:
            _RETRIEVERS[key] = make_retriever(ds.passages, retriever_spec)
        return _RETRIEVERS[key]


def clear_caches() -> None:
    with _LOCK:
        _DATASETS.clear()
        _RETRIEVERS.clear()
