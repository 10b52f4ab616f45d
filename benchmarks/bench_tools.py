"""Tool-call throughput, side by side in one run.

* sandboxed python calls/s: the old unisolated path (``unsafe-inprocess``: a child
  process with rlimits and the audit hook) next to the bubblewrap sandbox, cold (each
  call starts bwrap + an interpreter on its critical path) and with 1, 2 and 4 sandboxes
  started ahead of time, sequentially and with two calls in flight (a batch of calls on
  both cores);
* calculator evaluations/s and tool-env steps/s with oracle actions.

    python benchmarks/bench_tools.py [--calls 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from turngym.envs.tools import SandboxConfig, SandboxLimits, evaluate, run_python
from turngym.envs.tools.sandbox import shutdown_sandboxes
from turngym.envs.tools.shop_env import ToolShopEnv

import turngym  # noqa: F401

CODE = "print(sum(i * i for i in range(1000)))"
EXPECT = str(sum(i * i for i in range(1000)))


def rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def python_rate(config: SandboxConfig, calls: int, workers: int = 1) -> tuple[float, float]:
    """(calls/s, median seconds per call) for ``calls`` calls, ``workers`` in flight."""
    lim = SandboxLimits()

    def one(_=None) -> float:
        r = run_python(CODE, lim, config)
        assert r.ok and r.stdout.strip() == EXPECT, r
        return r.seconds
    for _ in range(3):  # start the launcher and the warm sandboxes
        one()
    t0 = time.perf_counter()
    if workers == 1:
        secs = [one() for _ in range(calls)]
    else:
        with ThreadPoolExecutor(workers) as ex:
            secs = list(ex.map(one, range(calls)))
    return calls / (time.perf_counter() - t0), statistics.median(secs)


def old_path_config() -> SandboxConfig:
    """The pre-bubblewrap design.  As root it ran as root wherever ``nobody`` could not
    start the interpreter (silently); the benchmark names that explicitly."""
    if os.geteuid() == 0:
        try:
            subprocess.run([sys.executable, "-c", "pass"], user=65534, group=65534,
                           extra_groups=[], capture_output=True, timeout=30, check=False)
        except PermissionError:
            return SandboxConfig(isolation="unsafe-inprocess", user="root")
    return SandboxConfig(isolation="unsafe-inprocess")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=100)
    a = p.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"{a.calls} calls of {CODE!r} per row")
    rows = [("old path: unsafe-inprocess (no OS isolation)", old_path_config(), 1)]
    for warm in (0, 1, 2, 4):
        rows.append((f"bwrap, {warm} warm" + (" (cold start per call)" if warm == 0 else ""),
                     SandboxConfig(warm=warm), 1))
    rows.append(("bwrap, 2 warm, 2 calls in flight", SandboxConfig(warm=2), 2))
    rows.append(("bwrap, 4 warm, 2 calls in flight", SandboxConfig(warm=4), 2))
    base = None
    for name, cfg, workers in rows:
        cps, med = python_rate(cfg, a.calls, workers)
        shutdown_sandboxes()  # warm sandboxes of one row do not compete with the next
        base = base or cps
        print(f"  {name:48s} {cps:6.1f} calls/s  median {med * 1000:5.1f} ms/call  "
              f"({cps / base:.2f}x old)")
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
    print(f"calculator: {calc:,.0f} evaluations/s")
    print(f"shop env: {shop:,.0f} steps/s (oracle tool calls, includes resets)")
