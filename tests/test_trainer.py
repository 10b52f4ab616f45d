"""Trainer: a policy-gradient step moves log-probs the way advantages say; checkpoints;
a 2-step end-to-end training run and its resume."""

import json

import pytest
import torch
from conftest import first_ppo_step, response_scores

from turngym.agents.tiny import build_tiny_model
from turngym.config import load_config
from turngym.trainers.batching import trajectory_rows
from turngym.trainers.checkpoint import CheckpointManager
from turngym.trainers.metrics import read_metrics
from turngym.trainers.pipeline import train
from turngym.trainers.update import PolicyGradientTrainer, score_rows
from turngym.types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn


def _traj(prompt, resp, reward):
    return Trajectory((Turn(tuple(prompt), tuple(resp), (1,) * len(resp), (0.0,) * len(resp),
                            "a", "o"),), reward, reward > 0, StopReason.WON, "t", "g")


def test_advantage_broadcast_to_response_tokens_only():
    t = Trajectory((Turn((1, 2), (3, 4), (1, 1), (-1.0, -1.0), "a", "o"),
                    Turn((5,), (6, 7, 8), (1, 0, 1), (-1.0,) * 3, "a", "o")),
                   1.0, True, StopReason.WON, "t", "g")
    (row,) = trajectory_rows(t, [0.5, -2.0])
    assert row.ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert row.mask == [0, 0, 1, 1, 0, 1, 0, 1]
    assert row.adv == [0, 0, 0.5, 0.5, 0, -2.0, -2.0, -2.0]
    (over,) = trajectory_rows(t, [0.5, -2.0], [None, [1.0, 2.0, 3.0]])
    assert over.adv[-3:] == [1.0, 2.0, 3.0]


def test_policy_gradient_step_follows_the_sign_of_the_advantage(tiny_stack):
    tok, _, _ = tiny_stack
    torch.manual_seed(0)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    cfg = load_config("quickstart", ["rl.lr=0.01", "rl.recompute_logprobs=true"]).rl
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    trainer = PolicyGradientTrainer(model, opt, cfg, tok.pad_token_id)
    good, bad = _traj([5, 6, 7], [8, 9], 1.0), _traj([5, 6, 7], [10, 11], 0.0)
    group = TrajectoryGroup((good, bad), "t")
    credit = CreditAssignment(((1.0,), (-1.0,)))
    rows = trajectory_rows(good, [1.0]) + trajectory_rows(bad, [-1.0])
    before = score_rows(model, rows, tok.pad_token_id, 4096)
    stats = trainer.update([group], [credit])
    after = score_rows(model, rows, tok.pad_token_id, 4096)
    assert sum(after[0][3:]) > sum(before[0][3:])  # positive advantage: more likely
    assert sum(after[1][3:]) < sum(before[1][3:])  # negative advantage: less likely
    assert stats["grad_norm"] > 0 and stats["response_tokens"] == 4


def test_kl_needs_reference_model(tiny_stack):
    tok, model, _ = tiny_stack
    cfg = load_config("quickstart", ["rl.kl_coef=0.1"]).rl
    with pytest.raises(ValueError, match="reference"):
        PolicyGradientTrainer(model, torch.optim.AdamW(model.parameters()), cfg, 0)


def test_checkpoints_are_atomic_and_pruned(tmp_path, tiny_stack):
    tok, model, _ = tiny_stack
    mgr = CheckpointManager(tmp_path, keep=2)
    opt = torch.optim.AdamW(model.parameters())
    for step in (1, 2, 3):
        mgr.save(step, model, tok, opt, {"phase": "rl"})
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002", "step_000003"]
    latest = mgr.latest()
    assert latest.name == "step_000003" and mgr.state(latest)["step"] == 3
    assert (latest / "model.safetensors").exists() and (latest / "optimizer.pt").exists()
    # a crash mid-write leaves a staging dir behind: latest still points at a whole checkpoint
    (tmp_path / ".step_000004.staging123").mkdir()
    assert mgr.latest().name == "step_000003"
    from turngym.agents.factory import load_pretrained
    m2, t2 = load_pretrained(str(latest))
    for (n, p), (_, q) in zip(model.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(p, q), n
    assert t2.chat_template == tok.chat_template


SMOKE = ["warmstart.num_demos=16", "warmstart.epochs=1", "warmstart.batch_size=8",
         "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
         "rl.tasks_per_step=2", "rl.group_size=2", "eval.num_tasks=3", "agent.max_turns=8",
         "warmstart.epsilon=0.0",
         "checkpoint.every=1", "env.eval_splits=[valid_unseen]"]


def test_two_step_training_run_and_resume(tmp_path):
    out = tmp_path / "run"
    cfg = load_config("quickstart", SMOKE + ["rl.steps=2", f"output_dir={out}"])
    summary = train(cfg, progress=False)
    for f in ("warmstart/model.safetensors", "checkpoints/step_000002/model.safetensors",
              "final/model.safetensors", "summary.json", "learning_curve.png", "config.yaml"):
        assert (out / f).exists(), f
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs if r["phase"] == "rl"] == [1, 2]
    assert {r["split"] for r in recs if r["phase"] == "eval"} == {"valid_unseen"}
    assert summary["final_eval"]["valid_unseen"]["episodes"] == 3
    assert set(summary["final_eval"]["valid_unseen"]["success_by_type"]) <= {
        "pick_and_place", "look_at_obj_in_light", "pick_clean_then_place"}
    warm_mtime = (out / "warmstart" / "model.safetensors").stat().st_mtime

    cfg3 = load_config("quickstart", SMOKE + ["rl.steps=3", f"output_dir={out}"])
    train(cfg3, resume=True, progress=False)
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs if r["phase"] == "rl"] == [1, 2, 3]
    assert (out / "warmstart" / "model.safetensors").stat().st_mtime == warm_mtime  # no redo
    assert (out / "checkpoints" / "latest").read_text() == "step_000003"
    assert json.loads((out / "summary.json").read_text())["warmstart_eval"]


def test_eval_cli_on_a_saved_model(tmp_path, tiny_stack):
    from turngym.cli import main
    from turngym.trainers.checkpoint import save_model_dir
    tok, model, _ = tiny_stack
    save_model_dir(tmp_path / "m", model, tok)
    out = tmp_path / "eval.json"
    rc = main(["eval", "--checkpoint", str(tmp_path / "m"), "--split", "valid_seen",
               "--json", str(out), "eval.num_tasks=2", "agent.max_turns=2",
               "agent.system_prompt=You are a household agent."])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["valid_seen"]["episodes"] == 2 and res["valid_seen"]["mean_turns"] <= 2


def test_kl_to_reference_is_zero_at_start_and_pulls_back(tiny_stack):
    import copy
    tok, _, _ = tiny_stack
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=5)
    ref = copy.deepcopy(model).requires_grad_(False)
    cfg = load_config("quickstart", ["rl.kl_coef=1.0", "rl.recompute_logprobs=true",
                                     "rl.lr=0.01"]).rl
    trainer = PolicyGradientTrainer(model, torch.optim.AdamW(model.parameters(), lr=cfg.lr), cfg,
                                    tok.pad_token_id, ref_model=ref)
    group = TrajectoryGroup((_traj([5, 6, 7], [8, 9], 1.0), _traj([5, 6, 7], [10, 11], 0.0)), "t")
    first = trainer.update([group], [CreditAssignment(((1.0,), (-1.0,)))])
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the step
    second = trainer.update([group], [CreditAssignment(((1.0,), (-1.0,)))])
    assert second["kl"] > 0.0


def _tempered_rollouts(tok, model, prompter, temperature):
    from turngym.agents.hf_backend import HFPolicy
    from turngym.agents.rollout import EnvPool, RolloutConfig, rollout
    from turngym.envs.textworld import TextWorldEnv
    pol = HFPolicy(model, tok, generator_seed=2, max_batch_size=4)
    return rollout(pol, prompter, EnvPool(lambda: TextWorldEnv()), [0, 1], 4,
                   RolloutConfig(max_turns=3, max_new_tokens=6, temperature=temperature))


def test_trainer_scores_the_distribution_the_sampler_drew_from(tiny_stack):
    """At T != 1 the rollout's log-probs are those of softmax(logits / T); a trainer told
    the temperature scores the same numbers, so its first PPO ratio is 1 even with the
    rollout's own log-probs as the old ones. Scored at T = 1 (what the trainer did before
    it took the temperature) the ratios are far from 1 and the clip fires."""
    tok, model, prompter = tiny_stack
    temp = 0.5
    groups = _tempered_rollouts(tok, model, prompter, temp)
    rows = [r for g in groups for t in g for r in trajectory_rows(t, [0.0] * t.num_turns)]
    sampled = [lp for g in groups for t in g for turn in t.turns for lp in turn.logprobs]

    def scores(temperature):
        return response_scores(model, rows, tok.pad_token_id, temperature)

    assert len(sampled) > 20
    assert torch.allclose(scores(temp), torch.tensor(sampled), atol=1e-4)
    assert (scores(1.0) - torch.tensor(sampled)).abs().max() > 0.05
    assert first_ppo_step(tok, model, groups, temp)["clipfrac"] < 0.01  # ratio 1 up to rounding
    assert first_ppo_step(tok, model, groups, 1.0)["clipfrac"] > 0.2


def test_trainer_temperature_must_be_positive(tiny_stack):
    tok, model, _ = tiny_stack
    cfg = load_config("quickstart").rl
    with pytest.raises(ValueError, match="temperature"):
        PolicyGradientTrainer(model, torch.optim.AdamW(model.parameters()), cfg, 0,
                              temperature=0.0)


def test_rl_sampler_settings_the_trainer_cannot_match_are_config_errors():
    from turngym.config import ConfigError
    with pytest.raises(ConfigError, match="RL needs sampled rollouts"):
        load_config("quickstart", ["agent.sampling.greedy=true"])
    # SFT only (or evaluation): greedy is fine
    assert load_config("quickstart", ["agent.sampling.greedy=true", "rl.steps=0"]).rl.steps == 0
    # top-p-truncated rollout log-probs as the old ones: the trainer cannot match them
    with pytest.raises(ConfigError, match="top_p < 1 with rl.recompute_logprobs=false"):
        load_config("quickstart", ["agent.sampling.top_p=0.9", "rl.recompute_logprobs=false"])
    assert load_config("quickstart", ["agent.sampling.top_p=0.9"]).agent.sampling.top_p == 0.9


def test_tempered_logits_are_divided_in_float32():
    """Under bf16 autocast the logits arrive in bf16; divided there they round by up to
    ~0.07 nats at logits ~20, unlike the samplers, which divide in float32."""
    from turngym.agents.numerics import tempered
    logits = (torch.randn(4, 50) * 20).to(torch.bfloat16)
    out = tempered(logits, 0.7)
    assert out.dtype == torch.float32
    assert torch.equal(out, logits.float() / 0.7)
    assert tempered(logits, 1.0) is logits


def test_greedy_sft_only_run_at_temperature_zero_trains_and_evaluates(tmp_path):
    out = tmp_path / "run"
    summary = train(load_config("quickstart", SMOKE + [
        f"output_dir={out}", "rl.steps=0", "agent.sampling.greedy=true",
        "agent.sampling.temperature=0"]), progress=False)
    assert "final_eval" in summary
