"""Bundled wiki generator, corpus/QA loaders, Search-R1 protocol and answer scoring."""

import json

import pytest

from turngym.envs.search.data import (DataFormatError, Passage, QAExample, load_corpus_jsonl,
                                      load_qa, write_corpus_jsonl, write_qa_jsonl)
from turngym.envs.search.protocol import (INVALID_ACTION_MESSAGE, contains_answer, exact_match,
                                          f1_score, format_passages, information_block,
                                          normalize_answer, parse_search_action)
from turngym.envs.search.wiki import WikiConfig, generate_wiki


@pytest.fixture(scope="module")
def wiki():
    return generate_wiki(WikiConfig())


def test_bundled_wiki_size_hops_and_splits(wiki):
    passages, splits = wiki
    assert len(passages) >= 20_000
    assert len({p.id for p in passages}) == len(passages)
    train, test = splits["train"], splits["test"]
    assert {q.hops for q in test} == {1, 2, 3}
    assert not {q.qid for q in train} & {q.qid for q in test}
    assert len(test) >= 500


def test_wiki_is_deterministic_and_seeded():
    small = dict(num_countries=5, num_cities=30, num_orgs=40, num_people=100,
                 questions_per_template=10)
    a = generate_wiki(WikiConfig(seed=3, **small))
    b = generate_wiki(WikiConfig(seed=3, **small))
    c = generate_wiki(WikiConfig(seed=4, **small))
    assert a == b
    assert a[0] != c[0]


def test_every_hop_answer_is_stated_in_its_gold_passage(wiki):
    passages, splits = wiki
    by_id = {p.id: p for p in passages}
    for q in splits["test"]:
        assert len(q.gold_passages) == len(q.hop_answers) == len(q.oracle_queries) == q.hops
        assert q.golden_answers == (q.hop_answers[-1],)
        for pid, ans in zip(q.gold_passages, q.hop_answers):
            p = by_id[pid]
            assert contains_answer(f"{p.title} {p.text}", [ans]), (q, p)
        # the question names the start entity, never the answer
        assert not contains_answer(q.question, q.golden_answers)


def test_corpus_jsonl_round_trip_and_flashrag_contents(tmp_path):
    ps = [Passage("1", "Alpha Beta", "Alpha Beta is a town.\nSecond line."),
          Passage("x2", "", "no title")]
    path = tmp_path / "c.jsonl"
    write_corpus_jsonl(ps, path)
    row = json.loads(path.read_text().splitlines()[0])
    assert row == {"id": "1", "contents": '"Alpha Beta"\nAlpha Beta is a town.\nSecond line.'}
    assert load_corpus_jsonl(path) == ps
    alt = tmp_path / "alt.jsonl"
    alt.write_text(json.dumps({"id": 7, "title": "T", "text": "body"}) + "\n\n")
    assert load_corpus_jsonl(alt) == [Passage("7", "T", "body")]


@pytest.mark.parametrize("content,msg", [
    ('{"id": 1, "body": "x"}', "needs 'contents' or 'text'"),
    ('{"id": 1, "contents": ', "not valid JSON"),
    ("", "empty corpus"),
])
def test_corpus_errors_name_the_line(tmp_path, content, msg):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataFormatError, match=msg):
        load_corpus_jsonl(path)


def test_qa_loaders_jsonl_and_parquet(tmp_path):
    rows = [{"id": "a", "question": "Who?", "golden_answers": ["X", "Ex"]},
            {"question": "When?", "answer": "1990"},
            {"question": "Where?", "reward_model": {"ground_truth": {"target": ["Paris"]}}}]
    p = tmp_path / "qa.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    qa = load_qa(p)
    assert [q.golden_answers for q in qa] == [("X", "Ex"), ("1990",), ("Paris",)]
    assert qa[0].qid == "a" and qa[1].qid == "1"
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    pq.write_table(pa.Table.from_pylist([rows[0], {"question": "Q2", "golden_answers": ["y"],
                                                   "id": "b"}]), tmp_path / "qa.parquet")
    qa2 = load_qa(tmp_path / "qa.parquet")
    assert [(q.qid, q.question, q.golden_answers) for q in qa2] == [
        ("a", "Who?", ("X", "Ex")), ("b", "Q2", ("y",))]
    ex = QAExample("q", "Q", ("A",), 2, ("p1", "p2"), ("s1", "s2"), ("h", "A"))
    write_qa_jsonl([ex], tmp_path / "rt.jsonl")
    assert load_qa(tmp_path / "rt.jsonl") == [ex]


def test_qa_loader_errors(tmp_path):
    p = tmp_path / "qa.jsonl"
    p.write_text(json.dumps({"question": "no answer"}))
    with pytest.raises(DataFormatError, match="golden_answers"):
        load_qa(p)
    p.write_text(json.dumps({"golden_answers": ["a"]}))
    with pytest.raises(DataFormatError, match="needs 'question'"):
        load_qa(p)


@pytest.mark.parametrize("text,kind,content", [
    ("<think>hm</think><search> who is x </search>", "search", "who is x"),
    ("<answer>Paris</answer> <search>q</search>", "answer", "Paris"),
    ("<search>a\n  b</search><answer>z</answer>", "search", "a b"),
    ("no tags at all", "invalid", ""),
    ("<search>unterminated", "invalid", ""),
    ("<search>   </search>", "invalid", ""),
    ("<search>x</answer>", "invalid", ""),
])
def test_parse_search_action(text, kind, content):
    act = parse_search_action(text)
    assert act.kind == kind
    assert act.content == content
    assert (act.error is None) == (kind != "invalid")


def test_information_block_matches_search_r1():
    # Search-R1 renders the title line whole (FlashRAG quotes included), text unstripped
    block = information_block([Passage("1", "T1", "one"), Passage("2", "T2", "two")])
    assert block == ('\n\n<information>Doc 1(Title: "T1") one\n'
                     'Doc 2(Title: "T2") two</information>\n\n')
    assert "<search> and </search>" in INVALID_ACTION_MESSAGE


@pytest.mark.parametrize("contents,title,text,rendered", [
    ('"Kredas Hufel"\nKredas works.', "Kredas Hufel", "Kredas works.",
     'Doc 1(Title: "Kredas Hufel") Kredas works.\n'),
    ('"T"\n two\nlines \n', "T", " two\nlines \n", 'Doc 1(Title: "T")  two\nlines \n\n'),
    ("Plain title\nbody", "Plain title", "body", "Doc 1(Title: Plain title) body\n"),
    ("no newline at all", "no newline at all", "", "Doc 1(Title: no newline at all) \n"),
    ('"a "quoted" b"\nx', 'a "quoted" b', "x", 'Doc 1(Title: "a "quoted" b") x\n'),
    ('"\nx', '"', "x", 'Doc 1(Title: ") x\n'),
])
def test_from_contents_keeps_what_search_r1_renders(contents, title, text, rendered):
    p = Passage.from_contents("9", contents)
    assert (p.title, p.text) == (title, text)
    assert p.contents == contents  # goes back on the wire exactly as it came
    assert format_passages([p]) == rendered


def test_squad_normalisation_em_and_f1():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert exact_match("the Paris", ["paris", "x"]) == 1.0
    assert exact_match("Paris France", ["Paris"]) == 0.0
    assert f1_score("Paris France", ["Paris"]) == pytest.approx(2 / 3)
    assert f1_score("London", ["Paris", "big London"]) == pytest.approx(2 / 3)
    assert f1_score("", ["Paris"]) == 0.0
    assert contains_answer("born in Vel Ora, 1950", ["vel ora"])
    assert not contains_answer("born in Velora", ["vel"])
