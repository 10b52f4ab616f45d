"""Tool-call throughput: sandboxed Python calls/s (one boxed subprocess per call),
calculator evaluations/s, and tool-env steps/s with oracle actions."""

from __future__ import annotations

import time

import turngym  # noqa: F401
from turngym.envs.tools import evaluate, run_python
from turngym.envs.tools.shop_env import ToolShopEnv


def rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


if __name__ == "__main__":
    py = rate(lambda: run_python("print(sum(i * i for i in range(1000)))"), 50)
    calc = rate(lambda: evaluate("sqrt(16) + 12 * (3.5 - 1) / 7 ** 2"), 20000)
    env = ToolShopEnv()
    state = {"seed": 0}

    def step():
        if env.done:
            env.reset(seed=state["seed"])
            state["seed"] += 1
        env.step(env.oracle_action())
    env.reset(seed=0)
    shop = rate(step, 3000)
    print(f"sandboxed python: {py:,.0f} calls/s (one boxed subprocess each)")
    print(f"calculator: {calc:,.0f} evaluations/s")
    print(f"shop env: {shop:,.0f} steps/s (oracle tool calls, includes resets)")
