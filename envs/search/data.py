"""Corpus and QA records, and loaders for real data in Search-R1 / FlashRAG form.

* Corpus: JSONL, one ``{"id": ..., "contents": "\\"Title\\"\\ntext"}`` per line
  (FlashRAG's wiki dumps; the first line of ``contents`` is the title), or
  ``{"id", "title", "text"}``.
* QA: JSONL or parquet (pyarrow) rows with ``question`` and ``golden_answers`` (a list;
  Search-R1's parquet files) or a single ``answer``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator


@dataclass(frozen=True)
class Passage:
    """A corpus passage.  ``title``/``text`` are what retrievers index; :attr:`contents` is
    the FlashRAG/Search-R1 wire form, ``"Title"\\ntext``, which is what gets rendered.

    A passage read from a ``contents`` string that is not in that exact form (an unquoted
    title line, no newline, ...) keeps the string in ``raw_contents``, so it goes back on
    the wire, and renders, exactly as it came.
    """

    id: str
    title: str
    text: str
    raw_contents: str | None = field(default=None, repr=False)

    @property
    def contents(self) -> str:
        """FlashRAG/Search-R1 ``contents`` field: quoted title line, then the text."""
        if self.raw_contents is not None:
            return self.raw_contents
        return f'"{self.title}"\n{self.text}'

    @staticmethod
    def from_contents(pid: str, contents: str) -> "Passage":
        """Splits ``contents`` as Search-R1 does (the first line is the title line); the
        title loses one pair of surrounding quotes, nothing else is stripped."""
        line, _, text = contents.partition("\n")
        title = line[1:-1] if len(line) >= 2 and line[0] == line[-1] == '"' else line
        canonical = f'"{title}"\n{text}'
        return Passage(str(pid), title, text, None if canonical == contents else contents)


@dataclass(frozen=True)
class QAExample:
    """A question with its gold answers; the hop fields exist for generated data only."""

    qid: str
    question: str
    golden_answers: tuple[str, ...]
    hops: int = 0  # 0: unknown (real data)
    gold_passages: tuple[str, ...] = ()
    oracle_queries: tuple[str, ...] = ()
    hop_answers: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)


class DataFormatError(ValueError):
    """A corpus or QA file that does not have the fields we need."""


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{n}: not valid JSON ({exc.msg})") from None


def load_corpus_jsonl(path: str | Path) -> list[Passage]:
    """Reads a Search-R1 / FlashRAG corpus (``id`` + ``contents``, or ``title`` + ``text``)."""
    path = Path(path)
    out: list[Passage] = []
    for n, row in _jsonl(path):
        pid = row.get("id", len(out))
        if "contents" in row:
            out.append(Passage.from_contents(str(pid), str(row["contents"])))
        elif "text" in row:
            out.append(Passage(str(pid), str(row.get("title", "")), str(row["text"])))
        else:
            raise DataFormatError(f"{path}:{n}: a corpus row needs 'contents' or 'text'; "
                                  f"got keys {sorted(row)}")
    if not out:
        raise DataFormatError(f"{path}: empty corpus")
    return out


def write_corpus_jsonl(passages: Iterable[Passage], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}) + "\n")


def _qa_row(row: dict[str, Any], where: str, index: int) -> QAExample:
    if "question" not in row:
        raise DataFormatError(f"{where}: a QA row needs 'question'; got keys {sorted(row)}")
    answers = row.get("golden_answers")
    if answers is None and isinstance(row.get("reward_model"), dict):  # Search-R1 parquet
        answers = (row["reward_model"].get("ground_truth") or {}).get("target")
    if answers is None:
        answers = row.get("answer", row.get("answers"))
    if answers is None:
        raise DataFormatError(f"{where}: a QA row needs 'golden_answers' or 'answer'")
    if isinstance(answers, str):
        answers = [answers]
    answers = tuple(str(a) for a in list(answers))
    if not answers:
        raise DataFormatError(f"{where}: empty golden_answers")
    qid = str(row.get("id", row.get("qid", index)))
    hops = int(row.get("hops", 0) or 0)
    return QAExample(qid, str(row["question"]).strip(), answers, hops,
                     tuple(row.get("gold_passages", ()) or ()),
                     tuple(row.get("oracle_queries", ()) or ()),
                     tuple(row.get("hop_answers", ()) or ()))


def load_qa(path: str | Path) -> list[QAExample]:
    """QA rows from ``.jsonl`` or ``.parquet`` (parquet needs pyarrow: the ``parquet`` extra)."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError("reading parquet QA files needs pyarrow "
                              "(pip install 'turngym[parquet]')") from None
        rows = pq.read_table(path).to_pylist()
        return [_qa_row(r, f"{path}[{i}]", i) for i, r in enumerate(rows)]
    return [_qa_row(r, f"{path}:{n}", i) for i, (n, r) in enumerate(_jsonl(path))]


def write_qa_jsonl(examples: Iterable[QAExample], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for e in examples:
            f.write(json.dumps(e.to_json()) + "\n")
