"""Rollout loop: token-in-token-out, loss masks, logprob agreement, malformed output."""

import torch

from turngym.agents import EnvPool, HFPolicy, RolloutConfig, SamplingParams, rollout
from turngym.agents.parsing import INVALID_FORMAT_MESSAGE
from turngym.agents.policy import Sample
from turngym.envs.textworld import TextWorldEnv
from turngym.types import StopReason


class ScriptedPolicy:
    """Emits fixed texts (tokenised once) in turn order; for exact rollout tests."""

    def __init__(self, tok, texts):
        self.tok = tok
        self.stop_token_ids = (tok.eos_token_id,)
        self.script = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        self.calls = 0
        self.prompts = []

    def generate(self, prompts, params):
        self.prompts.append([list(p) for p in prompts])
        ids = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        out = ids[: params.max_new_tokens]
        stopped = out and out[-1] == self.tok.eos_token_id
        return [Sample(tuple(out), tuple([-0.1] * len(out)), bool(stopped)) for _ in prompts]

    def score(self, sequences):
        return [[0.0] * len(s) for s in sequences]

    def decode(self, ids):
        ids = [i for i in ids if i != self.tok.eos_token_id]
        return self.tok.decode(ids, skip_special_tokens=False)


def test_context_is_exactly_the_trajectory_tokens(tiny_stack):
    tok, _, prompter = tiny_stack
    eos = tok.eos_token
    pol = ScriptedPolicy(tok, [f"<action> look </action> {eos}", f"<action> inventory </action> {eos}",
                               f"<action> look </action> {eos}"])
    pool = EnvPool(lambda: TextWorldEnv())
    (group,) = rollout(pol, prompter, pool, [4], 1, RolloutConfig(max_turns=3, max_new_tokens=8))
    traj = group.trajectories[0]
    assert traj.num_turns == 3 and traj.stop_reason is StopReason.MAX_TURNS
    # the prompt given at turn k is exactly the trajectory's token prefix before response k
    seq = traj.token_ids()
    for k, (start, end) in enumerate(traj.response_spans()):
        assert pol.prompts[k][0] == seq[:start]
    # loss mask: 1 exactly on sampled tokens, 0 on every prompt/observation token
    mask = traj.loss_mask()
    resp = {i for s, e in traj.response_spans() for i in range(s, e)}
    assert [i for i, m in enumerate(mask) if m] == sorted(resp)
    assert traj.turns[1].observation == "You are not carrying anything."


def test_observation_delta_uses_template_and_no_retokenisation(tiny_stack):
    tok, _, prompter = tiny_stack
    go = tok("go north", add_special_tokens=False)["input_ids"]
    delta = prompter.observation_ids("You arrive at cabinet 1.", go + [tok.eos_token_id])
    text = tok.decode(delta, skip_special_tokens=False)
    assert text.startswith("<|user|>") and text.endswith("<|assistant|>")
    cut = prompter.observation_ids("x", go)
    assert tok.decode(cut[:1], skip_special_tokens=False) == tok.eos_token  # closes the turn
    # stopped on a stop id that is not the template's closing token (generation configs
    # add e.g. <|endoftext|> or <|eom_id|>): the turn is still closed
    other = tok.convert_tokens_to_ids("<unk>")
    assert prompter.observation_ids("x", go + [other])[:1] == [tok.eos_token_id]


def test_malformed_output_becomes_observation_and_is_counted(tiny_stack):
    tok, _, prompter = tiny_stack
    pol = ScriptedPolicy(tok, ["go to cabinet 1 please", "<action> </action>",
                               f"<action> go to cabinet 1 {tok.eos_token}"])
    pool = EnvPool(lambda: TextWorldEnv())
    cfg = RolloutConfig(max_turns=10, max_new_tokens=12, max_invalid_streak=3)
    (group,) = rollout(pol, prompter, pool, [0, ], 2, cfg)
    for traj in group:
        assert traj.stop_reason is StopReason.INVALID and traj.num_turns == 3
        for t in traj.turns:
            assert t.info["valid_format"] is False and t.info["valid_action"] is False
            assert t.observation.startswith(INVALID_FORMAT_MESSAGE)
        assert traj.turns[0].info["format_error"] == "no <action> tag"


def test_env_errors_end_the_episode_not_the_batch(tiny_stack):
    tok, _, prompter = tiny_stack

    class Broken(TextWorldEnv):
        def step(self, action):
            raise RuntimeError("boom")

    pol = ScriptedPolicy(tok, [f"<action> look </action> {tok.eos_token}"])
    (group,) = rollout(pol, prompter, EnvPool(lambda: Broken()), [0], 2,
                       RolloutConfig(max_turns=5, max_new_tokens=8))
    assert all(t.stop_reason is StopReason.ERROR and t.num_turns == 1 for t in group)


def test_sampling_logprobs_equal_trainer_scores(tiny_stack):
    tok, model, prompter = tiny_stack
    pol = HFPolicy(model, tok, generator_seed=1, max_batch_size=3)
    pool = EnvPool(lambda: TextWorldEnv())
    groups = rollout(pol, prompter, pool, [0, 1], 3,
                     RolloutConfig(max_turns=3, max_new_tokens=6, temperature=1.0))
    for g in groups:
        for traj in g:
            scored = pol.score([traj.token_ids()])[0]
            for (s, e), turn in zip(traj.response_spans(), traj.turns):
                assert torch.allclose(torch.tensor(scored[s:e]), torch.tensor(turn.logprobs),
                                      atol=1e-4)


def test_temperature_and_top_p_logprobs_are_of_the_sampled_distribution(tiny_stack):
    tok, model, prompter = tiny_stack
    pol = HFPolicy(model, tok, generator_seed=0)
    prompt = prompter.initial_ids("You are in the middle of a room.")
    s = pol.generate([prompt], SamplingParams(max_new_tokens=1, temperature=0.5))[0]
    logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].detach()
    expect = torch.log_softmax(logits / 0.5, -1)[s.token_ids[0]]
    assert abs(float(expect) - s.logprobs[0]) < 1e-4
    g = pol.generate([prompt, prompt[:5]], SamplingParams(max_new_tokens=4, greedy=True))
    assert g[0].token_ids[0] == int(logits.argmax())
    # top_p tiny: only the argmax survives, so sampling equals greedy with logprob 0
    tp = pol.generate([prompt], SamplingParams(max_new_tokens=1, top_p=1e-6))[0]
    assert tp.token_ids[0] == int(logits.argmax()) and abs(tp.logprobs[0]) < 1e-6


class _Stateless:
    """Hides ``open_session`` so rollout re-sends full contexts every turn."""

    def __init__(self, pol):
        self.pol = pol
        self.stop_token_ids = pol.stop_token_ids

    def generate(self, prompts, params):
        return self.pol.generate(prompts, params)

    def score(self, seqs):
        return self.pol.score(seqs)

    def decode(self, ids):
        return self.pol.decode(ids)


def test_kv_session_rollout_equals_full_context_rollout(tiny_stack):
    tok, model, prompter = tiny_stack
    cfg = RolloutConfig(max_turns=6, max_new_tokens=5, greedy=True)
    pol = HFPolicy(model, tok)
    a = rollout(pol, prompter, EnvPool(lambda: TextWorldEnv()), [0, 1, 2], 2, cfg)
    b = rollout(_Stateless(pol), prompter, EnvPool(lambda: TextWorldEnv()), [0, 1, 2], 2, cfg)
    for ga, gb in zip(a, b):
        for ta, tb in zip(ga, gb):
            assert ta.token_ids() == tb.token_ids()
            for x, y in zip(ta.turns, tb.turns):
                assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


def test_admissible_commands_can_be_shown_to_the_agent(tiny_stack):
    from turngym.agents.observation import render_observation
    assert render_observation("obs", {"admissible_commands": ["look", "inventory"]}, True) == \
        "obs\nAdmissible: look | inventory"
    assert render_observation("obs", {"admissible_commands": ["look"]}, False) == "obs"
    tok, _, prompter = tiny_stack
    pol = ScriptedPolicy(tok, [f"<action> look </action> {tok.eos_token}"])
    (g,) = rollout(pol, prompter, EnvPool(lambda: TextWorldEnv()), [0], 1,
                   RolloutConfig(max_turns=2, max_new_tokens=8, show_admissible=True))
    shown = g.trajectories[0].turns[0].observation
    assert "Admissible: go to" in shown and "admissible_commands" not in g.trajectories[0].turns[0].info


def test_policy_stops_at_every_eos_the_model_declares(tiny_stack):
    """Chat models list several EOS ids in their generation config (vLLM stops at all
    of them); the transformers backend takes the same set."""
    import copy

    from turngym.agents.hf_backend import HFPolicy
    tok, model, _ = tiny_stack
    m = copy.deepcopy(model)
    m.generation_config.eos_token_id = [tok.eos_token_id, 7]
    assert HFPolicy(m, tok).stop_token_ids == (tok.eos_token_id, 7)
    assert HFPolicy(m, tok, stop_token_ids=[9]).stop_token_ids == (9,)


def test_a_branch_resumed_after_malformed_turns_keeps_their_streak(tiny_stack):
    """max_invalid_streak=3: a continuation resumed after two malformed turns is cut after
    one more, exactly as the original rollout was, not after three more."""
    from turngym.agents.branching import branch_point, branch_point_at, continue_from
    tok, _, prompter = tiny_stack
    pol = ScriptedPolicy(tok, ["go to cabinet 1 please"])  # never a well-formed action
    pool = EnvPool(lambda: TextWorldEnv())
    cfg = RolloutConfig(max_turns=10, max_new_tokens=12, max_invalid_streak=3)
    (group,) = rollout(pol, prompter, pool, [0], 1, cfg)
    (traj,) = group
    assert traj.stop_reason is StopReason.INVALID and traj.num_turns == 3
    for bp in (branch_point(traj, 2), branch_point_at(traj, 2, 2)):
        assert bp.invalid_streak == 2
        (cont,) = continue_from(pol, prompter, pool, [bp], cfg)
        assert cont.stop_reason is StopReason.INVALID and cont.num_turns == 1
    (fresh,) = continue_from(pol, prompter, pool, [branch_point(traj, 0)], cfg)
    assert fresh.num_turns == 3  # from the start: no streak yet
