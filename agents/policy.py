"""The policy interface every rollout backend implements.

A policy turns token-id prompts into sampled continuations with their
sampling log-probabilities, and scores given token spans.  Backends (the
transformers one here, vLLM on GPU) differ only in how they do it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if not self.greedy and self.temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling (use greedy=True)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass(frozen=True)
class Sample:
    """One continuation: ids as sampled, their log-probs, and whether a stop token ended it."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    stopped: bool


@runtime_checkable
class Policy(Protocol):
    """What the rollout loop needs from a model."""

    stop_token_ids: tuple[int, ...]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Sample]:
        """Samples one continuation per prompt (token ids in, token ids out)."""
        ...

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-prob of every token given its prefix (entry 0 is 0.0)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of a response, without its trailing stop token."""
        ...


# ---------------------------------------------------------------------------------------
# Optional capabilities of a policy backend.  The rollout and the trainer ask
# ``isinstance(policy, Protocol)``; a backend opts in by implementing the method.
# ---------------------------------------------------------------------------------------


@runtime_checkable
class GenerationSession(Protocol):
    """Rows whose context persists across turns (a KV cache per row)."""

    def generate(self, rows: Sequence[int], new_tokens: Sequence[Sequence[int]],
                 params: SamplingParams, max_new: Sequence[int] | None = None
                 ) -> list[Sample]:
        """Appends ``new_tokens[k]`` to row ``rows[k]`` and samples one continuation each."""
        ...


@runtime_checkable
class SupportsSessions(Protocol):
    """Multi-turn sessions: a turn prefills only its new observation tokens."""

    def open_session(self, num_rows: int) -> GenerationSession: ...


@runtime_checkable
class SupportsConstrainedDecoding(Protocol):
    """Sampling restricted to given token sequences (``agent.constrain_actions``):
    ``generate(..., choices=[ActionChoices | None, ...])`` and sessions likewise; the
    returned log-probs are those of the restricted distribution."""

    supports_choices: bool


@runtime_checkable
class SupportsWeightSync(Protocol):
    """A sampler holding its own copy of the weights (e.g. a vLLM engine): the trainer
    pushes HF-named tensors after every update."""

    def sync_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None: ...


@runtime_checkable
class SupportsRelease(Protocol):
    """Frees the sampler's memory while the trainer updates (vLLM sleep mode); the next
    ``sync_weights`` wakes it."""

    def release(self) -> None: ...


@runtime_checkable
class HasModel(Protocol):
    """A policy that samples with the trainer's own ``torch.nn.Module`` (the transformers
    backend): credit modules read entropies off it directly."""

    model: Any
    pad_id: int
    precision: str | None


@runtime_checkable
class WrapsBaseModel(Protocol):
    """A wrapper around the network that owns the layers and caches (peft's PeftModel,
    :class:`~turngym.trainers.lora.AdapterOff`); forward kwargs pass through to it."""

    def get_base_model(self) -> Any: ...


def _ids(value) -> list[int]:
    return [int(value)] if isinstance(value, int) else [int(v) for v in (value or [])]


def stop_ids_for(tokenizer, stop_token_ids: Sequence[int] | None = None,
                 generation_config=None) -> tuple[int, ...]:
    """The given stop ids, else the tokenizer's EOS id(s) plus the model's generation-config
    EOS ids (chat models list several, e.g. ``<|im_end|>`` and ``<|endoftext|>``; vLLM
    stops at all of them, so the transformers backend must too)."""
    if stop_token_ids is None:
        stop_token_ids = _ids(tokenizer.eos_token_id)
        for t in _ids(getattr(generation_config, "eos_token_id", None)):
            if t not in stop_token_ids:
                stop_token_ids.append(t)
    if not stop_token_ids:
        raise ValueError("a policy needs at least one stop token id")
    return tuple(int(t) for t in stop_token_ids)


def decode_response(tokenizer, stop_token_ids: Sequence[int], token_ids: Sequence[int]) -> str:
    """Text of a response without its trailing stop token(s)."""
    ids = list(token_ids)
    while ids and ids[-1] in stop_token_ids:
        ids.pop()
    return tokenizer.decode(ids, skip_special_tokens=False)
