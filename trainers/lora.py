"""Optional LoRA for the RL phase (``rl.lora.enabled``; needs the ``[lora]`` extra, peft).

Adapters are added on top of the warm-started model, so the frozen base *is* the
warm start: the KL / TD reference is the same network with the adapters switched
off (:class:`AdapterOff`), which costs no second copy of the weights.  Checkpoints
store only the adapter (plus tokenizer and trainer state); ``final/`` is merged
into a plain HF model directory so evaluation and vLLM need nothing special.
"""

from __future__ import annotations

from pathlib import Path

import torch


def _peft():
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("rl.lora.enabled needs peft: pip install 'turngym[lora]'") from exc
    return peft


def add_lora(model, lcfg):
    """Wraps ``model`` with fresh trainable LoRA adapters; base weights are frozen."""
    peft = _peft()
    targets = list(lcfg.target_modules) if lcfg.target_modules else "all-linear"
    config = peft.LoraConfig(r=lcfg.r, lora_alpha=lcfg.alpha, lora_dropout=lcfg.dropout,
                             target_modules=targets, task_type="CAUSAL_LM", bias="none")
    return peft.get_peft_model(model, config)


def is_lora(model) -> bool:
    """A peft-wrapped model (without peft installed nothing is)."""
    try:
        return isinstance(model, _peft().PeftModel)
    except ImportError:  # pragma: no cover - depends on the install
        return False


def load_adapter(base_model, adapter_dir: str | Path):
    """Base model + a saved adapter, trainable (for resuming)."""
    peft = _peft()
    return peft.PeftModel.from_pretrained(base_model, str(adapter_dir), is_trainable=True)


def export_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The model's weights under its HF checkpoint names (what vLLM's ``load_weights``
    takes).  For a LoRA model each adapted weight is ``W + scale * B @ A``, computed
    out of place: merging into the base and unmerging again would drift the frozen
    base by rounding error every step."""
    if not is_lora(model):
        return [(k, v.detach()) for k, v in model.state_dict().items()]
    from peft.tuners.lora import LoraLayer
    base = model.get_base_model()
    adapter = model.active_adapter
    deltas = {name: m.get_delta_weight(adapter) for name, m in base.named_modules()
              if isinstance(m, LoraLayer) and adapter in m.lora_A}
    out = []
    with torch.no_grad():
        for key, value in base.state_dict().items():
            if ".lora_" in key:
                continue
            if ".base_layer." in key:
                module, _, leaf = key.rpartition(".base_layer.")
                key = f"{module}.{leaf}"
                if leaf == "weight" and module in deltas:
                    value = value + deltas[module].to(value.dtype)
            out.append((key, value.detach()))
    return out


def merged_copy(model):
    """A plain transformers model with the adapters folded into the weights
    (the training model is left untouched)."""
    import copy
    return copy.deepcopy(model).merge_and_unload()


class AdapterOff(torch.nn.Module):
    """The base network of a LoRA model, as a read-only model: every forward runs
    with the adapters disabled.  Used as the frozen reference."""

    def __init__(self, peft_model):
        super().__init__()
        self.inner = peft_model
        self.config = peft_model.config

    def forward(self, *args, **kwargs):
        was = self.inner.training
        self.inner.eval()
        try:
            with torch.no_grad(), self.inner.disable_adapter():
                return self.inner(*args, **kwargs)
        finally:
            self.inner.train(was)

    def get_base_model(self):
        return self.inner.get_base_model()

    def train(self, mode: bool = True):  # the reference never trains
        return self
