"""Constrained action decoding (``agent.constrain_actions``): responses are sampled only
among the env's admissible commands, and every scorer (PPO ratio, recomputed old
log-probs, entropies) restricts the same way, so the trainer optimises the distribution
the sampler drew from."""

import math
from dataclasses import replace

import pytest
import torch
from conftest import first_ppo_step, response_scores

from turngym.agents.branching import branch_point_at, continue_from
from turngym.agents.constraints import (ActionChoices, ActionConstraint, allowed_per_position,
                                        sequence_restriction)
from turngym.agents.hf_backend import HFPolicy
from turngym.agents.numerics import restricted, token_entropies, token_logprobs
from turngym.agents.rollout import EnvPool, RolloutConfig, rollout
from turngym.agents.tiny import build_tiny_model
from turngym.config import ConfigError, load_config
from turngym.credit.scoring import response_entropies
from turngym.envs.textworld import TextWorldEnv
from turngym.trainers.batching import trajectory_rows
from turngym.types import ContextMode, Trajectory


def _cfg(**kw):
    base = {"max_turns": 4, "max_new_tokens": 12, "constrain_actions": True}
    base.update(kw)
    return RolloutConfig(**base)


def _rollouts(tok, model, prompter, seeds=(0, 1), group=3, **kw):
    pol = HFPolicy(model, tok, generator_seed=4, max_batch_size=8)
    return pol, rollout(pol, prompter, EnvPool(lambda: TextWorldEnv()), list(seeds), group,
                        _cfg(**kw))


def _replayed_commands(traj: Trajectory) -> list[list[str]]:
    """The env's admissible commands before each turn, by replaying the actions."""
    env = TextWorldEnv()
    _, info = env.reset(seed=int(traj.info["task_seed"]))
    out = []
    for t in traj.turns:
        out.append(list(info["admissible_commands"]))
        _, _, term, trunc, info = env.step(t.action_text)
        if term or trunc:
            break
    return out


def test_choices_trie_walks_prefixes_and_maps_ids_to_actions():
    c = ActionChoices(((1, 2, 9), (1, 3, 9), (4, 9)), ("a", "b", "c"))
    assert sorted(c.allowed_next([])) == [1, 4]
    assert sorted(c.allowed_next([1])) == [2, 3]
    assert c.allowed_next([7]) == []
    assert c.action_of([1, 3, 9]) == "b" and c.action_of([1, 3]) is None
    rest = c.after([1])
    assert rest.sequences == ((2, 9), (3, 9)) and rest.actions == ("a", "b")
    with pytest.raises(ValueError, match="prefix"):
        c.after([5])
    assert allowed_per_position(c.sequences, [1, 3, 9]) == [[1, 4], [2, 3], [9]]
    with pytest.raises(ValueError, match="not an allowed continuation"):
        allowed_per_position(c.sequences, [1, 5, 9])


def test_constraint_refuses_an_info_without_commands_and_drops_overlong_ones(tiny_stack):
    tok, _, _ = tiny_stack
    con = ActionConstraint(tok, "<action> {action} </action>", tok.eos_token_id, 6)
    with pytest.raises(ValueError, match="admissible_commands"):
        con.choices([])
    ch = con.choices(["look", "go to countertop 1"])
    assert ch.actions == ("look", "go to countertop 1")  # 4 and 6 tokens
    assert all(s[-1] == tok.eos_token_id for s in ch.sequences)
    short = ActionConstraint(tok, "<action> {action} </action>", tok.eos_token_id, 5)
    assert short.choices(["look", "go to countertop 1"]).actions == ("look",)


def test_every_constrained_action_is_admissible_and_spelled_by_its_tokens(tiny_stack):
    tok, model, prompter = tiny_stack  # an untrained model: free sampling is gibberish
    _, groups = _rollouts(tok, model, prompter)
    turns = 0
    for g in groups:
        for traj in g:
            for t, cmds in zip(traj.turns, _replayed_commands(traj)):
                assert t.action_text in cmds
                assert t.info["valid_action"] and t.info["valid_format"]
                assert t.choices and tuple(t.response_ids) in t.choices
                assert t.response_ids[-1] == tok.eos_token_id
                turns += 1
    assert turns >= 20


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trainer_scores_what_the_constrained_sampler_drew_from(tiny_stack, temperature):
    """The restricted scores equal the sampler's log-probs; the whole-vocabulary scores
    (what a trainer unaware of the restriction would compute) are lower, and with them
    the first PPO step's clip fires on most tokens."""
    tok, model, prompter = tiny_stack
    _, groups = _rollouts(tok, model, prompter, temperature=temperature)
    rows = [r for g in groups for t in g for r in trajectory_rows(t, [0.0] * t.num_turns)]
    assert all(r.restriction for r in rows)
    sampled = torch.tensor([lp for g in groups for t in g for turn in t.turns
                            for lp in turn.logprobs])

    def scores(rs):
        return response_scores(model, rs, tok.pad_token_id, temperature)

    assert torch.allclose(scores(rows), sampled, atol=1e-4)
    free = scores([replace(r, restriction=()) for r in rows])
    assert (sampled - free).min() > -1e-4 and (sampled - free).max() > 1.0
    # the same turns without their choices: scored on the whole vocabulary
    stripped = [g.__class__(tuple(replace(t, turns=tuple(replace(u, choices=())
                                                          for u in t.turns)) for t in g),
                            g.task_id) for g in groups]
    assert first_ppo_step(tok, model, groups, temperature)["clipfrac"] < 0.01
    assert first_ppo_step(tok, model, stripped, temperature)["clipfrac"] > 0.3


def test_restricted_entropy_is_finite_and_bounded_by_the_choice_count(tiny_stack):
    tok, model, prompter = tiny_stack
    _, groups = _rollouts(tok, model, prompter, seeds=(2,), group=2)
    trajs = list(groups[0])
    ents = response_entropies(model, trajs, tok.pad_token_id)
    for traj, per_turn in zip(trajs, ents):
        (sq,) = traj.sequences()
        res = dict(sequence_restriction(traj, sq))
        for (a, b), e in zip(sq.spans, per_turn):
            assert e.shape == (b - a,) and all(map(math.isfinite, e))
            for pos, h in zip(range(a, b), e):
                n = len(res[pos])
                assert -1e-6 <= h <= math.log(n) + 1e-5
                if n == 1:
                    assert h == pytest.approx(0.0, abs=1e-6)


def test_restricted_gradient_moves_probability_only_among_the_choices(tiny_stack):
    """A positive advantage on one constrained response raises its restricted log-prob;
    the masked logits get no gradient and nothing is nan."""
    tok, _, _ = tiny_stack
    torch.manual_seed(0)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    res = ((3, (8, 10, 11)), (4, (9, 12)))
    logits = restricted(model(input_ids=ids).logits, [res])
    lp = token_logprobs(logits, ids)
    ent = token_entropies(logits)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    (lp[0, 3] + lp[0, 4] + ent[0, 3:].sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids).logits[0, 2].float(), -1)
        want = full[8] - torch.logsumexp(full[[8, 10, 11]], 0)
    assert lp[0, 3].item() == pytest.approx(want.item(), abs=1e-5)


def test_mid_response_branch_continues_to_an_admissible_command(tiny_stack):
    tok, model, prompter = tiny_stack
    pol, groups = _rollouts(tok, model, prompter, seeds=(3,), group=2)
    traj = groups[0].trajectories[0]
    assert traj.num_turns >= 2
    bp = branch_point_at(traj, 1, 2)  # "<action> <first word>" kept
    conts = continue_from(pol, prompter, EnvPool(lambda: TextWorldEnv()), [bp] * 4, _cfg())
    cmds = _replayed_commands(traj)[1]
    for c in conts:
        first = c.turns[0]
        assert first.action_text in cmds
        assert tuple(traj.turns[1].response_ids[:2]) + tuple(first.response_ids) in \
            traj.turns[1].choices
        # the continuation's choices are the suffixes after the kept prefix
        assert all(len(s) >= 1 for s in first.choices)
        rows = trajectory_rows(c, [0.0] * c.num_turns)
        assert rows[0].restriction


def test_window_mode_constrained_rollout_scores_consistently(tiny_stack):
    tok, model, prompter = tiny_stack
    _, groups = _rollouts(tok, model, prompter, seeds=(4,), group=2,
                          context_mode=ContextMode.WINDOW, window_turns=2)
    rows = [r for g in groups for t in g for r in trajectory_rows(t, [0.0] * t.num_turns)]
    sampled = [lp for g in groups for t in g for turn in t.turns for lp in turn.logprobs]
    scored = response_scores(model, rows, tok.pad_token_id)
    assert len(rows) > 2 and torch.allclose(scored, torch.tensor(sampled), atol=1e-4)


def test_env_without_admissible_commands_is_refused(tiny_stack):
    import gymnasium as gym

    class Bare(gym.Env):
        observation_space = action_space = gym.spaces.Text(64)

        def reset(self, *, seed=None, options=None):
            return "hello", {}

        def step(self, action):
            return "ok", 0.0, False, False, {}

    tok, model, prompter = tiny_stack
    pol = HFPolicy(model, tok, generator_seed=0)
    with pytest.raises(ValueError, match="admissible_commands"):
        rollout(pol, prompter, EnvPool(Bare), [0], 1, _cfg())


def test_the_quickstart_recipe_loads_on_the_vllm_backend():
    # the engine restricts sampling with turngym's logits processor (tests/test_vllm_real.py)
    cfg = load_config("quickstart", ["agent.backend=vllm"])
    assert cfg.agent.constrain_actions and cfg.agent.backend.value == "vllm"


def test_config_refuses_constrained_decoding_with_required_thinking():
    with pytest.raises(ConfigError, match="no <think> block"):
        load_config("quickstart", ["agent.require_think=true"])
    assert not load_config("quickstart", ["agent.require_think=true",
                                          "agent.constrain_actions=false"]).agent.constrain_actions


def test_an_engines_mask_keeps_the_stop_token_of_a_finished_response_and_refuses_off_trie():
    """What vLLM's processor keeps (ActionChoices.engine_next): mid-response the trie's
    next tokens; after the stop token (a finished request run one more step by async
    scheduling, its sample discarded) only that token; off the trie an error, never an
    unrestricted sample."""
    from turngym.agents.constraints import ActionChoices
    c = ActionChoices(((5, 6, 2), (5, 7, 2), (8, 2)), ("a", "b", "c"))
    assert sorted(c.engine_next([])) == [5, 8]
    assert sorted(c.engine_next([5])) == [6, 7]
    assert c.engine_next([5, 7]) == [2]
    assert c.engine_next([5, 7, 2]) == [2] and c.allowed_next([5, 7, 2]) == []
    for bad in ([6], [5, 8], [8, 2, 2]):
        with pytest.raises(RuntimeError, match="ran past its choices"):
            c.engine_next(bad)
