"""Warm-start demonstrations from an env's expert (``env.unwrapped.oracle_action``).

Noise injection (DART-style): with probability ``epsilon`` the expert's action is
replaced by a random admissible one, and with probability ``corrupt`` by a
corrupted copy of the expert action (one word swapped, usually invalid: "Nothing
happens.").  The expert then recovers.  Injected actions get loss mask 0 unless
``train_on_noise``, so the policy learns to *recover* from detours and invalid
actions it will make itself, without learning to make them.  Only successful
demos are kept.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym

from ..agents.observation import PLAIN_VIEW, ObservationView
from ..agents.prompting import ChatPrompter
from ..agents.transcript import Transcript
from ..envs.base import HasOracle
from ..types import ContextMode
from .batching import TokenRow


@dataclass(frozen=True)
class Demo:
    first_observation: str  # as the agent sees it (admissible commands appended if shown)
    steps: tuple[tuple[str, str, bool], ...]  # (action, observation as shown, is_expert)
    task_id: str
    first_plain: str = ""  # without the shown extras (window mode keeps history plain)
    plain: tuple[str, ...] = ()  # each step's observation without the shown extras


def noisy_expert_action(expert: str, info: dict, words: list[str], rng: random.Random,
                        epsilon: float, corrupt: float) -> str:
    """The warm start's noise on the expert's action: with probability ``epsilon`` a
    random admissible command, with probability ``corrupt`` a corrupted one, else the
    expert's (one ``rng.random()`` draw decides)."""
    u = rng.random()
    if u < epsilon:
        return rng.choice(info.get("admissible_commands") or [expert])
    if u < epsilon + corrupt:
        return corrupt_action(expert, words, rng)
    return expert


def corrupt_action(action: str, words: list[str], rng: random.Random) -> str:
    parts = action.split()
    if not parts or not words:
        return action
    parts[rng.randrange(len(parts))] = rng.choice(words)
    return " ".join(parts)


def _expert_env(make_env: Callable[[], gym.Env], remedy: str) -> gym.Env:
    env = make_env()
    if not isinstance(env.unwrapped, HasOracle):
        raise TypeError(f"{type(env.unwrapped).__name__} has no oracle_action() (HasOracle); "
                        + remedy)
    return env


def collect_demos(make_env: Callable[[], gym.Env], num: int, epsilon: float, seed: int,
                  max_turns: int, progress=None, view: ObservationView = PLAIN_VIEW,
                  corrupt: float = 0.0) -> list[Demo]:
    """Observations are stored as the agent would see them (``view``) and plain."""
    env = _expert_env(make_env, "disable warmstart or give the env an expert")
    rng = random.Random(seed)
    demos: list[Demo] = []
    words: list[str] = []
    attempts = 0
    while len(demos) < num and attempts < 3 * num + 10:
        task_seed = rng.randrange(2**31 - 1)
        attempts += 1
        obs0, info = env.reset(seed=task_seed)
        shown0 = view.first(obs0, info, env)
        steps, plain = [], []
        won = False
        for _ in range(max_turns):
            expert = env.unwrapped.oracle_action()
            a = noisy_expert_action(expert, info, words, rng, epsilon, corrupt)
            obs, reward, term, trunc, info = env.step(a)
            words.extend(w for w in obs.lower().replace(",", " ").replace(".", " ").split()
                         if len(words) < 5000)
            steps.append((a, view.render(obs, info), a == expert))
            plain.append(obs)
            if term or trunc:
                won = bool(term and reward > 0)
                break
        if won:
            demos.append(Demo(shown0, tuple(steps), str(info.get("task_id", task_seed)),
                              obs0, tuple(plain)))
            if progress is not None:
                progress(1)
    env.close()
    return demos


def rollin_demos(make_env: Callable[[], gym.Env], rollins: list[tuple[int, list[str], bool]],
                 max_turns: int, seed: int, view: ObservationView = PLAIN_VIEW
                 ) -> list[Demo]:
    """DAgger-style demonstrations in the states the learner itself reaches (learner
    roll-in, expert roll-out): for each ``(task seed, learner actions, learner won)`` the
    env replays a random prefix of the learner's actions -- at least one, and short of
    the learner's own win -- which become masked steps like injected noise, then the
    expert takes over.  Kept only if the expert wins within ``max_turns`` in all.  The
    noise of :func:`collect_demos` is synthetic; these are the learner's own mistakes
    (the wrong instance of a held object, loops after "Nothing happens."), each followed
    by the expert's recovery from exactly that state."""
    env = _expert_env(make_env, "warmstart.rollin needs an expert")
    rng = random.Random(f"rollin-{seed}")
    demos: list[Demo] = []
    for task_seed, actions, won in rollins:
        last = len(actions) - 1 if won else len(actions)
        if "" in actions[:last]:  # an unparseable response has no action text to replay
            last = actions.index("")
        if last < 1:
            continue
        prefix = actions[: rng.randint(1, last)]
        obs0, info = env.reset(seed=int(task_seed))
        shown0 = view.first(obs0, info, env)
        steps, plain = [], []
        term = trunc = False
        reward = 0.0
        for k in range(max_turns):
            a = prefix[k] if k < len(prefix) else env.unwrapped.oracle_action()
            obs, reward, term, trunc, info = env.step(a)
            steps.append((a, view.render(obs, info), k >= len(prefix)))
            plain.append(obs)
            if term or trunc:
                break
        if term and reward > 0 and len(steps) > len(prefix):
            demos.append(Demo(shown0, tuple(steps), str(info.get("task_id", task_seed)),
                              obs0, tuple(plain)))
    env.close()
    return demos


def renamed_demos(demos: list[Demo], make_renamer, prob: float, seed: int) -> list[Demo]:
    """Each demo replaced, with probability ``prob``, by a copy whose every text went
    through one fresh renaming (``make_renamer(rng, texts)``, see ``HasRenaming``).  Its
    own RNG stream: the demos themselves (and so runs without renaming) are unchanged."""
    rng = random.Random(f"rename-{seed}")
    out = []
    for d in demos:
        if rng.random() >= prob:
            out.append(d)
            continue
        f = make_renamer(rng, demo_texts([d]))
        out.append(Demo(f(d.first_observation), tuple((f(a), f(o), e) for a, o, e in d.steps),
                        d.task_id, f(d.first_plain), tuple(f(p) for p in d.plain)))
    return out


def demo_texts(demos: list[Demo]) -> list[str]:
    out = []
    for d in demos:
        out.append(d.first_observation)
        for a, o, _ in d.steps:
            out.append(a)
            out.append(o)
    return out


def demo_rows(demos: list[Demo], prompter: ChatPrompter, tokenizer, action_format: str,
              max_tokens: int, train_on_noise: bool = False,
              context_mode: ContextMode = ContextMode.FULL, window_turns: int = 4
              ) -> list[TokenRow]:
    """Token rows with loss on the expert's responses (and injected ones if asked).

    The context is built by the rollout's own :class:`~turngym.agents.transcript.Transcript`,
    so a demo row is token for token what the policy would see: one row per demo in
    full-history mode, one row per trained step in window mode."""
    eos = tokenizer.eos_token_id
    mode = ContextMode(context_mode)
    rows = []
    for d in demos:
        tr = Transcript(prompter, mode, window_turns, d.first_plain or d.first_observation,
                        d.first_observation)
        ids: list[int] = []
        mask: list[float] = []
        for k, (a, o, is_expert) in enumerate(d.steps):
            resp = list(tokenizer(action_format.format(action=a), add_special_tokens=False)
                        ["input_ids"]) + [eos]
            train = 1.0 if (is_expert or train_on_noise) else 0.0
            if mode is ContextMode.WINDOW:
                prompt = tr.prompt()
                if train and len(prompt) + len(resp) <= max_tokens:
                    rows.append(_row(prompt + resp, [0.0] * len(prompt) + [1.0] * len(resp)))
            else:
                new = tr.pending() if k else tr.prompt()
                ids += new + resp
                mask += [0.0] * len(new) + [train] * len(resp)
            if k + 1 < len(d.steps):
                plain = d.plain[k] if d.plain else o
                tr.add(resp, plain, o)
        if mode is ContextMode.FULL and len(ids) <= max_tokens:
            rows.append(_row(ids, mask))
    return rows


def _row(ids: list[int], mask: list[float]) -> TokenRow:
    return TokenRow(ids, mask, [0.0] * len(ids), [0.0] * len(ids))


def lm_rows(texts: list[str], tokenizer, row_tokens: int) -> list[TokenRow]:
    """Texts packed into rows of about ``row_tokens`` tokens (eos between texts), loss on
    every token: a plain language-modelling pass over an env's corpus."""
    eos = tokenizer.eos_token_id
    rows, ids = [], []
    for ids_t in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(list(ids_t) + [eos])
        if len(ids) >= row_tokens:
            rows.append(TokenRow(ids, [1.0] * len(ids), [0.0] * len(ids), [0.0] * len(ids)))
            ids = []
    if len(ids) > 1:
        rows.append(TokenRow(ids, [1.0] * len(ids), [0.0] * len(ids), [0.0] * len(ids)))
    return rows
