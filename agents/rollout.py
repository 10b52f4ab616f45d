"""Batched multi-turn rollout loop (token-in-token-out).

All live episodes of a batch are advanced together: one batched ``generate``
call per turn, then one env step per episode.  The context of each episode is
the list of token ids the policy saw and sampled; observations are appended as
chat-formatted token deltas, and the loss mask is 0 on them by construction
(prompt tokens vs response tokens), with no token scanning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym

from ..envs.base import BatchedSteps
from ..types import ContextMode, StopReason, Trajectory, TrajectoryGroup, Turn
from .constraints import ADMISSIBLE_KEY, ActionChoices, ActionConstraint
from .observation import ObservationView
from .parsing import INVALID_FORMAT_MESSAGE, ParsedAction, get_parser
from .policy import (Policy, Sample, SamplingParams, SupportsConstrainedDecoding,
                     SupportsSessions)
from .prompting import ChatPrompter
from .transcript import Transcript

# info keys too bulky to keep on every turn
_DROP_INFO = (ADMISSIBLE_KEY,)


@dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 50
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    max_context_tokens: int = 4096
    max_invalid_streak: int = 0  # 0 disables the cut-off
    require_think: bool = False
    keep_admissible: bool = False
    show_admissible: bool = False  # append info["admissible_commands"] to what the agent sees
    show_inventory: bool = False  # append info["inventory"] (what the agent holds)
    action_parser: str = "action_tag"  # see agents.parsing.PARSERS
    context_mode: ContextMode = ContextMode.FULL
    window_turns: int = 4  # WINDOW mode: exchanges kept besides the task
    # constrained decoding: each response is one of info["admissible_commands"] written in
    # ``action_format`` + the stop token (agents.constraints)
    constrain_actions: bool = False
    action_format: str = "<action> {action} </action>"

    def __post_init__(self) -> None:
        get_parser(self.action_parser)  # fail early on an unknown name
        object.__setattr__(self, "context_mode", ContextMode(self.context_mode))
        if self.context_mode is ContextMode.WINDOW and self.window_turns < 1:
            raise ValueError("window_turns must be >= 1 in window mode")

    @property
    def view(self) -> ObservationView:
        return ObservationView(self.show_admissible, self.show_inventory)

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.max_new_tokens, self.temperature, self.top_p, self.greedy)

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the distribution the sampler's log-probs (and tokens) come from:
        the one the trainer and the entropy screen must score (greedy: the model's own)."""
        return 1.0 if self.greedy else self.temperature


def clean_info(info: dict, keep_admissible: bool) -> dict:
    """An env info as a Turn keeps it (bulky keys dropped unless asked for)."""
    if keep_admissible:
        return dict(info)
    return {k: v for k, v in info.items() if k not in _DROP_INFO}


@dataclass
class Episode:
    """One episode in flight: its env, its token context and the turns so far."""

    env: gym.Env
    task_seed: int
    group_id: str
    transcript: Transcript
    task_id: str = ""
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    stop: StopReason = StopReason.MAX_TURNS
    total_reward: float = 0.0
    success: bool = False
    invalid_streak: int = 0
    info0: dict = field(default_factory=dict)
    start_turn: int = 0  # > 0 for continuations resumed mid-episode (agents.branching)
    response_prefix: list = field(default_factory=list)  # mid-response branch: tokens so far
    commands: tuple = ()  # the env's admissible commands now (constrained decoding)


def start_episode(env: gym.Env, seed: int, group_id: str, prompter: ChatPrompter,
                  cfg: RolloutConfig, options: dict | None = None) -> Episode:
    """Resets ``env`` to task ``seed`` and opens the episode's transcript."""
    obs, info = env.reset(seed=int(seed), options=options)
    return open_episode(env, seed, group_id, prompter, cfg, obs, info)


def open_episode(env: gym.Env, seed: int, group_id: str, prompter: ChatPrompter,
                 cfg: RolloutConfig, obs: str, info: dict) -> Episode:
    """The episode of ``env``, just reset to task ``seed`` (which returned ``obs``, ``info``)."""
    tr = Transcript(prompter, cfg.context_mode, cfg.window_turns, obs,
                    cfg.view.first(obs, info, env))
    tid = str(info.get("task_id", f"seed-{seed}"))
    info0 = clean_info(info, cfg.keep_admissible)
    info0["first_observation"] = obs  # for judges; the agent saw it as tokens
    return Episode(env, int(seed), group_id, tr, tid, info0=info0,
                   commands=tuple(info.get(ADMISSIBLE_KEY) or ()))


class EnvPool:
    """Reuses env instances across rollout batches (creation can be costly)."""

    def __init__(self, make_env: Callable[[], gym.Env]):
        self.make_env = make_env
        self._free: list[gym.Env] = []

    def take(self, n: int) -> list[gym.Env]:
        while len(self._free) < n:
            self._free.append(self.make_env())
        out, self._free = self._free[:n], self._free[n:]
        return out

    def give(self, envs: Sequence[gym.Env]) -> None:
        self._free.extend(envs)


def rollout(policy: Policy, prompter: ChatPrompter, pool: EnvPool, task_seeds: Sequence[int],
            group_size: int, cfg: RolloutConfig, policy_version: int = 0,
            reset_options: dict | None = None, progress: Callable[[int], None] | None = None
            ) -> list[TrajectoryGroup]:
    """Runs ``group_size`` episodes for each task seed; returns one group per seed."""
    if group_size < 1:
        raise ValueError("group_size must be >= 1")
    envs = pool.take(len(task_seeds) * group_size)
    try:
        episodes = []
        for k, seed in enumerate(task_seeds):
            for g in range(group_size):
                e = start_episode(envs[k * group_size + g], seed, "", prompter, cfg,
                                  reset_options)
                e.group_id = f"{e.task_id}#{k}"
                episodes.append(e)
        run_episodes(policy, prompter, episodes, cfg, progress)
    finally:
        pool.give(envs)
    groups: dict[str, list[Trajectory]] = {}
    for e in episodes:
        groups.setdefault(e.group_id, []).append(to_trajectory(e, policy_version))
    return [TrajectoryGroup(tuple(v), v[0].task_id) for v in groups.values()]


def to_trajectory(e: Episode, policy_version: int = 0) -> Trajectory:
    tr = e.transcript
    history = tr.history() if tr.mode is ContextMode.WINDOW else ()
    return Trajectory(tuple(e.turns), e.total_reward, e.success, e.stop, e.task_id,
                      e.group_id, policy_version, {"task_seed": e.task_seed, **e.info0},
                      tr.mode, history)


def run_episodes(policy: Policy, prompter: ChatPrompter, episodes: Sequence[Episode],
                 cfg: RolloutConfig, progress: Callable[[int], None] | None = None) -> None:
    """Advances every episode until it is done: one batched generate per turn."""
    params = cfg.sampling()
    parse = get_parser(cfg.action_parser)
    constraint = _constraint(policy, prompter, cfg)
    # full history on a backend with KV sessions: a turn prefills only its new tokens
    session = (policy.open_session(len(episodes)) if cfg.context_mode is ContextMode.FULL
               and isinstance(policy, SupportsSessions) else None)
    for _ in range(cfg.max_turns):
        live_idx = [i for i, e in enumerate(episodes) if not e.done]
        if not live_idx:
            break
        live = [episodes[i] for i in live_idx]
        # a mid-response branch has part of its response already: only the rest is new
        budget = [params.max_new_tokens - len(e.response_prefix) for e in live]
        prompts = [e.transcript.prompt() for e in live]
        full = rest = None
        if constraint is not None:
            full = [constraint.choices(e.commands) for e in live]
            rest = [c.after(e.response_prefix) for c, e in zip(full, live)]
        extra = {} if rest is None else {"choices": rest}
        if session is not None:
            samples = session.generate(live_idx, [e.transcript.pending() for e in live], params,
                                       max_new=budget, **extra)
        else:
            samples = [_cut(s, b, policy.stop_token_ids) for s, b in
                       zip(policy.generate(prompts, params, **extra), budget)]
        if full is None:
            parsed = [parse(policy.decode(list(e.response_prefix) + list(s.token_ids)),
                            require_think=cfg.require_think) for e, s in zip(live, samples)]
        else:
            parsed = [_chosen(c, list(e.response_prefix) + list(s.token_ids))
                      for c, e, s in zip(full, live, samples)]
        _prepare_steps(live, parsed)
        for k, (e, s, p, ctx) in enumerate(zip(live, samples, parsed, prompts)):
            allowed = () if rest is None else rest[k].sequences
            _advance(e, s, p, cfg, e.start_turn + len(e.turns), ctx, allowed)
        if progress is not None:
            progress(len(live))


def _constraint(policy: Policy, prompter: ChatPrompter, cfg: RolloutConfig
                ) -> ActionConstraint | None:
    if not cfg.constrain_actions:
        return None
    if not (isinstance(policy, SupportsConstrainedDecoding) and policy.supports_choices):
        raise ValueError(f"agent.constrain_actions: this {type(policy).__name__} cannot "
                         "restrict sampling to given token sequences (the hf backend can; a "
                         "vLLM engine must be started with constrain_actions=True)")
    eos = prompter.tok.eos_token_id
    stop = int(eos) if eos is not None else int(policy.stop_token_ids[0])
    return ActionConstraint(prompter.tok, cfg.action_format, stop, cfg.max_new_tokens)


def _chosen(choices: ActionChoices, ids: Sequence[int]) -> ParsedAction:
    """The action a constrained response spells (a cut-off one spells none)."""
    action = choices.action_of(ids)
    if action is None:
        return ParsedAction(None, error="constrained response did not finish a command")
    return ParsedAction(action)


def _cut(sample: Sample, n: int, stop_ids) -> Sample:
    """A sample shortened to ``n`` tokens (backends without per-row limits)."""
    n = max(1, n)
    if len(sample.token_ids) <= n:
        return sample
    ids = tuple(sample.token_ids[:n])
    return Sample(ids, tuple(sample.logprobs[:n]), ids[-1] in stop_ids)


def _prepare_steps(live: Sequence[Episode], parsed: Sequence[ParsedAction]) -> None:
    """Lets env classes batch the expensive part of one turn's steps (e.g. one
    retriever call for every search query) through :class:`~turngym.envs.base.BatchedSteps`;
    ``step`` stays the plain gymnasium API."""
    by_cls: dict[type, tuple[list, list]] = {}
    for e, p in zip(live, parsed):
        env = e.env.unwrapped
        if isinstance(env, BatchedSteps):
            envs, acts = by_cls.setdefault(type(env), ([], []))
            envs.append(env)
            acts.append(p.action or "")
    for cls, (envs, acts) in by_cls.items():
        try:
            cls.prepare_steps(envs, acts)
        except Exception:  # batching is an optimisation: step() still works alone
            pass


def _advance(e: Episode, s: Sample, parsed: ParsedAction, cfg: RolloutConfig, turn_idx: int,
             context: list[int], choices: tuple = ()) -> None:
    action = parsed.action or ""
    info: dict[str, Any]
    try:
        obs, reward, terminated, truncated, info = e.env.step(action)
    except Exception as exc:  # an env bug must not kill the whole batch
        obs, reward, terminated, truncated = f"Error: {type(exc).__name__}: {exc}", 0.0, True, False
        info = {"env_error": repr(exc)}
        e.stop = StopReason.ERROR
    shown = cfg.view.render(obs, info)
    plain = obs
    e.commands = tuple(info.get(ADMISSIBLE_KEY) or ())
    if not parsed.ok:
        shown, plain = f"{INVALID_FORMAT_MESSAGE} {shown}", f"{INVALID_FORMAT_MESSAGE} {obs}"
    info = clean_info(info, cfg.keep_admissible)
    info["valid_format"] = parsed.ok and bool(info.get("valid_format", True))
    if parsed.error:
        info["format_error"] = parsed.error
    info.setdefault("valid_action", parsed.ok)
    # the turn's prompt: in FULL mode the tokens new since the last response, in WINDOW
    # mode the whole window (each turn is its own training row)
    prompt = context if e.transcript.mode is ContextMode.WINDOW else e.transcript.pending()
    e.invalid_streak = 0 if parsed.ok else e.invalid_streak + 1
    info["invalid_streak"] = e.invalid_streak  # where a branch resumed after this turn starts
    e.turns.append(Turn(tuple(prompt), tuple(s.token_ids), (1,) * len(s.token_ids),
                        tuple(s.logprobs), action, shown, float(reward), info, choices))
    e.total_reward += float(reward)
    prefix, e.response_prefix = e.response_prefix, []
    if info.get("won"):
        e.success = True
    if e.stop is StopReason.ERROR:
        e.done = True
        return
    if terminated:
        e.done = True
        e.success = bool(info["won"]) if "won" in info else (e.success or reward > 0)
        if info.get("answered"):
            e.stop = StopReason.ANSWERED
        else:
            e.stop = StopReason.WON if e.success else StopReason.TERMINATED
        return
    if truncated or turn_idx + 1 >= cfg.max_turns:
        e.done, e.stop = True, StopReason.MAX_TURNS
        return
    if cfg.max_invalid_streak and e.invalid_streak >= cfg.max_invalid_streak:
        e.done, e.stop = True, StopReason.INVALID
        return
    e.transcript.add(s.token_ids, plain, shown, prefix)
    if len(e.transcript.prompt()) + cfg.max_new_tokens > cfg.max_context_tokens:
        e.done, e.stop = True, StopReason.CONTEXT
