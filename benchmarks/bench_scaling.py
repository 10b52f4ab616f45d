"""Trainer-update cost of the GPU-path options, measured on CPU, as ratios to the plain
fp32 update of the same batch: bf16 autocast, activation checkpointing, LoRA, and
2 data-parallel gloo ranks (each with half the batch) against 1 rank.

On CPU these ratios say what the options cost in arithmetic, not what they save on a
GPU (bf16 is emulated here; memory peaks are not resettable on CPU).  The GPU numbers
come from benchmarks/gpu_check.sh.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp

from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
from turngym.config import load_config
from turngym.trainers.distributed import World
from turngym.trainers.hardware import enable_gradient_checkpointing
from turngym.trainers.update import PolicyGradientTrainer
from turngym.types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn

WORDS = [f"w{i}" for i in range(2000)]


def _setup(args):
    tok = build_tiny_tokenizer([" ".join(WORDS)])
    model = build_tiny_model(tok, hidden_size=args.hidden, num_layers=args.layers,
                             num_heads=4, seed=0)
    g = torch.Generator().manual_seed(0)
    groups, credits = [], []
    for k in range(args.rows // 8):
        trajs = []
        for _ in range(8):
            p = torch.randint(6, len(tok), (args.tokens - 64,), generator=g).tolist()
            r = torch.randint(6, len(tok), (64,), generator=g).tolist()
            trajs.append(Trajectory((Turn(tuple(p), tuple(r), (1,) * 64, (-7.0,) * 64, "a", "o"),),
                                    0.0, False, StopReason.MAX_TURNS, f"t{k}", f"t{k}#0"))
        groups.append(TrajectoryGroup(tuple(trajs), f"t{k}"))
        adv = torch.randn(8, generator=g).tolist()
        credits.append(CreditAssignment(tuple((a,) for a in adv)))
    return tok, model, groups, credits


def _trainer(model, tok, world=None, precision=None):
    cfg = load_config(None, ["rl.recompute_logprobs=true", "rl.token_budget=8192"]).rl
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    return PolicyGradientTrainer(model, opt, cfg, tok.pad_token_id, world=world,
                                 precision=precision)


def _time(trainer, groups, credits, repeats):
    trainer.update(groups, credits)  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trainer.update(groups, credits)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _rank(rank, size, init, args, q):
    import torch.distributed as dist
    torch.set_num_threads(max(1, args.threads // size))
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=size)
    world = World(rank, size, rank)
    tok, model, groups, credits = _setup(args)
    secs = _time(_trainer(model, tok, world), world.shard(groups), world.shard(credits),
                 args.repeats)
    if rank == 0:
        q.put(secs)
    dist.destroy_process_group()


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _variant(name, args, q):
    """One variant in a fresh process, so its peak resident memory is its own."""
    torch.set_num_threads(args.threads)
    tok, model, groups, credits = _setup(args)
    precision = None
    if name == "bf16 autocast":
        precision = "bfloat16"
    elif name == "activation checkpointing":
        enable_gradient_checkpointing(model)
    elif name == "LoRA r=16":
        from turngym.trainers.lora import add_lora
        model = add_lora(model, load_config(None, ["rl.lora.r=16"]).rl.lora)
    trainer = _trainer(model, tok, precision=precision)
    before = _peak_rss_mb()
    secs = _time(trainer, groups, credits, args.repeats)
    q.put((secs, _peak_rss_mb() - before))


def _spawn(target, args_list):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, q)) for a in args_list]
    for p in procs:
        p.start()
    out = q.get()
    for p in procs:
        p.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    tok, base, _, _ = _setup(args)
    n_tok = args.rows * args.tokens
    print(f"model {sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params, "
          f"{args.rows} rows x {args.tokens} tokens, {args.threads} threads; each variant in "
          "its own process (memory: peak RSS growth during the updates)")
    names = ["fp32", "bf16 autocast", "activation checkpointing"]
    try:
        import peft  # noqa: F401
        names.append("LoRA r=16")
    except ImportError:
        pass
    names.append("fp32")  # again: the spread of the two fp32 rows is this machine's noise
    base_secs = base_mem = None
    for name in names:
        secs, mem = _spawn(_variant, [(name, args)])
        base_secs, base_mem = base_secs or secs, base_mem or mem
        print(f"  {name:<26s} {secs:6.2f} s/update  {n_tok / secs:9,.0f} tok/s  "
              f"x{secs / base_secs:.2f} time  +{mem:6.0f} MB peak (x{mem / base_mem:.2f})")
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        secs2 = _spawn(_rank, [(r, 2, init, args) for r in range(2)])
    print(f"  {'2 gloo ranks (half each)':<26s} {secs2:6.2f} s/update  {n_tok / secs2:9,.0f} "
          f"tok/s  x{secs2 / base_secs:.2f} of 1 rank")


if __name__ == "__main__":
    main()
