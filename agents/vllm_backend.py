"""vLLM rollout backend (GPU; ``pip install 'turngym[gpu]'``), colocated with the trainer.

Same :class:`~turngym.agents.policy.Policy` API as the transformers backend:
token ids in, token ids and their sampling log-probs out.  Design choices:

* **In-process engine.** ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine
  core in the trainer's process, so a weight sync is a device-to-device copy
  through ``LLM.apply_model`` (``model.load_weights`` takes HF-named tensors),
  not a pickled state dict.
* **Prefix caching across turns.** Every turn re-sends the whole context; vLLM's
  automatic prefix caching finds the previous turns' KV blocks, so only new
  tokens are prefilled.  The cache is reset after each weight sync, since KV
  computed by the old weights is stale.
* **Log-probs of the sampling distribution** (``logprobs_mode=processed_logprobs``
  where the installed vLLM has it: after temperature and top-p, as the HF
  backend returns).  The trainer recomputes old log-probs by default anyway, so
  numeric differences between vLLM's kernels and the trainer's cannot bias the
  importance ratio.
* **Reproducible sampling.** Each request gets a seed drawn from
  ``self.generator`` (a torch Generator, as on the HF backend), so a step's
  rollouts are a function of the seed the pipeline sets.
* **torchrun.** With several ranks each one runs its own engine on its own GPU
  (``distributed_executor_backend=external_launcher``) and samples its own tasks.
* **Sleep mode** (optional): ``release()`` offloads weights and drops the KV
  cache while the trainer updates; ``sync_weights`` wakes the engine up.

``vllm`` is imported only when a policy is built; CPU installs never need it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Sequence

import torch

from .policy import Sample, SamplingParams, decode_response, stop_ids_for


def import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("agent.backend=vllm needs vLLM on a CUDA machine: "
                          "pip install 'turngym[gpu]' (the CPU install has no vLLM)") from exc
    return vllm


def _engine_fields(vllm) -> set[str]:
    try:
        return {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    except Exception:  # pragma: no cover - very old vLLM
        return set()


def _generation_config(model_path):
    """The directory's generation config (its EOS ids are where vLLM stops), if any."""
    try:
        from transformers import GenerationConfig
        return GenerationConfig.from_pretrained(str(model_path))
    except Exception:  # no generation_config.json: the tokenizer's EOS alone
        return None


def _picked_logprob(entry: Any, token: int) -> float:
    """The sampled/prompt token's log-prob from one position's logprob entry
    (a ``{token_id: Logprob}`` mapping in every vLLM version we support)."""
    lp = entry[token]
    return float(getattr(lp, "logprob", lp))


class VLLMPolicy:
    """A vLLM ``LLM`` engine behind the :class:`~turngym.agents.policy.Policy` API."""

    def __init__(self, model_path: str, tokenizer, *, stop_token_ids: Sequence[int] | None = None,
                 dtype: str = "bfloat16", gpu_memory_utilization: float = 0.35,
                 enable_prefix_caching: bool = True, enable_sleep_mode: bool = False,
                 max_model_len: int | None = None, enforce_eager: bool = False, seed: int = 0,
                 engine_kwargs: dict | None = None, llm=None):
        self.vllm = import_vllm()
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_ids_for(tokenizer, stop_token_ids,
                                           _generation_config(model_path))
        self.sleep_mode = enable_sleep_mode
        self.asleep = False
        self.version = 0
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        if llm is None:
            # colocated: the engine core must live in this process for zero-copy syncs
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            kwargs: dict[str, Any] = dict(
                model=str(model_path), tokenizer=str(model_path), dtype=dtype, seed=seed,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_prefix_caching=enable_prefix_caching, enforce_eager=enforce_eager)
            fields = _engine_fields(self.vllm)
            if "logprobs_mode" in fields:
                kwargs["logprobs_mode"] = "processed_logprobs"
            if enable_sleep_mode:
                kwargs["enable_sleep_mode"] = True
            if max_model_len:
                kwargs["max_model_len"] = int(max_model_len)
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                # under torchrun every rank runs its own engine on its own GPU inside the
                # process group torchrun made (TRL's colocate mode does the same)
                kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs.update(engine_kwargs or {})
            llm = self.vllm.LLM(**kwargs)
        self.llm = llm

    # ------------------------------------------------------------------ Policy API
    def decode(self, token_ids: Sequence[int]) -> str:
        return decode_response(self.tokenizer, self.stop_token_ids, token_ids)

    def _seed(self) -> int:
        return int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))

    def _sampling(self, params: SamplingParams, max_new: int | None = None):
        return self.vllm.SamplingParams(
            n=1, max_tokens=int(max_new or params.max_new_tokens),
            temperature=0.0 if params.greedy else float(params.temperature),
            top_p=1.0 if params.greedy else float(params.top_p),
            seed=None if params.greedy else self._seed(),
            stop_token_ids=list(self.stop_token_ids), logprobs=0, detokenize=False)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_new: Sequence[int] | None = None) -> list[Sample]:
        """One continuation per prompt; ``max_new[i]`` caps prompt i's length."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self._ensure_awake()
        limits = max_new if max_new is not None else [None] * len(prompts)
        sps = [self._sampling(params, m) for m in limits]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sps,
                                 use_tqdm=False)
        samples = []
        for out in outs:
            c = out.outputs[0]
            ids = tuple(int(t) for t in c.token_ids)
            if not ids:
                raise RuntimeError("vLLM returned an empty completion")
            lps = tuple(_picked_logprob(e, t) for e, t in zip(c.logprobs, ids))
            stopped = c.finish_reason == "stop" and ids[-1] in self.stop_token_ids
            samples.append(Sample(ids, lps, stopped))
        return samples

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Prompt log-probs under the engine's weights (entry 0 is 0.0)."""
        if not sequences:
            return []
        self._ensure_awake()
        sp = self.vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0,
                                      detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], sp,
                                 use_tqdm=False)
        res = []
        for seq, out in zip(sequences, outs):
            plp = out.prompt_logprobs
            res.append([0.0] + [_picked_logprob(plp[i], int(seq[i])) for i in range(1, len(seq))])
        return res

    # ------------------------------------------------------------------ weight sync
    def release(self) -> None:
        """Frees the engine's GPU memory for the update (sleep mode only)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _ensure_awake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads HF-named tensors (:func:`turngym.trainers.lora.export_weights`) into the engine and
        drops the prefix cache; the next rollout samples from the new policy."""
        self._ensure_awake()
        weights = list(weights)

        def load(model):
            model.load_weights(weights=iter(weights))

        self.llm.apply_model(load)
        self.llm.reset_prefix_cache()
        self.version += 1

