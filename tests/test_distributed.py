"""Data-parallel updates: N gloo ranks on CPU must make the 1-rank update on the same
global batch (issue 7, part 3)."""

import random

import pytest
import torch
import torch.multiprocessing as mp

from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
from turngym.config import load_config
from turngym.trainers.distributed import World
from turngym.trainers.fsdp import full_state_dict, shard_model
from turngym.trainers.update import PolicyGradientTrainer, split_even
from turngym.types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn

TEXTS = ["go to the cabinet 1 and open it", "take the apple 2 from the fridge 1",
         "put the mug 3 in the sink 1", "look around the kitchen slowly"]


def _model():
    tok = build_tiny_tokenizer(TEXTS)
    return tok, build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)


def _batch(vocab: int, n_groups: int, seed: int = 0):
    """Random groups of 2-turn trajectories with random per-turn advantages."""
    rng = random.Random(seed)
    groups, credits = [], []
    for g in range(n_groups):
        trajs, advs = [], []
        for _ in range(rng.randint(2, 4)):
            turns = []
            for _ in range(2):
                p = [rng.randrange(6, vocab) for _ in range(rng.randint(3, 9))]
                r = [rng.randrange(6, vocab) for _ in range(rng.randint(1, 5))]
                turns.append(Turn(tuple(p), tuple(r), (1,) * len(r),
                                      tuple(-1.0 for _ in r), "a", "o"))
            trajs.append(Trajectory(tuple(turns), 0.0, False, StopReason.MAX_TURNS, f"t{g}",
                                    f"t{g}#0"))
            advs.append(tuple(rng.uniform(-1, 1) for _ in turns))
        groups.append(TrajectoryGroup(tuple(trajs), f"t{g}"))
        credits.append(CreditAssignment(tuple(advs)))
    return groups, credits


def _trainer(model, tok, world=None, overrides=()):
    cfg = load_config("quickstart", ["rl.recompute_logprobs=true", "rl.lr=0.01",
                                     "rl.token_budget=64", *overrides]).rl
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return PolicyGradientTrainer(model, opt, cfg, tok.pad_token_id, world=world)


def _run(world, n_groups, steps, overrides, fsdp=False):
    torch.manual_seed(0)
    tok, model = _model()
    if fsdp:
        shard_model(model, world)
    trainer = _trainer(model, tok, world, overrides)
    stats = []
    for s in range(steps):
        groups, credits = _batch(len(tok), n_groups, seed=s)
        # rank r takes every size-th group (whole groups, as the pipeline shards tasks)
        stats.append(trainer.update(world.shard(groups), world.shard(credits)))
    state = full_state_dict(model) if fsdp else model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}, stats


def _worker(rank, size, init_file, n_groups, steps, overrides, out, fsdp=False):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=size)
    try:
        state, stats = _run(World(rank, size, rank), n_groups, steps, overrides, fsdp)
        torch.save({"state": state, "stats": stats}, f"{out}.{rank}")
        dist.barrier()  # no rank tears gloo down while the other still has work in flight
    finally:
        dist.destroy_process_group()


def _distributed(tmp_path, size, n_groups, steps, overrides=(), fsdp=False):
    out = tmp_path / "rank.pt"
    mp.start_processes(_worker, args=(size, str(tmp_path / "init"), n_groups, steps,
                                      tuple(overrides), str(out), fsdp),
                       nprocs=size, join=True, start_method="spawn")
    return [torch.load(f"{out}.{r}") for r in range(size)]


@pytest.mark.parametrize("n_groups,overrides,fsdp", [
    (4, ("rl.loss_agg=token_mean",), False),                # even split, token-mean loss
    (3, ("rl.loss_agg=seq_mean_token_mean",), False),       # uneven split, row-mean loss
    (1, ("rl.ppo_epochs=2",), False),                       # rank 1 holds no rows at all
    (3, ("rl.kl_coef=0.0", "rl.minibatches=1"), True),      # FSDP2: sharded, uneven
    (1, (), True),                                          # FSDP2, rank 1 only pads
])
def test_two_ranks_make_the_one_rank_update(tmp_path, n_groups, overrides, fsdp):
    torch.set_num_threads(1)
    one_state, one_stats = _run(World.local(), n_groups, 2, overrides)
    ranks = _distributed(tmp_path, 2, n_groups, 2, overrides, fsdp)
    moved = max(float((one_state[k] - _model()[1].state_dict()[k]).abs().max())
                for k in one_state)
    assert moved > 1e-3  # the update did something
    for two in ranks:  # every rank ends with the 1-rank weights and the same statistics
        for k, v in one_state.items():
            assert torch.allclose(v, two["state"][k], atol=2e-6, rtol=1e-5), k
        for a, b in zip(one_stats, two["stats"]):
            for key in ("pg_loss", "clipfrac", "entropy", "grad_norm", "train_tokens",
                        "response_tokens"):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def test_split_even_gives_every_rank_the_same_number_of_steps():
    assert [len(c) for c in split_even(list(range(10)), 4)] == [3, 3, 2, 2]
    assert [len(c) for c in split_even([1], 3)] == [1, 0, 0]
    assert sum(split_even(list(range(7)), 2), []) == list(range(7))


def test_local_world_collectives_are_identities():
    w = World.local()
    assert w.all_reduce_sum([1.5, 2]) == [1.5, 2.0]
    assert w.all_gather({"a": 1}) == [{"a": 1}]
    assert w.shard([1, 2, 3]) == [1, 2, 3]
    assert World(1, 3).shard(list(range(7))) == [1, 4]


def _sync_worker(rank, size, init_file, out):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=size)
    try:
        world = World(rank, size, rank)
        tok = build_tiny_tokenizer(TEXTS)
        same = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, seed=0)
        world.check_in_sync(same)  # identical replicas pass
        diverged = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, seed=rank)
        try:
            world.check_in_sync(diverged)
            result = "no error"
        except RuntimeError as exc:
            result = str(exc)
        with open(f"{out}.{rank}", "w") as f:
            f.write(result)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_diverged_replicas_are_detected(tmp_path):
    out = tmp_path / "sync"
    mp.start_processes(_sync_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2,
                       join=True, start_method="spawn")
    for r in range(2):
        assert "ranks [1] hold different weights" in (tmp_path / f"sync.{r}").read_text()
