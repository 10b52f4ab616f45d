"""``warmstart.rollin``: DAgger-style demonstrations in the learner's own states (the
learner's actions replayed, then the expert finishes), and the SFT round that uses them."""

import json
import random

import pytest
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.demos import demo_rows, rollin_demos
from turngym.trainers.metrics import MetricsLogger
from turngym.trainers.warmstart import run_warmstart

from turngym.config import load_config

SMALL = ["warmstart.num_demos=24", "warmstart.epochs=2", "warmstart.batch_size=8",
         "warmstart.epsilon=0.0", "warmstart.corrupt=0.0", "model.hidden_size=32",
         "model.num_layers=1", "model.num_heads=2", "agent.max_turns=20",
         "agent.max_new_tokens=10"]


def _wanderer(task_seed: int, n: int, rng: random.Random) -> tuple[int, list[str], bool]:
    """A learner that plays ``n`` random admissible or made-up actions."""
    env = TextWorldEnv(max_turns=40)
    _, info = env.reset(seed=task_seed)
    acts, won = [], False
    for _ in range(n):
        a = rng.choice(info["admissible_commands"] + ["move mug 9 to shelf 9"])
        _, r, term, _, info = env.step(a)
        acts.append(a)
        if term:
            won = r > 0
            break
    return task_seed, acts, won


def test_rollin_demos_replay_a_learner_prefix_then_the_expert_wins():
    rng = random.Random(0)
    played = [_wanderer(t, 12, rng) for t in range(30)]
    demos = rollin_demos(lambda: TextWorldEnv(max_turns=40), played, 40, seed=0)
    assert len(demos) >= 20
    assert demos == rollin_demos(lambda: TextWorldEnv(max_turns=40), played, 40, seed=0)
    env = TextWorldEnv(max_turns=40)
    by_task = {str(env.reset(seed=t)[1]["task_id"]): (t, acts) for t, acts, _ in played}
    assert len(by_task) == len(played)
    for d in demos:
        flags = [e for _, _, e in d.steps]
        k = flags.index(True)
        assert k >= 1 and all(flags[k:]) and not any(flags[:k])  # learner, then expert
        task_seed, acts = by_task[d.task_id]
        assert [a for a, _, _ in d.steps[:k]] == acts[:k]
        # the expert's actions are the oracle's from the state the prefix reached, and win
        env.reset(seed=task_seed)
        for a, o, expert in d.steps:
            if expert:
                assert a == env.oracle_action()
            obs, r, term, _, _ = env.step(a)
            assert obs == o
        assert term and r == 1.0


def test_rollin_rows_train_only_the_expert_part(tiny_stack):
    tok, _, prompter = tiny_stack
    rng = random.Random(1)
    played = [_wanderer(t, 6, rng) for t in range(8)]
    demos = rollin_demos(lambda: TextWorldEnv(max_turns=30), played, 30, seed=1)
    fmt = "<action> {action} </action>"
    rows = demo_rows(demos, prompter, tok, fmt, 10_000)
    for d, row in zip(demos, rows):
        n_expert = sum(e for _, _, e in d.steps)
        trained = sum(len(tok(fmt.format(action=a), add_special_tokens=False)["input_ids"]) + 1
                      for a, _, e in d.steps if e)
        assert sum(row.mask) == trained and n_expert >= 1


def test_warm_start_runs_a_rollin_round_and_logs_it(tmp_path):
    out = tmp_path / "rollin"
    # enough SFT that the learner says some actions (an unparseable one ends its prefix)
    cfg = load_config("quickstart", SMALL + [f"output_dir={out}", "warmstart.rollin=16",
                                             "warmstart.epochs=8", "warmstart.num_demos=48",
                                             "model.hidden_size=64"])
    run_warmstart(cfg, out, MetricsLogger(out / "metrics.jsonl"), progress=False)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    done = next(r for r in recs if r["phase"] == "rollin_done")
    assert done["episodes"] == 16 and 0 < done["demos"] <= 16
    assert done["mixed_demos"] == done["demos"]  # as many original demos as new ones
    assert done["rows"] == done["demos"] + done["mixed_demos"]  # one row per demo (full mode)
    assert (out / "warmstart").is_dir()


@pytest.mark.parametrize("bad", ["warmstart.rollin=-1", "warmstart.rollin_epochs=0",
                                 "warmstart.rollin=10 warmstart.enabled=false"])
def test_rollin_settings_are_checked(bad):
    with pytest.raises(ValueError, match=bad.split("=")[0]):
        load_config("quickstart", bad.split())


def test_an_unparseable_learner_response_ends_the_replayable_prefix():
    env = TextWorldEnv(max_turns=30)
    _, info = env.reset(seed=3)
    first = info["admissible_commands"][0]
    played = [(3, [first, "", "look", "look"], False)] * 5
    demos = rollin_demos(lambda: TextWorldEnv(max_turns=30), played, 30, seed=0)
    assert demos and all([e for _, _, e in d.steps][:2] == [False, True] and
                         d.steps[0][0] == first for d in demos)
    assert rollin_demos(lambda: TextWorldEnv(max_turns=30), [(3, ["", "look"], False)], 30, 0) == []
