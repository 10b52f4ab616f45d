"""FSDP2 sharding for the RL update (``rl.data_parallel: fsdp`` under torchrun).

Each decoder layer and the root are ``fully_shard``-ed over all ranks, so parameters,
gradients and AdamW state are split ``world_size`` ways instead of replicated.  The
update keeps the replicated path's arithmetic: the loss is normalised by the global
token count and gradients are *summed* (divide factor 1), and every rank runs the same
number of micro-batches (short ranks run zero-weight padding rows), because each FSDP
forward and backward is a collective.

Forwards that are naturally rank-local (sampling with the transformers backend,
answer scoring, entropies, old log-probs) run inside :func:`unsharded`: every sharded
module is unsharded once and kept so, so they issue no collectives and may differ
in number between ranks.  That costs a full copy of the weights for the duration,
as replicated training would; the saving is in gradients and optimizer state.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.distributed.tensor import DTensor

from .distributed import World
from .lora import is_lora


def _fsdp_modules(model) -> list:
    from torch.distributed.fsdp import FSDPModule
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model) -> bool:
    try:
        return bool(_fsdp_modules(model))
    except ImportError:  # pragma: no cover - very old torch
        return False


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of an HF causal LM (``model.model.layers``), found by the
    ``_no_split_modules`` class names transformers declares for them."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot find decoder layers to shard in {type(model).__name__} "
                         "(no _no_split_modules)")
    return layers


def shard_model(model, world: World):
    """Shards ``model`` in place over ``world`` (one mesh dimension) and returns it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if is_lora(model):
        raise ValueError("rl.data_parallel=fsdp with LoRA is not supported; LoRA's "
                         "trainable state is small, use the replicated default")
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (world.size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in _fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)  # the loss already carries the global 1/N
        m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return model


@contextlib.contextmanager
def unsharded(model) -> Iterator[None]:
    """Full parameters on every rank for rank-local forwards (no collectives inside)."""
    mods = _fsdp_modules(model) if is_sharded(model) else []
    if not mods:
        yield
        return
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
    for m in mods:
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.set_reshard_after_forward(True, recurse=False)
            m.reshard()


def full_state_dict(model, cpu: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, unsharded, on every rank (one all-gather per sharded
    tensor; every rank must call it)."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.full_tensor() if isinstance(v, DTensor) else v
        out[k] = v.detach().cpu() if cpu else v.detach()
    return out


def full_optimizer_state(model, optimizer) -> dict:
    """The whole optimizer state, keyed by parameter name, on rank 0 (a collective)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict)
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model, optimizer, state: dict) -> None:
    """Scatters a :func:`full_optimizer_state` (read on every rank) onto the shards."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_optimizer_state_dict)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True))
