"""Gold-answer scoring at every turn boundary (IGPO / TRACE): packed single pass vs
one forward of the trajectory (goal <= 1.5x) and vs one forward per boundary (naive).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
from turngym.credit.scoring import GoldScorer, naive_score, response_starts
from turngym.types import StopReason, Trajectory, TrajectoryGroup, Turn


def make_group(n, turns, obs_tokens, resp_tokens, vocab, seed=0):
    rng = random.Random(seed)
    trajs = []
    for _ in range(n):
        ts = []
        for t in range(turns):
            p = tuple(rng.randrange(6, vocab) for _ in range(obs_tokens))
            r = tuple(rng.randrange(6, vocab) for _ in range(resp_tokens))
            ts.append(Turn(p, r, (1,) * len(r), (0.0,) * len(r), "a", "o"))
        trajs.append(Trajectory(tuple(ts), 0.0, False, StopReason.ANSWERED, "t", "g",
                                info={"gold_answer": ["alpha beta gamma"]}))
    return TrajectoryGroup(tuple(trajs), "t")


def timed(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(hidden, layers, turns, obs_tokens, resp_tokens, n):
    words = "alpha beta gamma delta".split()
    tok = build_tiny_tokenizer([" ".join(words)] * 2, words + [f"w{i}" for i in range(2000)])
    model = build_tiny_model(tok, hidden, layers, max(2, hidden // 64), max_positions=4096).eval()
    group = make_group(n, turns, obs_tokens, resp_tokens, len(tok))
    trajs = list(group)
    scorer = GoldScorer(model, tok, max_batch_tokens=1 << 30)
    pos = [response_starts(t) for t in trajs]
    gold = [t.info["gold_answer"] for t in trajs]
    ans = scorer.answer_ids(gold[0][0])
    L = len(trajs[0].token_ids())

    def one_forward():  # the trajectory alone, same batch
        with torch.no_grad():
            model(input_ids=torch.tensor([t.token_ids() for t in trajs]))

    def packed():
        scorer.score([t.token_ids() for t in trajs], pos, gold)

    def naive():
        for t, p in zip(trajs, pos):
            naive_score(model, t.token_ids(), p, ans)

    t1, tp, tn = timed(one_forward), timed(packed), timed(naive, repeats=1)
    print(f"hidden {hidden} x {layers} layers, {n} trajectories x {turns} turns ({L} tokens, "
          f"{len(ans)}-token answer): one forward {t1 * 1e3:7.1f} ms | packed {tp * 1e3:7.1f} ms"
          f" ({tp / t1:.2f}x, goal <= 1.5x) | naive {tn * 1e3:8.1f} ms ({tn / tp:.1f}x slower "
          f"than packed)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    run(128, 3, 4, 80, 12, 16)     # search QA sized
    run(128, 3, 15, 30, 10, 16)    # text world sized
    run(384, 6, 8, 80, 16, 8)      # a wider model, longer context
