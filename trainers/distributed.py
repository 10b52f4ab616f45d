"""Data-parallel training under ``torchrun`` (one process per GPU, or per CPU with gloo).

Each rank rolls out its own share of the step's tasks (whole groups, so group
baselines stay local), computes credit locally and back-propagates its rows with
the loss normalised by the *global* token (or row) count.  Gradients are then
summed across ranks with one flat all-reduce per optimizer step, so the update
equals the single-process update on the union of the rows (up to float summation
order).  This is DDP's arithmetic, done explicitly so ranks may hold different
numbers of micro-batches (rollout lengths differ) without a collective hanging.

``World.local()`` is the single-process case: every collective is the identity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Sequence, TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @staticmethod
    def local() -> "World":
        return World()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    # ------------------------------------------------------------------ collectives
    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of a float vector across ranks (float64, deterministic order)."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch.distributed as dist
        t = torch.tensor(list(values), dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t)
        return t.cpu().tolist()

    def all_reduce_max(self, value: int) -> int:
        if not self.distributed:
            return int(value)
        import torch.distributed as dist
        t = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def concat_gather(self, items: list[T]) -> list[T]:
        """Every rank's list, concatenated in rank order (the list itself on one process)."""
        if not self.distributed:
            return items
        return [x for part in self.all_gather(items) for x in part]

    def broadcast(self, obj: T, src: int = 0) -> T:
        if not self.distributed:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist
            dist.barrier()

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sums ``.grad`` across ranks in place (one flat buffer per dtype/device).
        A parameter without a gradient on this rank contributes zeros, so every rank
        takes part in the same collectives."""
        if not self.distributed:
            return
        import torch.distributed as dist
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets: dict[tuple, list[torch.nn.Parameter]] = {}
        for p in params:
            buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for group in buckets.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat)
            offset = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n

    def check_in_sync(self, model, what: str = "weights") -> None:
        """Raises if the ranks' copies of ``model`` differ (a float64 checksum per
        parameter tensor, compared across ranks): diverged replicas would otherwise
        train silently on different policies."""
        if not self.distributed:
            return
        with torch.no_grad():
            sums = [float(p.detach().double().sum()) for p in model.parameters()]
        everyone = self.all_gather(sums)
        bad = [r for r, s in enumerate(everyone) if s != everyone[0]]
        if bad:
            raise RuntimeError(f"data-parallel ranks {bad} hold different {what} than rank 0")

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's strided share of ``items`` (rank r takes r, r+size, ...)."""
        return list(items[self.rank::self.size])


def _comm_device() -> torch.device:
    import torch.distributed as dist
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_world(backend: str | None = None, timeout_s: float = 7200.0) -> tuple[World, bool]:
    """Joins the process group ``torchrun`` describes in the environment (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); a plain process gets ``World.local()``.
    The backend is nccl with CUDA, gloo otherwise, unless ``backend`` says.  The flag
    says whether this call created the group (and so should destroy it)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World.local(), False
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group(backend, rank=rank, world_size=size,
                                timeout=timedelta(seconds=timeout_s))
    return World(rank, size, local_rank), owned


def close_world(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
