import pytest

from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.demos import collect_demos, corrupt_action, demo_rows, demo_texts

pytestmark = pytest.mark.fast


def test_noise_injected_demos_succeed_and_mask_injected_actions(tiny_stack):
    tok, _, prompter = tiny_stack
    demos = collect_demos(lambda: TextWorldEnv(), 30, epsilon=0.2, seed=0, max_turns=50,
                          corrupt=0.2)
    assert len(demos) == 30
    noisy = [s for d in demos for s in d.steps if not s[2]]
    assert noisy and any(o == "Nothing happens." for _, o, _ in noisy)
    rows = demo_rows(demos, prompter, tok, "<action> {action} </action>", 10_000)
    rows_all = demo_rows(demos, prompter, tok, "<action> {action} </action>", 10_000,
                         train_on_noise=True)
    n_expert = sum(1 for d in demos for s in d.steps if s[2])
    n_eos = lambda r: sum(1 for i, m in zip(r.ids, r.mask) if m and i == tok.eos_token_id)
    assert sum(n_eos(r) for r in rows) == n_expert  # one trained response per expert step
    assert sum(n_eos(r) for r in rows_all) == n_expert + len(noisy)
    assert all(len(r.ids) == len(r.mask) for r in rows)
    assert demo_texts(demos[:1])[0].startswith("-= Welcome")


def test_collect_is_deterministic_and_corruption_changes_one_word():
    import random
    a = collect_demos(lambda: TextWorldEnv(), 5, 0.3, seed=7, max_turns=50, corrupt=0.1)
    b = collect_demos(lambda: TextWorldEnv(), 5, 0.3, seed=7, max_turns=50, corrupt=0.1)
    assert a == b
    out = corrupt_action("go to cabinet 1", ["apple"], random.Random(0))
    assert sum(x != y for x, y in zip(out.split(), "go to cabinet 1".split())) == 1
