"""The text world's names (``envs/textworld/names.py``): the name corpus behind the warm
start's ``lm_epochs`` / ``lm_mix``, and the renaming behind ``warmstart.rename``, which
makes every catalog name an action target so a policy can say names the demonstrations
never used."""

import json
import random
import re

import pytest
import torch
from turngym.agents.numerics import token_logprobs
from turngym.agents.observation import ObservationView
from turngym.agents.tiny import build_tiny_tokenizer
from turngym.envs.textworld import TextWorldEnv
from turngym.envs.textworld.catalog import APPLIANCE, RECEPTACLES, lexicon
from turngym.envs.textworld.names import MAX_NUMBER, name_corpus, renamer
from turngym.trainers.demos import collect_demos, renamed_demos
from turngym.trainers.metrics import MetricsLogger
from turngym.trainers.runtime import env_factory
from turngym.trainers.warmstart import run_warmstart

from turngym.config import load_config

SMALL = ["warmstart.num_demos=24", "warmstart.epochs=3", "warmstart.batch_size=8",
         "warmstart.epsilon=0.0", "warmstart.corrupt=0.0", "model.hidden_size=32",
         "model.num_layers=1", "model.num_heads=2", "agent.max_turns=8"]


def test_corpus_names_every_catalog_entity_as_one_token_and_holds_no_task():
    lines = name_corpus()
    assert lines == name_corpus() and lines != name_corpus(seed=1)
    text = "\n".join(lines)
    tok = build_tiny_tokenizer([text], TextWorldEnv.vocabulary())
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    seen = set(tok.convert_ids_to_tokens(ids))
    names = {f"{w} {n}" for w in lexicon() for n in range(1, MAX_NUMBER + 1)}
    assert names <= seen  # each as ONE fused token
    assert not any("task" in line.lower() for line in lines)
    assert any(line.startswith("go to ") and line[6:].rsplit(" ", 1)[0] in RECEPTACLES
               for line in lines)
    assert TextWorldEnv.lm_corpus() == lines


def _load(out):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(out / "warmstart")
    return tok, AutoModelForCausalLM.from_pretrained(out / "warmstart").eval()


def _warm(tmp_path, name, extra):
    out = tmp_path / name
    cfg = load_config("quickstart", SMALL + [f"output_dir={out}", *extra])
    run_warmstart(cfg, out, MetricsLogger(out / "metrics.jsonl"), progress=False)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, cfg, recs


def _corpus_nll(out):
    """Mean NLL per token of held-out corpus sentences (another seed's fillers)."""
    tok, model = _load(out)
    tot, n = 0.0, 0
    with torch.no_grad():
        for line in name_corpus(seed=1)[:300]:
            ids = torch.tensor([tok(line, add_special_tokens=False)["input_ids"]])
            lp = token_logprobs(model(ids).logits, ids)[0, 1:]
            tot, n = tot - float(lp.sum()), n + lp.numel()
    return tot / n


@pytest.mark.parametrize("mode", ["mix", "pass"])
def test_lm_corpus_is_learned_as_a_pass_or_mixed_into_sft(tmp_path, mode):
    base, _, _ = _warm(tmp_path, "base", [])
    # short rows: the corpus (~12k tokens) then gives enough optimizer steps to learn
    extra = ["warmstart.lm_row_tokens=64"] + (
        ["warmstart.lm_mix=true"] if mode == "mix" else ["warmstart.lm_epochs=2"])
    named, _, recs = _warm(tmp_path, mode, extra)
    done = next(r for r in recs if r["phase"] == "sft_done")
    if mode == "mix":
        assert done["lm_rows"] > 0 and done["rows"] == done["demos"] + done["lm_rows"]
        assert not any(r["phase"] == "lm_done" for r in recs)
    else:
        assert done["lm_rows"] == 0 and any(r["phase"] == "lm_done" for r in recs)
    nll_base, nll_named = _corpus_nll(base), _corpus_nll(named)
    assert nll_named < 0.8 * nll_base, (nll_base, nll_named)


@pytest.mark.parametrize("option,missing", [("warmstart.lm_mix=true", "lm_corpus"),
                                              ("warmstart.rename=0.5", "renamer")])
def test_an_option_needs_an_env_that_offers_it(tmp_path, option, missing):
    """The tool-math env has neither a name corpus nor a renamer: refused by name."""
    cfg = load_config("tool_math_grpo", [f"output_dir={tmp_path}", option,
                                       "warmstart.num_demos=2", "model.hidden_size=32",
                                       "model.num_layers=1", "model.num_heads=2"])
    with pytest.raises(ValueError, match=missing):
        run_warmstart(cfg, tmp_path, MetricsLogger(tmp_path / "metrics.jsonl"), progress=False)


# ---- renaming ------------------------------------------------------------------------

def _names(text):
    return re.findall(r"\b([a-z]+) (\d)\b", text)


def test_a_renaming_is_consistent_keeps_each_types_part_and_the_names_order():
    room = ("You see a cabinet 1, a cabinet 2, a countertop 1, a drawer 1, a fridge 1, "
            "a shelf 1, and a shelf 3.")
    goal = "Your task is to: put a clean plate 2 in countertop."
    moved = 0
    for seed in range(40):
        f = renamer(random.Random(seed), [room, goal])
        assert f(room) == renamer(random.Random(seed), [room, goal])(room)  # rng decides
        old, new = _names(room), _names(f(room))
        assert len(set(new)) == len(new)  # distinct names stay distinct
        for (w, _), (v, _) in zip(old, new):
            assert (v in RECEPTACLES) and RECEPTACLES[v] == RECEPTACLES[w]  # openable stays
            assert (v == w) or (w not in APPLIANCE.values() and v not in APPLIANCE.values())
        assert new[4][0] == "fridge"  # the appliance a cool task needs keeps its name
        # name order (the oracle's search order) and same-type grouping are kept
        assert sorted(new, key=lambda p: (p[0], int(p[1]))) == new
        assert [w for w, _ in old].count("shelf") == [w for w, _ in new].count(new[5][0]) == 2
        # the goal's bare type follows its numbered names; the object keeps its type
        counter = new[2][0]
        assert f(goal).startswith("Your task is to: put a clean plate ") and f(goal).endswith(
            f" in {counter}.")
        assert f("the countertops of the desklampx") == "the countertops of the desklampx"
        moved += new != old
    assert moved >= 30


def test_renamed_demos_are_coherent_and_leave_the_rest_untouched():
    cfg = load_config("quickstart", SMALL)
    demos = collect_demos(env_factory(cfg, "train"), 12, 0.0, 0, 8,
                          view=ObservationView(admissible=True))
    out = renamed_demos(demos, TextWorldEnv.renamer, 0.5, seed=3)
    assert out == renamed_demos(demos, TextWorldEnv.renamer, 0.5, seed=3)
    changed = [(a, b) for a, b in zip(demos, out) if a is not b]
    assert 0 < len(changed) < len(demos)
    assert renamed_demos(demos, TextWorldEnv.renamer, 0.0, seed=3) == demos
    for old, new in changed:
        assert new.task_id == old.task_id and len(new.steps) == len(old.steps)
        assert new.first_observation != old.first_observation
        # each expert action is still one of the admissible commands printed before it
        shown = (new.first_observation,) + tuple(o for _, o, _ in new.steps)
        for (a, _, _), before in zip(new.steps, shown):
            assert a in before.rsplit("\nAdmissible: ", 1)[1].split(" | ")


def test_renaming_makes_names_the_demos_never_said_action_targets(tmp_path):
    name = re.compile(r"\b([a-z]+ \d)\b")

    def targets(demos):
        return {n for d in demos for a, _, _ in d.steps for n in name.findall(a)}

    cfg = load_config("quickstart", SMALL)
    demos = collect_demos(env_factory(cfg, "train"), 60, 0.0, 0, 25)
    plain = targets(demos)
    renamed = targets(renamed_demos(demos, TextWorldEnv.renamer, 0.5, seed=0))
    # half the demos renamed: far more of the catalog is said, types the seen layouts
    # never hold among them
    assert len(renamed) > 1.5 * len(plain)
    assert {n.rsplit(" ", 1)[0] for n in renamed - plain} - {
        n.rsplit(" ", 1)[0] for n in plain}
    # and the warm start trains on them: the log says how many demos were renamed
    _, _, recs = _warm(tmp_path, "renamed", ["warmstart.rename=0.5"])
    done = next(r for r in recs if r["phase"] == "sft_done")
    assert 0 < done["renamed"] < done["demos"]


def test_rename_is_a_probability():
    with pytest.raises(ValueError, match="warmstart.rename"):
        load_config("quickstart", ["warmstart.rename=1.5"])
