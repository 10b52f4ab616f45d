"""A fictional-entity wiki generated offline: passages plus 1/2/3-hop questions.

Every name is made up from syllables, so no pretrained model has seen an answer
(no contamination), and every fact lives in exactly one passage (its *gold*
passage).  Passages are written from several templates per fact, and a third of
them are *distractors*: passages that mention an entity next to other entities
without stating the fact a question asks about.

World: countries (capital), cities (country, founding year), organisations
(founder, founding year, headquarters, industry) and people (birth year,
birthplace, employer, occupation).  Questions follow a chain of relations; each
hop records the query an honest searcher would type, the entity it yields and
the gold passage id, which the env's oracle and the retrieval tests use.

Deterministic from ``seed``; the default size (about 22k passages) builds in a
second or two.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .data import Passage, QAExample

_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p",
           "pr", "r", "s", "st", "t", "tr", "v", "vr", "z", "th", "sh", "q"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "x", "nd", "rk"]

_ORG_SUFFIX = ["Labs", "Holdings", "Works", "Institute", "Group", "Foundry", "Press", "Systems",
               "Collective", "Society", "Trading", "Studios"]
_INDUSTRY = ["shipbuilding", "publishing", "textiles", "software", "mining", "brewing",
             "cartography", "robotics", "pharmaceuticals", "glassmaking", "aviation", "banking"]
_OCCUPATION = ["engineer", "chemist", "archivist", "pilot", "economist", "architect", "botanist",
               "journalist", "composer", "surveyor", "physician", "sculptor", "linguist",
               "geologist", "diplomat", "painter"]


@dataclass(frozen=True)
class WikiConfig:
    seed: int = 0
    num_countries: int = 40
    num_cities: int = 600
    num_orgs: int = 1500
    num_people: int = 6000
    questions_per_template: int = 600
    test_fraction: float = 0.1


@dataclass
class _World:
    countries: list[dict] = field(default_factory=list)
    cities: list[dict] = field(default_factory=list)
    orgs: list[dict] = field(default_factory=list)
    people: list[dict] = field(default_factory=list)


class _Names:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        r = self.rng
        w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(syllables))
        return (w + r.choice(_CODAS)).capitalize()

    def unique(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted; lower the entity counts")


def _a(word: str) -> str:
    """Indefinite article + word ("an archivist", "a pilot")."""
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _build_world(cfg: WikiConfig, rng: random.Random) -> _World:
    names = _Names(rng)
    w = _World()
    # a small pool of first names makes people share first names (hard negatives)
    first_pool = [names.word(2) for _ in range(max(50, cfg.num_people // 12))]
    for i in range(cfg.num_countries):
        w.countries.append({"name": names.unique(lambda: names.word(3)), "id": i})
    for i in range(cfg.num_cities):
        w.cities.append({"name": names.unique(lambda: names.word(2)), "id": i,
                         "country": i % cfg.num_countries if i < cfg.num_countries
                         else rng.randrange(cfg.num_countries),
                         "founded": rng.randrange(900, 1900)})
    for c in w.countries:  # the first city of each country is its capital
        c["capital"] = c["id"]
    for i in range(cfg.num_orgs):
        w.orgs.append({"name": names.unique(lambda: f"{names.word(2)} {rng.choice(_ORG_SUFFIX)}"),
                       "id": i, "founded": rng.randrange(1850, 2020),
                       "hq": rng.randrange(cfg.num_cities), "industry": rng.choice(_INDUSTRY)})
    for i in range(cfg.num_people):
        w.people.append({"name": names.unique(lambda: f"{rng.choice(first_pool)} {names.word(2)}"),
                         "id": i, "born": rng.randrange(1900, 2000),
                         "birthplace": rng.randrange(cfg.num_cities),
                         "employer": rng.randrange(cfg.num_orgs),
                         "occupation": rng.choice(_OCCUPATION)})
    for o in w.orgs:
        o["founder"] = rng.randrange(cfg.num_people)
    return w


# ------------------------------------------------------------------ passages
def _passages(w: _World, rng: random.Random) -> tuple[list[Passage], dict]:
    """All passages, and ``gold[(kind, id, relation)] -> passage id``."""
    out: list[Passage] = []
    gold: dict[tuple[str, int, str], str] = {}

    def add(title: str, text: str, *keys) -> None:
        pid = f"w{len(out)}"
        out.append(Passage(pid, title, text))
        for k in keys:
            gold[k] = pid

    C, O, P, K = w.cities, w.orgs, w.people, w.countries
    for k in K:
        cap = C[k["capital"]]["name"]
        add(k["name"], rng.choice([
            f"{k['name']} is a country whose capital and largest city is {cap}.",
            f"The capital of {k['name']} is {cap}, seat of its parliament.",
        ]), ("country", k["id"], "capital"))
    for c in C:
        country = K[c["country"]]["name"]
        add(c["name"], rng.choice([
            f"{c['name']} is a city in {country}. It was founded in {c['founded']}.",
            f"Founded in {c['founded']}, {c['name']} lies in {country}.",
            f"{c['name']} ({c['founded']}) is a city of {country} known for its markets.",
        ]), ("city", c["id"], "country"), ("city", c["id"], "founded"))
        other = C[rng.randrange(len(C))]["name"]
        add(c["name"], rng.choice([
            f"{c['name']} is linked to {other} by a railway opened in the nineteenth century.",
            f"Travellers from {c['name']} often visit {other} for its annual fair.",
        ]))
    for o in O:
        founder, city = P[o["founder"]]["name"], C[o["hq"]]["name"]
        add(o["name"], rng.choice([
            f"{o['name']} was founded in {o['founded']} by {founder}.",
            f"{founder} founded {o['name']} in {o['founded']}.",
            f"Established by {founder} in {o['founded']}, {o['name']} grew quickly.",
        ]), ("org", o["id"], "founder"), ("org", o["id"], "founded"))
        add(o["name"], rng.choice([
            f"{o['name']} is {_a(o['industry'])} company headquartered in {city}.",
            f"The headquarters of {o['name']}, {_a(o['industry'])} firm, are in {city}.",
            f"Based in {city}, {o['name']} works in {o['industry']}.",
        ]), ("org", o["id"], "hq"))
    for p in P:
        city, org = C[p["birthplace"]]["name"], O[p["employer"]]["name"]
        add(p["name"], rng.choice([
            f"{p['name']} (born {p['born']} in {city}) is {_a(p['occupation'])}.",
            f"{p['name']} was born in {city} in {p['born']}.",
            f"Born in {p['born']} in {city}, {p['name']} became {_a(p['occupation'])}.",
        ]), ("person", p["id"], "birthplace"), ("person", p["id"], "born"))
        add(p["name"], rng.choice([
            f"{p['name']} works for {org} as {_a(p['occupation'])}.",
            f"{p['name']} is {_a(p['occupation'])} employed by {org}.",
            f"At {org}, {p['name']} has worked as {_a(p['occupation'])} for years.",
        ]), ("person", p["id"], "employer"))
        q = P[rng.randrange(len(P))]
        place = C[rng.randrange(len(C))]["name"]
        add(p["name"], rng.choice([
            f"{p['name']} met {q['name']} at a conference in {place}.",
            f"{p['name']} and {q['name']} wrote a report on {place} together.",
            f"{p['name']} once visited {place} with {q['name']}.",
        ]))
    return out, gold


# ------------------------------------------------------------------ questions
def _hop(query: str, answer: str, pid: str) -> dict:
    return {"query": query, "answer": answer, "gold_passage": pid}


def _questions(w: _World, gold: dict, cfg: WikiConfig, rng: random.Random) -> list[QAExample]:
    C, O, P, K = w.cities, w.orgs, w.people, w.countries

    def person_birthplace(p):
        c = C[p["birthplace"]]
        return _hop(f"{p['name']} born", c["name"], gold["person", p["id"], "birthplace"]), c

    def person_employer(p):
        o = O[p["employer"]]
        return _hop(f"{p['name']} works for", o["name"], gold["person", p["id"], "employer"]), o

    def org_hq(o):
        c = C[o["hq"]]
        return _hop(f"{o['name']} headquarters", c["name"], gold["org", o["id"], "hq"]), c

    def org_founder(o):
        p = P[o["founder"]]
        return _hop(f"{o['name']} founded by", p["name"], gold["org", o["id"], "founder"]), p

    def city_country(c):
        k = K[c["country"]]
        return _hop(f"{c['name']} city country", k["name"], gold["city", c["id"], "country"]), k

    def country_capital(k):
        c = C[k["capital"]]
        return _hop(f"{k['name']} capital", c["name"], gold["country", k["id"], "capital"]), c

    def year(kind, e, rel, phrase):
        return _hop(f"{e['name']} {phrase}", str(e[rel]), gold[kind, e["id"], rel]), None

    def chain(start, steps):
        hops, e = [], start
        for f in steps:
            h, e = f(e)
            hops.append(h)
        return hops

    templates = [
        # (hops, source, question, steps)
        (1, P, "Where was {} born?", [person_birthplace]),
        (1, P, "In what year was {} born?", [lambda p: year("person", p, "born", "born")]),
        (1, P, "Which organisation does {} work for?", [person_employer]),
        (1, O, "Who founded {}?", [org_founder]),
        (1, O, "In what year was {} founded?", [lambda o: year("org", o, "founded", "founded")]),
        (1, O, "In which city is {} headquartered?", [org_hq]),
        (2, P, "In which country was {} born?", [person_birthplace, city_country]),
        (2, P, "In what year was the organisation that {} works for founded?",
         [person_employer, lambda o: year("org", o, "founded", "founded")]),
        (2, P, "In which city is the employer of {} headquartered?", [person_employer, org_hq]),
        (2, O, "Where was the founder of {} born?", [org_founder, person_birthplace]),
        (2, O, "In which country is {} headquartered?", [org_hq, city_country]),
        (3, P, "In which country is the organisation that {} works for headquartered?",
         [person_employer, org_hq, city_country]),
        (3, P, "Where was the founder of the organisation that {} works for born?",
         [person_employer, org_founder, person_birthplace]),
        (3, O, "In which country was the founder of {} born?",
         [org_founder, person_birthplace, city_country]),
        (3, P, "What is the capital of the country where {} was born?",
         [person_birthplace, city_country, country_capital]),
    ]
    out: list[QAExample] = []
    for t_idx, (n_hops, source, text, steps) in enumerate(templates):
        picks = rng.sample(range(len(source)), min(cfg.questions_per_template, len(source)))
        for i in picks:
            e = source[i]
            hops = chain(e, steps)
            out.append(QAExample(
                qid=f"q{t_idx}-{i}", question=text.format(e["name"]),
                golden_answers=(hops[-1]["answer"],), hops=n_hops,
                gold_passages=tuple(h["gold_passage"] for h in hops),
                oracle_queries=tuple(h["query"] for h in hops),
                hop_answers=tuple(h["answer"] for h in hops)))
    return out


def generate_wiki(cfg: WikiConfig = WikiConfig()) -> tuple[list[Passage], dict[str, list[QAExample]]]:
    """Returns the passages and the question splits ``{"train": [...], "test": [...]}``."""
    rng = random.Random(cfg.seed)
    world = _build_world(cfg, rng)
    passages, gold = _passages(world, rng)
    questions = _questions(world, gold, cfg, rng)
    rng.shuffle(questions)
    n_test = int(round(len(questions) * cfg.test_fraction))
    return passages, {"test": questions[:n_test], "train": questions[n_test:]}
