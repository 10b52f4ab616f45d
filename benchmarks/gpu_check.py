"""GPU device check (issue 7): tokens/s for generation, scoring and training, peak
memory, and a short end-to-end rollout+update, on whatever accelerator is there.

Nothing is downloaded.  The throughput part uses a randomly initialised model of a
real architecture (default: Qwen2.5-1.5B's shapes, built from its config in code), so
the numbers are those of the real network size; ``--model-path`` uses a local
checkpoint instead.  Generation goes through vLLM when it is importable (``--backend
auto``), else through the transformers backend.  The end-to-end part runs the
quickstart pipeline (tiny model) for two RL steps on the device.

    bash benchmarks/gpu_check.sh                 # on the GPU machine (see the .sh)
    python benchmarks/gpu_check.py --smoke       # CPU, seconds: the script itself works
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from turngym.agents.hf_backend import HFPolicy
from turngym.agents.policy import SamplingParams
from turngym.trainers.batching import TokenRow
from turngym.trainers.hardware import memory_report, reset_peak_memory
from turngym.trainers.update import PolicyGradientTrainer, score_rows
from turngym.types import CreditAssignment, StopReason, Trajectory, TrajectoryGroup, Turn

# shapes from the public configs of these checkpoints
ARCHS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                 tie_word_embeddings=True),
}


class _IdTokenizer:
    """Token ids only: the throughput part never needs text."""

    def __init__(self, eos: int):
        self.eos_token_id = eos
        self.pad_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_random_model(arch: str, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(max_position_embeddings=32768, rope_theta=1e6, **ARCHS[arch])
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype)


def _synthetic_groups(vocab: int, n: int, prompt: int, new: int, group: int = 8):
    rng = random.Random(0)
    groups, credits = [], []
    for g in range(0, n, group):
        trajs, advs = [], []
        for _ in range(min(group, n - g)):
            p = tuple(rng.randrange(1, vocab) for _ in range(prompt))
            r = tuple(rng.randrange(1, vocab) for _ in range(new))
            trajs.append(Trajectory((Turn(p, r, (1,) * new, (-2.0,) * new, "a", "o"),), 0.0,
                                    False, StopReason.MAX_TURNS, f"t{g}", f"t{g}#0"))
            advs.append((rng.uniform(-1, 1),))
        groups.append(TrajectoryGroup(tuple(trajs), f"t{g}"))
        credits.append(CreditAssignment(tuple(advs)))
    return groups, credits


def _rl_cfg(token_budget: int):
    from turngym.config import load_config
    return load_config(None, ["rl.recompute_logprobs=true", f"rl.token_budget={token_budget}",
                              "rl.lr=1e-6"]).rl


def _timed(fn, device, repeats: int = 1):
    fn()  # warm-up (kernels, allocator, compilation)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    _sync(device)
    return out, (time.perf_counter() - t0) / repeats


def throughput(args, device: torch.device, report: dict) -> None:
    # the recommended GPU recipe: fp32 master weights, bf16 autocast compute
    dtype = torch.float32
    precision = "bfloat16" if device.type == "cuda" else None
    if args.model_path:
        from turngym.agents.factory import load_pretrained
        model, _ = load_pretrained(args.model_path, "float32", str(device))
        vocab = model.config.vocab_size
    else:
        model = build_random_model(args.arch, device, dtype)
        vocab = model.config.vocab_size
    n_params = sum(p.numel() for p in model.parameters())
    report["model"] = {"arch": args.model_path or args.arch, "params_m": n_params / 1e6,
                       "weights": str(dtype), "autocast": precision}
    eos = vocab - 1  # random weights almost never stop early: every row runs --new tokens
    tok = _IdTokenizer(eos)
    rng = random.Random(1)
    prompts = [[rng.randrange(1, vocab - 1) for _ in range(args.prompt)]
               for _ in range(args.batch)]
    params = SamplingParams(max_new_tokens=args.new, temperature=1.0)

    # ---------------------------------------------------------------- generation
    backend = args.backend
    if backend == "auto":
        try:
            import vllm  # noqa: F401
            backend = "vllm"
        except ImportError:
            backend = "hf"
    gen = {"backend": backend}
    policy = None
    if backend == "vllm":
        from turngym.agents.vllm_backend import VLLMPolicy
        tmp = Path(tempfile.mkdtemp(prefix="turngym_gpu_check_"))
        path = args.model_path
        if not path:
            model.save_pretrained(tmp / "model")
            path = str(tmp / "model")
        t0 = time.perf_counter()
        policy = VLLMPolicy(path, tok, stop_token_ids=[eos], dtype="bfloat16",
                            gpu_memory_utilization=args.vllm_memory,
                            engine_kwargs={"skip_tokenizer_init": True})
        gen["engine_start_s"] = time.perf_counter() - t0
    else:
        policy = HFPolicy(model, tok, stop_token_ids=[eos], max_batch_size=args.batch,
                          precision=precision)
    samples, secs = _timed(lambda: policy.generate(prompts, params), device)
    n_new = sum(len(s.token_ids) for s in samples)
    gen.update(tokens=n_new, seconds=secs, tokens_per_s=n_new / secs)
    # a second turn on the same prefixes: prefix caching / KV reuse shows up here
    turn2 = [p + list(s.token_ids) + [7, 8, 9, 10] for p, s in zip(prompts, samples)]
    _, secs2 = _timed(lambda: policy.generate(turn2, params), device)
    gen["turn2_tokens_per_s"] = n_new / secs2
    if backend == "vllm":
        from turngym.trainers.lora import export_weights
        _, sync_s = _timed(lambda: policy.sync_weights(export_weights(model)), device)
        gen["weight_sync_s"] = sync_s
    report["generation"] = gen

    # ---------------------------------------------------------------- scoring
    rows = [TokenRow(p + list(s.token_ids), [0.0] * len(p) + [1.0] * len(s.token_ids),
                     [0.0] * (len(p) + len(s.token_ids)), [0.0] * (len(p) + len(s.token_ids)))
            for p, s in zip(prompts, samples)]
    n_tok = sum(len(r.ids) for r in rows)
    reset_peak_memory(device)
    _, secs = _timed(lambda: score_rows(model, rows, 0, args.token_budget, precision), device)
    report["scoring"] = {"tokens": n_tok, "seconds": secs, "tokens_per_s": n_tok / secs,
                         **memory_report(device)}

    # ---------------------------------------------------------------- training
    groups, credits = _synthetic_groups(vocab - 1, args.batch, args.prompt, args.new)
    for name, lora in (("full", False), ("lora", True)) if args.lora else (("full", False),):
        m = model
        if lora:
            from turngym.config import load_config
            from turngym.trainers.lora import add_lora
            m = add_lora(model, load_config(None, ["rl.lora.r=64", "rl.lora.alpha=128"]).rl.lora)
        if args.grad_ckpt:
            from turngym.trainers.hardware import enable_gradient_checkpointing
            enable_gradient_checkpointing(m)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-6)
        trainer = PolicyGradientTrainer(m, opt, _rl_cfg(args.token_budget), 0,
                                        precision=precision)
        stats, secs = _timed(lambda: trainer.update(groups, credits), device)
        report[f"training_{name}"] = {
            "tokens": stats["train_tokens"], "seconds": secs,
            "tokens_per_s": stats["train_tokens"] / secs,
            **{k: v for k, v in stats.items() if k.startswith("mem/")}}
        opt = trainer = None  # free the optimizer state before the next variant
        if lora:
            model = m.unload()  # drop the adapters again
        if device.type == "cuda":
            torch.cuda.empty_cache()


def end_to_end(args, device: torch.device, report: dict) -> None:
    """The real pipeline (tiny model, text world) for two RL steps on this device."""
    from turngym.config import load_config
    from turngym.trainers.metrics import read_metrics
    from turngym.trainers.pipeline import train
    backends = ["hf"] + (["vllm"] if report.get("generation", {}).get("backend") == "vllm"
                         else [])
    for backend in backends:
        out = Path(tempfile.mkdtemp(prefix=f"turngym_e2e_{backend}_"))
        over = ["warmstart.num_demos=64", "warmstart.epochs=1", "rl.steps=2",
                "rl.tasks_per_step=4", "rl.group_size=4", "eval.num_tasks=8",
                "agent.max_turns=6", "env.eval_splits=[valid_unseen]", f"output_dir={out}",
                f"model.device={device}", f"agent.backend={backend}", "checkpoint.every=0"]
        if device.type == "cuda":
            over += ["model.autocast=bfloat16", "agent.vllm.gpu_memory_utilization=0.2"]
        # the quickstart's constrained decoding: on vllm through turngym's logits processor
        t0 = time.perf_counter()
        try:
            train(load_config("quickstart", over), progress=False)
            rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
            report[f"e2e_{backend}"] = {
                "ok": True, "seconds": time.perf_counter() - t0, "rl_steps": len(rl),
                "rollout_tok_per_s": [round(r["rollout_tok_per_s"], 1) for r in rl],
                "train_tok_per_s": [round(r["train_tok_per_s"], 1) for r in rl]}
        except Exception as exc:  # report, keep going: the other parts' numbers still count
            report[f"e2e_{backend}"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                        "trace": traceback.format_exc()[-2000:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2.5-1.5b", choices=sorted(ARCHS))
    ap.add_argument("--model-path", help="a local HF model dir instead of random weights")
    ap.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"])
    ap.add_argument("--batch", type=int, default=64, help="sequences per call")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per sequence")
    ap.add_argument("--new", type=int, default=128, help="generated tokens per sequence")
    ap.add_argument("--token-budget", type=int, default=65536)
    ap.add_argument("--vllm-memory", type=float, default=0.3)
    ap.add_argument("--no-lora", dest="lora", action="store_false")
    ap.add_argument("--no-grad-ckpt", dest="grad_ckpt", action="store_false")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU-sized run of every part")
    ap.add_argument("--out", help="write the report as JSON here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.arch, args.batch, args.prompt, args.new = "tiny", 4, 32, 8
        args.backend = "hf" if args.backend == "auto" else args.backend
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report: dict = {"python": platform.python_version(), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}
    try:
        import vllm
        report["vllm"] = vllm.__version__
    except ImportError:
        report["vllm"] = None
    t0 = time.perf_counter()
    throughput(args, device, report)
    if not args.skip_e2e:
        end_to_end(args, device, report)
    report["total_seconds"] = time.perf_counter() - t0
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    _summary(report)
    return 0 if all(v.get("ok", True) for v in report.values() if isinstance(v, dict)) else 1


def _summary(r: dict) -> None:
    print(f"\n{r['device']}  torch {r['torch']}  vllm {r['vllm']}  model {r['model']['arch']} "
          f"({r['model']['params_m']:.0f}M)", file=sys.stderr)
    for k in ("generation", "scoring", "training_full", "training_lora"):
        if k in r:
            mem = {m: round(v, 2) for m, v in r[k].items() if m.startswith("mem/")}
            print(f"  {k:<14s} {r[k]['tokens_per_s']:>12,.0f} tok/s  {mem}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
