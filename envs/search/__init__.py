"""Search QA over a retriever, in Search-R1's format, with a bundled offline corpus."""

from .data import Passage, QAExample, load_corpus_jsonl, load_qa, write_corpus_jsonl, write_qa_jsonl
from .dataset import SearchDataset, get_dataset, get_retriever
from .env import SearchQAEnv
from .protocol import exact_match, f1_score, normalize_answer, parse_search_action
from .retrieval import BM25Retriever, DenseRetriever, Hit, make_retriever, recall_at_k
from .wiki import WikiConfig, generate_wiki

__all__ = ["Passage", "QAExample", "load_corpus_jsonl", "load_qa", "write_corpus_jsonl",
           "write_qa_jsonl", "SearchDataset", "get_dataset", "get_retriever", "SearchQAEnv",
           "exact_match", "f1_score", "normalize_answer", "parse_search_action", "BM25Retriever",
           "DenseRetriever", "Hit", "make_retriever", "recall_at_k", "WikiConfig", "generate_wiki"]
