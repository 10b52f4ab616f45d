"""The seed-level interval reported beside the bootstrap's."""

import numpy as np
import pytest
from scipy import stats
from turngym.trainers.compare import paired_bootstrap
from turngym.trainers.stats import seed_t_interval

pytestmark = pytest.mark.fast


def test_seed_t_interval_matches_the_textbook_formula():
    lo, hi = seed_t_interval([0.1, 0.2, 0.3])
    half = 4.302652729911275 * 0.1 / np.sqrt(3)  # t_{0.975, df=2}
    assert (lo, hi) == pytest.approx((0.2 - half, 0.2 + half))
    assert seed_t_interval([0.4]) is None
    assert seed_t_interval([0.05, 0.05]) == pytest.approx([0.05, 0.05])


def test_three_seed_bootstrap_is_narrower_than_the_t_interval_it_is_reported_beside():
    """Three seeds whose paired differences vary from seed to seed: the two-level
    bootstrap's interval is about half as wide as the seed-level t interval, which is why
    both are reported (the t interval was wider on 13 of the quickstart's 14 variant
    arms, median 2.3x)."""
    rng = np.random.default_rng(0)
    base = [rng.random(200) < p for p in (0.45, 0.36, 0.46)]
    arm = [rng.random(200) < p for p in (0.30, 0.40, 0.31)]
    st = paired_bootstrap({"base": base, "arm": arm}, "base", n_boot=4000)
    d = st["vs_baseline"]["arm"]
    per_seed = [a.mean() - b.mean() for a, b in zip(arm, base)]
    assert d["ci95_t"] == pytest.approx(seed_t_interval(per_seed))
    boot_w = d["ci95"][1] - d["ci95"][0]
    t_w = d["ci95_t"][1] - d["ci95_t"][0]
    assert t_w > 1.5 * boot_w
    assert stats.t.ppf(0.975, 2) > 4.3  # df = seeds - 1, not a normal quantile


def test_a_task_effect_shared_by_every_seed_is_not_averaged_away():
    """Every seed plays the same evaluation tasks, so a task on which the arm does better
    does so on every seed. With eight identical seeds the paired difference is only as
    certain as its task sample: half-width ~ 1.96 sd(task effect) / sqrt(T), not that over
    sqrt(seeds x T) as when tasks are resampled separately per seed."""
    rng = np.random.default_rng(1)
    S, T = 8, 60
    effect = rng.choice([-0.3, 0.3], T)
    base_p = rng.uniform(0.3, 0.7, T)
    st = paired_bootstrap({"base": [base_p] * S, "arm": [base_p + effect] * S}, "base",
                          n_boot=4000)
    lo, hi = st["vs_baseline"]["arm"]["ci95"]
    assert (hi - lo) / 2 == pytest.approx(1.96 * effect.std() / np.sqrt(T), rel=0.15)
    assert lo < effect.mean() < hi
    # and each estimator's own interval carries the spread of task difficulty
    lo, hi = st["estimators"]["base"]["ci95"]
    assert (hi - lo) / 2 == pytest.approx(1.96 * base_p.std() / np.sqrt(T), rel=0.15)
    assert st["resample"].startswith("seeds and tasks crossed")


def test_unpaired_data_is_refused_not_truncated():
    """Arms must share seeds and tasks: a shorter task list (another evaluation) or a
    missing seed is an error, never silently cut to the shortest."""
    a = [np.ones(10), np.ones(10)]
    with pytest.raises(ValueError, match="same seeds and tasks"):
        paired_bootstrap({"base": a, "arm": [np.ones(10), np.ones(8)]}, "base", n_boot=10)
    with pytest.raises(ValueError, match="same seeds and tasks"):
        paired_bootstrap({"base": a, "arm": [np.ones(10)]}, "base", n_boot=10)
