"""The vLLM backend's adapter logic, against an in-memory stand-in for ``vllm``.

No GPU and no vLLM here (vLLM on PyPI is CUDA-only), so the stand-in implements the
slice of vLLM's API the backend uses (``LLM.generate`` with token prompts, sampled
and prompt log-probs, ``apply_model`` + ``load_weights``, prefix-cache reset, sleep
mode) on top of a transformers model loaded from the directory the engine is given.
What these tests check is turngym's side: request building, output conversion,
weight sync, and the pipeline's wiring.  Real-engine numbers come from
``benchmarks/gpu_check.sh`` on a GPU machine.
"""

import copy
import dataclasses
import importlib
import os
import sys
import types
from typing import Optional

import pytest
import torch

from turngym.agents.hf_backend import HFPolicy, _filter_top_p
from turngym.agents.policy import SamplingParams
from turngym.agents.prompting import ChatPrompter
from turngym.agents.rollout import EnvPool, RolloutConfig, rollout
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.checkpoint import save_model_dir
from turngym.trainers.lora import export_weights


@dataclasses.dataclass
class _SP:
    n: int = 1
    max_tokens: Optional[int] = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_token_ids: Optional[list] = None
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    extra_args: Optional[dict] = None


@dataclasses.dataclass
class _EngineArgs:
    model: str = ""
    logprobs_mode: str = "raw_logprobs"
    enable_prefix_caching: bool = True


@dataclasses.dataclass
class _Logprob:
    logprob: float


class _FakeLLM:
    """vLLM's offline ``LLM`` surface, computed with a transformers model."""

    instances: list = []

    def __init__(self, **kwargs):
        from transformers import AutoModelForCausalLM
        self.kwargs = kwargs
        self.model = AutoModelForCausalLM.from_pretrained(kwargs["model"]).eval()
        self.prefix_resets = 0
        self.asleep = False
        self.sleeps = 0
        _FakeLLM.instances.append(self)

    @torch.no_grad()
    def _logits(self, ids):
        return self.model(input_ids=torch.tensor([ids])).logits[0].float()

    def generate(self, prompts, sps, use_tqdm=True):
        assert not self.asleep, "generate on a sleeping engine"
        sps = sps if isinstance(sps, list) else [sps] * len(prompts)
        return [self._one(p["prompt_token_ids"], sp) for p, sp in zip(prompts, sps)]

    def _one(self, prompt, sp):
        if sp.prompt_logprobs is not None:
            lp = torch.log_softmax(self._logits(prompt), -1)
            plp = [None] + [{t: _Logprob(float(lp[i - 1, t]))} for i, t in
                            enumerate(prompt) if i > 0]
            comp = types.SimpleNamespace(token_ids=[0], logprobs=None, finish_reason="length")
            return types.SimpleNamespace(outputs=[comp], prompt_logprobs=plp)
        gen = torch.Generator().manual_seed(sp.seed or 0)
        ids, toks, lps, finish = list(prompt), [], [], "length"
        for _ in range(sp.max_tokens):
            logits = self._logits(ids)[-1]
            if sp.temperature == 0:
                lp = torch.log_softmax(logits, -1)
                t = int(lp.argmax())
            else:  # processed log-probs: after temperature and top-p
                lp = torch.log_softmax(_filter_top_p(logits / sp.temperature, sp.top_p), -1)
                t = int(torch.multinomial(lp.exp(), 1, generator=gen))
            toks.append(t)
            lps.append({t: _Logprob(float(lp[t]))})
            ids.append(t)
            if t in (sp.stop_token_ids or []):
                finish = "stop"
                break
        comp = types.SimpleNamespace(token_ids=toks, logprobs=lps, finish_reason=finish)
        return types.SimpleNamespace(outputs=[comp], prompt_logprobs=None)

    def apply_model(self, fn):
        outer = self

        class Runner:  # vLLM models load HF-named (name, tensor) pairs
            def load_weights(self, weights):
                own = outer.model.state_dict()
                for name, t in weights:
                    own[name].copy_(t)
        return [fn(Runner())]

    def reset_prefix_cache(self, *a, **k):
        self.prefix_resets += 1
        return True

    def sleep(self, level=1, **k):
        self.asleep, self.sleeps = True, self.sleeps + 1

    def wake_up(self, tags=None):
        self.asleep = False
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams, mod.EngineArgs = _FakeLLM, _SP, _EngineArgs
    monkeypatch.setitem(sys.modules, "vllm", mod)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_V2_MODEL_RUNNER"):
        # set first so monkeypatch records the original, then unset: whatever the backend
        # writes into os.environ is undone after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    _FakeLLM.instances = []
    return mod


@pytest.fixture
def model_dir(tmp_path, tiny_stack):
    tok, model, _ = tiny_stack
    save_model_dir(tmp_path / "warm", model, tok)
    return tmp_path / "warm"


def _policy(model_dir, tok, **kw):
    from turngym.agents.vllm_backend import VLLMPolicy
    return VLLMPolicy(str(model_dir), tok, **kw)


def test_engine_is_colocated_with_prefix_caching_and_processed_logprobs(fake_vllm, model_dir,
                                                                       tiny_stack):
    import os
    _policy(model_dir, tiny_stack[0], enable_sleep_mode=True, max_model_len=512)
    kw = _FakeLLM.instances[0].kwargs
    assert kw["enable_prefix_caching"] and kw["logprobs_mode"] == "processed_logprobs"
    assert kw["enable_sleep_mode"] and kw["max_model_len"] == 512
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "distributed_executor_backend" not in kw  # one process: vLLM's own default


def test_under_torchrun_each_rank_runs_its_own_engine(fake_vllm, model_dir, tiny_stack,
                                                      monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    _policy(model_dir, tiny_stack[0], seed=1)
    assert _FakeLLM.instances[0].kwargs["distributed_executor_backend"] == "external_launcher"


def test_greedy_samples_and_scores_match_the_transformers_backend(fake_vllm, model_dir,
                                                                  tiny_stack):
    tok, model, _ = tiny_stack
    vp, hp = _policy(model_dir, tok), HFPolicy(model, tok)
    prompts = [[6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17]]
    params = SamplingParams(max_new_tokens=6, greedy=True)
    for a, b in zip(vp.generate(prompts, params), hp.generate(prompts, params)):
        assert a.token_ids == b.token_ids and a.stopped == b.stopped
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    for a, b in zip(vp.score(prompts), hp.score(prompts)):
        assert a == pytest.approx(b, abs=1e-4)
    capped = vp.generate(prompts, params, max_new=[1, 2, 6])
    assert [len(s.token_ids) for s in capped][:2] == [1, 2]


def test_sampling_is_reproducible_from_the_policy_generator(fake_vllm, model_dir, tiny_stack):
    tok = tiny_stack[0]
    vp = _policy(model_dir, tok)
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    vp.generator.manual_seed(3)
    a = vp.generate([[6, 7, 8]] * 4, params)
    vp.generator.manual_seed(3)
    b = vp.generate([[6, 7, 8]] * 4, params)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert len({s.token_ids for s in a}) > 1  # each request gets its own seed


def test_weight_sync_makes_the_engine_sample_from_the_trained_policy(fake_vllm, model_dir,
                                                                      tiny_stack):
    tok, model, _ = tiny_stack
    trained = copy.deepcopy(model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    vp = _policy(model_dir, tok, enable_sleep_mode=True)
    seqs = [[6, 7, 8, 9, 10]]
    want = HFPolicy(trained, tok).score(seqs)[0]
    assert vp.score(seqs)[0] != pytest.approx(want, abs=1e-4)
    vp.release()
    assert _FakeLLM.instances[0].asleep
    vp.sync_weights(export_weights(trained))
    assert vp.score(seqs)[0] == pytest.approx(want, abs=1e-4)
    engine = _FakeLLM.instances[0]
    assert engine.prefix_resets == 1 and vp.version == 1 and engine.sleeps == 1


def test_multi_turn_rollout_through_the_engine(fake_vllm, model_dir, tiny_stack):
    import gymnasium as gym
    tok = tiny_stack[0]
    vp = _policy(model_dir, tok)
    prompter = ChatPrompter(tok, "You are a household agent.")
    pool = EnvPool(lambda: gym.make("turngym/TextWorld-v0", split="train"))
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6)
    groups = rollout(vp, prompter, pool, [0, 1], 2, cfg)
    assert len(groups) == 2 and all(len(g) == 2 for g in groups)
    for g in groups:
        for t in g:
            for turn in t.turns:
                assert len(turn.logprobs) == len(turn.response_ids) > 0
                assert all(lp <= 0 for lp in turn.logprobs)


def test_training_pipeline_with_the_vllm_backend(fake_vllm, tmp_path):
    from turngym.config import load_config
    from turngym.trainers.metrics import read_metrics
    from turngym.trainers.pipeline import train
    out = tmp_path / "run"
    cfg = load_config("quickstart", [
        "warmstart.num_demos=16", "warmstart.epochs=1", "warmstart.batch_size=8",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "rl.tasks_per_step=2", "rl.group_size=2", "eval.num_tasks=2", "agent.max_turns=8",
        "warmstart.epsilon=0.0", "env.eval_splits=[valid_unseen]", "rl.steps=2",
        "agent.backend=vllm", "agent.constrain_actions=false", "agent.vllm.enable_sleep_mode=true", "agent.vllm.dtype=float32",
        "rl.credit.name=role_judge", "rl.credit.params.zero_outcome=roles",
        f"output_dir={out}"])
    train(cfg, progress=False)
    engine = _FakeLLM.instances[0]
    assert engine.kwargs["model"] == str(out / "warmstart")  # started from the warm start
    assert engine.prefix_resets == 2 and engine.sleeps == 2  # one sync per RL step
    import safetensors.torch
    final = safetensors.torch.load_file(str(out / "final" / "model.safetensors"))
    own = engine.model.state_dict()
    for k, v in final.items():  # the engine holds the trained weights
        assert torch.equal(own[k], v), k
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"] == [1, 2]


def test_branch_credit_with_the_engine_branches_there_and_screens_on_the_trainer(
        fake_vllm, tmp_path):
    """CBPO under vLLM: continuations are sampled by the engine, entropies come from
    the trainer's copy of the policy (the engine exposes no module to read them off)."""
    from turngym.config import load_config
    from turngym.trainers.metrics import read_metrics
    from turngym.trainers.pipeline import train
    out = tmp_path / "run"
    train(load_config("textworld_cbpo", [
        "warmstart.num_demos=16", "warmstart.epochs=1", "warmstart.batch_size=8",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "rl.tasks_per_step=2", "rl.group_size=2", "eval.num_tasks=2", "agent.max_turns=8",
        "warmstart.epsilon=0.0", "env.eval_splits=[valid_unseen]", "rl.steps=1",
        "agent.backend=vllm", "agent.constrain_actions=false", "agent.vllm.dtype=float32", f"output_dir={out}"]), progress=False)
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(rl) == 1 and rl[0]["credit/branches"] > 0  # the engine sampled branches


@dataclasses.dataclass
class _ArgsWithProcessors(_EngineArgs):  # a vLLM with custom logits processors (>= 0.10.2)
    logits_processors: Optional[list] = None


def test_constrained_engine_loads_the_processor_and_sends_each_requests_choices(
        fake_vllm, model_dir, tiny_stack, monkeypatch):
    from turngym.agents.constraints import ActionConstraint
    from turngym.agents.vllm_backend import CHOICES_ARG, PROCESSOR
    tok = tiny_stack[0]

    monkeypatch.setattr(fake_vllm, "EngineArgs", _ArgsWithProcessors)
    pol = _policy(model_dir, tok, dtype="float32", constrain_actions=True)
    assert pol.llm.kwargs["logits_processors"] == [PROCESSOR]
    # the user's own processors (agent.vllm.engine_kwargs) run beside it, never instead
    own = _policy(model_dir, tok, constrain_actions=True,
                  engine_kwargs={"logits_processors": ["my.module:Mine"]})
    assert own.llm.kwargs["logits_processors"] == ["my.module:Mine", PROCESSOR]
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # the runner it implements
    seen = []
    real = pol.llm.generate
    pol.llm.generate = lambda prompts, sps, use_tqdm=True: (seen.extend(sps),
                                                             real(prompts, sps))[1]
    ch = ActionConstraint(tok, "<action> {action} </action>", tok.eos_token_id, 12).choices(
        ["look", "go to countertop 1"])
    pol.generate([[6, 7], [8, 9]], SamplingParams(max_new_tokens=4), choices=[ch, None])
    assert seen[0].extra_args == {CHOICES_ARG: [list(s) for s in ch.sequences]}
    assert seen[1].extra_args is None


def test_constrained_decoding_is_refused_where_the_engine_cannot_do_it(fake_vllm, model_dir,
                                                                      tiny_stack, monkeypatch):
    tok, _, prompter = tiny_stack
    with pytest.raises(ValueError, match="custom logits processors"):
        _policy(model_dir, tok, constrain_actions=True)  # this vLLM has no such engine arg

    monkeypatch.setattr(fake_vllm, "EngineArgs", _ArgsWithProcessors)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # its processor interface differs
    with pytest.raises(ValueError, match="V1 model runner"):
        _policy(model_dir, tok, constrain_actions=True)
    # an engine started earlier in this process froze vLLM's env with the V2 runner
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    monkeypatch.setattr(fake_vllm, "envs", types.SimpleNamespace(VLLM_USE_V2_MODEL_RUNNER=True),
                        raising=False)
    with pytest.raises(ValueError, match="already started a vLLM engine"):
        _policy(model_dir, tok, constrain_actions=True)
    fake_vllm.envs.VLLM_USE_V2_MODEL_RUNNER = False
    _policy(model_dir, tok, constrain_actions=True)
    plain = _policy(model_dir, tok)
    cfg = RolloutConfig(max_turns=2, max_new_tokens=8, constrain_actions=True)
    with pytest.raises(ValueError, match="constrain_actions=True"):
        rollout(plain, prompter, EnvPool(lambda: TextWorldEnv()), [0], 1, cfg)


def test_without_vllm_the_error_says_how_to_install_it(monkeypatch, tiny_stack):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    mod = importlib.import_module("turngym.agents.vllm_backend")  # importing needs no vllm
    with pytest.raises(ImportError, match=r"turngym\[gpu\]"):
        mod.VLLMPolicy("/nonexistent", tiny_stack[0])


def test_eval_cli_samples_with_the_engine(fake_vllm, model_dir, tmp_path):
    import json

    from turngym.cli import main
    out = tmp_path / "eval.json"
    rc = main(["eval", "--checkpoint", str(model_dir), "--split", "valid_seen", "--json",
               str(out), "eval.num_tasks=2", "agent.max_turns=2", "agent.backend=vllm", "agent.constrain_actions=false"])
    assert rc == 0 and json.loads(out.read_text())["valid_seen"]["episodes"] == 2
    assert _FakeLLM.instances[0].kwargs["model"] == str(model_dir)


# ---------------------------------------------------------------------------------------
# Weight-sync route, config and process-state checks (the real engine: test_vllm_real.py)
# ---------------------------------------------------------------------------------------


class _ReloadLLM(_FakeLLM):
    """An engine with vLLM's in-place reload route, run as vLLM's ``run_method`` runs it
    (a missing worker method becomes NotImplementedError)."""

    def __init__(self, reload=None, **kwargs):
        super().__init__(**kwargs)
        self.reload, self.routes = reload, []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if self.reload is None:
            raise NotImplementedError(f"Method {method!r} is not implemented.")
        self.routes.append(method)
        return [self.reload(self, **(kwargs or {}))]

    def apply_model(self, fn):
        self.routes.append("apply_model")
        return super().apply_model(fn)


def _reload_in_place(engine, weights_iterator):
    own = engine.model.state_dict()
    for name, t in weights_iterator:
        own[name].copy_(t)


def _trained(model):
    trained = copy.deepcopy(model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return trained


def test_sync_prefers_the_engines_reload_route(fake_vllm, model_dir, tiny_stack, monkeypatch):
    tok, model, _ = tiny_stack
    monkeypatch.setattr(fake_vllm, "LLM",
                        lambda **kw: _ReloadLLM(reload=_reload_in_place, **kw))
    vp = _policy(model_dir, tok)
    trained = _trained(model)
    vp.sync_weights(export_weights(trained))
    vp.sync_weights(export_weights(trained))
    assert vp.sync_route == "reload_weights" and vp.llm.routes == ["reload_weights"] * 2
    seqs = [[6, 7, 8, 9]]
    assert vp.score(seqs)[0] == pytest.approx(HFPolicy(trained, tok).score(seqs)[0], abs=1e-4)


def test_sync_falls_back_to_load_weights_where_the_engine_has_no_reload_route(
        fake_vllm, model_dir, tiny_stack, monkeypatch):
    tok, model, _ = tiny_stack
    monkeypatch.setattr(fake_vllm, "LLM", lambda **kw: _ReloadLLM(reload=None, **kw))
    vp = _policy(model_dir, tok)
    trained = _trained(model)
    vp.sync_weights(export_weights(trained))
    vp.sync_weights(export_weights(trained))
    assert vp.sync_route == "load_weights" and vp.llm.routes == ["apply_model"] * 2
    seqs = [[6, 7, 8, 9]]
    assert vp.score(seqs)[0] == pytest.approx(HFPolicy(trained, tok).score(seqs)[0], abs=1e-4)


def test_a_failing_reload_is_an_error_not_a_silent_fallback(fake_vllm, model_dir, tiny_stack,
                                                            monkeypatch):
    def broken(engine, weights_iterator):
        raise AttributeError("'Parameter' object has no attribute 'weight_loader'")

    tok, model, _ = tiny_stack
    monkeypatch.setattr(fake_vllm, "LLM", lambda **kw: _ReloadLLM(reload=broken, **kw))
    vp = _policy(model_dir, tok)
    with pytest.raises(AttributeError, match="weight_loader"):
        vp.sync_weights(export_weights(model))
    assert vp.llm.routes == ["reload_weights"] and vp.version == 0  # no apply_model retry


def _cfg(*over):
    from turngym.config import load_config
    return load_config("quickstart", list(over))


def test_check_compatible_refuses_a_sampler_dtype_the_trainer_does_not_share():
    from turngym.agents.vllm_backend import check_compatible
    # a float32 trainer without recomputed log-probs; the engine's default dtype is bfloat16
    with pytest.raises(ValueError, match=r"rl.recompute_logprobs=true.*agent.vllm.dtype=float32"):
        check_compatible(_cfg("agent.backend=vllm", "agent.constrain_actions=false", "rl.recompute_logprobs=false"))
    with pytest.raises(ValueError, match="samples in float16"):
        check_compatible(_cfg("agent.backend=vllm", "agent.constrain_actions=false", "agent.vllm.dtype=bfloat16",
                              "rl.recompute_logprobs=false",
                              "agent.vllm.engine_kwargs={dtype: float16}",
                              "model.autocast=bfloat16"))
    check_compatible(_cfg("agent.backend=vllm", "agent.constrain_actions=false", "rl.recompute_logprobs=true"))
    check_compatible(_cfg("agent.backend=vllm", "agent.constrain_actions=false", "agent.vllm.dtype=float32",
                          "rl.recompute_logprobs=false"))
    check_compatible(_cfg("agent.backend=vllm", "agent.constrain_actions=false", "model.autocast=bfloat16",
                          "rl.recompute_logprobs=false"))
    check_compatible(_cfg())  # the transformers backend samples with the trainer's module
    # log-probs reported before temperature/top-p cannot be the ratio's old log-probs
    with pytest.raises(ValueError, match="logprobs_mode=raw_logprobs"):
        check_compatible(_cfg("agent.backend=vllm", "agent.constrain_actions=false", "agent.vllm.dtype=float32",
                              "rl.recompute_logprobs=false",
                              "agent.vllm.engine_kwargs={logprobs_mode: raw_logprobs}"))
    check_compatible(_cfg("agent.backend=vllm", "agent.constrain_actions=false", "rl.recompute_logprobs=true",
                          "agent.vllm.engine_kwargs={logprobs_mode: raw_logprobs}"))


def test_engine_start_state_is_put_back():
    import random

    import numpy as np

    from turngym.agents.vllm_backend import preserved_process_state
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    with preserved_process_state():  # what vLLM's CPU engine start does to the process
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        set_threads(1 if threads > 1 else 2)
        torch.set_num_threads = lambda n: None
    assert torch.set_num_threads is set_threads and torch.get_num_threads() == threads
    got = (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random())
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    assert got == (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random())


def test_head_size_comes_from_the_model_config(model_dir, tmp_path):
    import json

    from turngym.agents.vllm_backend import model_head_size
    assert model_head_size(model_dir) == 16  # the fixture's tiny model: 32 wide, 2 heads
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 576, "num_attention_heads": 9, "head_dim": 64}))
    assert model_head_size(tmp_path) == 64
    assert model_head_size(tmp_path / "missing") is None


def test_the_bundled_vllm_configs_pass_check_compatible(tmp_path):
    from pathlib import Path

    from turngym.agents.vllm_backend import check_compatible
    root = Path(__file__).resolve().parents[1] / "configs"
    gpu = sorted(p.stem for p in root.glob("gpu_*.yaml"))
    assert gpu
    for name in gpu:  # the GPU recipe: bf16 engine, bf16 autocast, recomputed log-probs
        cfg = _cfg_named(name, f"model.path={tmp_path}")
        assert cfg.agent.backend == "vllm"
        check_compatible(cfg)


def _cfg_named(name, *over):
    from turngym.config import load_config
    return load_config(name, list(over))
