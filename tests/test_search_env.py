"""turngym/SearchQA-v0: gymnasium API, Search-R1 protocol, oracle, replay, batching,
and a rollout with the tiny policy."""

import gymnasium as gym
import pytest
from conftest import SMALL_WIKI
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from turngym.envs.search.env import SearchQAEnv
from turngym.envs.search.protocol import INVALID_ACTION_MESSAGE

BM25 = {"kind": "bm25"}


def make(**kw):
    kw.setdefault("retriever", BM25)
    kw.setdefault("dataset", SMALL_WIKI)
    return SearchQAEnv(**kw)


def test_registered_and_passes_check_env():
    env = gym.make("turngym/SearchQA-v0", split="test", dataset=SMALL_WIKI, retriever=BM25)
    check_env(env.unwrapped)
    obs, info = env.reset(seed=0)
    assert obs.startswith("Answer the given question.") and "Question:" in obs
    assert info["gold_answer"] and info["task_type"].endswith("-hop")


def test_gold_answer_only_in_info():
    env = make(split="test", prompt_style="plain")
    for seed in range(50):
        obs, info = env.reset(seed=seed)
        assert obs == f"Question: {env.example.question}"
        assert all(a.lower() not in obs.lower() for a in info["gold_answer"])
        assert info["progress"] == []


def _play(env, seed):
    obs, info = env.reset(seed=seed)
    traj = [(obs, info)]
    done = False
    while not done:
        obs, r, term, trunc, info = env.step(env.oracle_action())
        traj.append((obs, info, r))
        done = term or trunc
    return traj, info


def test_oracle_solves_bundled_questions_by_searching():
    env = make(split="test", dataset=None)  # the full bundled wiki, BM25
    won, by_hop = 0, {}
    n = 150
    for seed in range(n):
        traj, info = _play(env, seed)
        won += info["won"]
        by_hop.setdefault(info["hops"], []).append(info["won"])
        searches = [t for t in traj[1:] if t[1]["action_kind"] == "search"]
        if info["won"]:
            # it read every hop's gold passage before answering (no shortcut); one search
            # may retrieve two hops' passages at once, so searches can be fewer than hops
            assert searches
            assert set(info["gold_passages"]) <= set(traj[-2][1]["progress"])
    assert won / n >= 0.9, (won, {k: sum(v) / len(v) for k, v in by_hop.items()})
    assert set(by_hop) == {1, 2, 3}


def test_answer_scoring_em_and_f1_rewards():
    env = make(split="test")
    _, info = env.reset(seed=1)
    gold = info["gold_answer"][0]
    obs, r, term, trunc, info = env.step(f"<think>sure</think><answer> {gold.upper()} </answer>")
    assert (r, term, trunc, info["won"], info["answered"]) == (1.0, True, False, True, True)
    assert info["em"] == info["f1"] == 1.0 and obs == ""
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("<answer> x </answer>")
    env_f1 = make(split="test", reward="f1")
    env_f1.reset(seed=1)
    _, r, term, _, info = env_f1.step(f"<answer> {gold} extra words </answer>")
    assert term and info["em"] == 0.0 and 0 < r == info["f1"] < 1


def test_malformed_actions_are_observations_and_turns_run_out():
    env = make(split="train", max_turns=3)
    env.reset(seed=2)
    for bad in ["I think the answer is 5", "<search>unterminated", "<answer></answer>"]:
        obs, r, term, trunc, info = env.step(bad)
        assert obs == INVALID_ACTION_MESSAGE and r == 0.0 and not term
        assert info["valid_action"] is False and info["valid_format"] is False
        assert info["format_error"]
    assert trunc and env.state.done  # third action hit max_turns
    env.reset(seed=2)
    obs, *_ = env.step(12345)  # not even text
    assert obs == INVALID_ACTION_MESSAGE


def test_search_returns_topk_information_block():
    env = make(split="test", topk=2)
    env.reset(seed=3)
    q = env.example.oracle_queries[0]
    obs, r, term, trunc, info = env.step(f"<search>{q}</search>")
    assert obs.startswith("\n\n<information>Doc 1(Title: ") and obs.endswith("</information>\n\n")
    assert "Doc 2(Title:" in obs and "Doc 3(" not in obs
    assert len(info["retrieved_ids"]) == 2 and info["action_kind"] == "search"
    assert info["progress"] == [p for p in info["retrieved_ids"] if p in info["gold_passages"]]


def test_replay_and_snapshot_reproduce_state_exactly():
    env = make(split="train")
    traj, _ = _play(env, 7)
    actions = []
    env.reset(seed=7)
    while not env.state.done:
        a = env.oracle_action()
        actions.append(a)
        env.step(a)
    final = env.state
    other = make(split="train")
    obs, info = other.replay(7, actions[:-1])
    assert obs == traj[-2][0] and info["state_key"] == traj[-2][1]["state_key"]
    snap = other.snapshot()
    o1 = other.step(actions[-1])
    other.restore(snap)
    o2 = other.step(actions[-1])
    assert o1[:4] == o2[:4] and other.state == final


class CountingRetriever:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def search(self, queries, topk):
        self.calls.append(list(queries))
        return self.inner.search(queries, topk)


def test_prepare_steps_batches_queries_with_identical_results():
    envs = [make(split="test") for _ in range(6)]
    counting = CountingRetriever(envs[0].retriever)
    for e in envs:
        e.retriever = counting
    actions = []
    for i, e in enumerate(envs):
        e.reset(seed=i)
        actions.append(f"<search> {e.example.oracle_queries[0]} </search>" if i != 4
                       else "<answer> no </answer>")
    SearchQAEnv.prepare_steps(envs, actions)
    assert len(counting.calls) == 1 and len(counting.calls[0]) == 5
    batched = [e.step(a)[0] for e, a in zip(envs, actions)]
    assert len(counting.calls) == 1  # steps used the prefetched hits
    for i, e in enumerate(envs):
        e.reset(seed=i)
    single = [e.step(a)[0] for e, a in zip(envs, actions)]
    assert batched == single and len(counting.calls) == 6


def test_rollout_with_tiny_policy_and_raw_parser(tiny_stack):
    from turngym.agents import EnvPool, HFPolicy, RolloutConfig, rollout
    from turngym.trainers.summary import summarize
    from turngym.types import StopReason

    tok, model, prompter = tiny_stack
    policy = HFPolicy(model, tok, generator_seed=0)
    pool = EnvPool(lambda: gym.make("turngym/SearchQA-v0", split="test", dataset=SMALL_WIKI,
                                    retriever=BM25, max_turns=3, prompt_style="plain"))
    cfg = RolloutConfig(max_turns=5, max_new_tokens=6, action_parser="raw")
    groups = rollout(policy, prompter, pool, [0, 1], 3, cfg)
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 6
    for t in trajs:
        assert 1 <= t.num_turns <= 3
        assert t.stop_reason in (StopReason.MAX_TURNS, StopReason.ANSWERED, StopReason.CONTEXT)
        for turn in t.turns:
            assert turn.info["valid_format"] == (turn.info["action_kind"] != "invalid")
    m = summarize(groups)
    assert set(m["f1_by_type"]) == set(m["success_by_type"])
    assert 0.0 <= m["f1"] <= 1.0
    with pytest.raises(ValueError, match="unknown action parser"):
        RolloutConfig(action_parser="nope")
