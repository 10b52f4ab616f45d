"""``turngym view RUN_DIR``: one self-contained HTML page showing where credit went.

The page reads nothing at run time: every logged group (``RUN_DIR/samples.jsonl``,
written during RL by :class:`~turngym.trainers.samples.SampleLogger`) is embedded as
JSON, one ``<script type="application/json">`` block per step that the page parses only
when that step is selected, and only the selected group is drawn -- so a run with
thousands of logged steps opens as fast as a small one.  Scripts, styles and data are
inline; a Content-Security-Policy allows no network access at all and runs only the
page's own script (by hash), and all logged text is inserted as text, never as HTML.

Each rollout is a row of turns coloured by advantage on a diverging scale (red < 0 <
blue, symmetric around 0 at the group's largest |advantage| under the chosen
estimator; numbers on hover and in the detail panel), with its outcome and stop reason.
The estimator switch shows the advantages other estimators give the same group: all are
computed here, in Python, by the registered estimators on groups rebuilt from the log
(:func:`~turngym.trainers.samples.recompute`); the switch only picks which precomputed
set colours the turns.  A probe directory (``turngym probe --out DIR`` writes
``probe_samples.jsonl``) adds its groups as a "probe" step with the Monte-Carlo true
advantage of every turn drawn under each rollout.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .trainers.samples import PROBE_SAMPLES_FILE

__all__ = [
    "PROBE_SAMPLES_FILE",
    "ViewError",
    "build_view",
    "make_server",
    "render_html",
    "write_view",
]

class ViewError(ValueError):
    """The run directory holds nothing to show (the message says why)."""


def _r(x: float) -> float:
    return round(float(x), 4)


def _rows(rows: Sequence[Sequence[float | None]]) -> list[list[float | None]]:
    """Rounded rows; null (no value, e.g. no MC truth) stays null."""
    return [[None if x is None else _r(x) for x in row] for row in rows]


def _max_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    if [len(x) for x in a] != [len(x) for x in b]:
        return math.inf
    return max((abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)), default=0.0)


def _gold_scores(rec: Mapping[str, Any], group) -> list[list[float]] | None:
    """The policy's mean gold-answer log-prob at every turn start (when logged)."""
    scores = (rec.get("scores") or {}).get("policy")
    if not scores:
        return None
    from .credit.scoring import turn_scores
    from .trainers.samples import StoredScorer
    return _rows(turn_scores(StoredScorer(group, scores), list(group), "mean", True))


def group_view(rec: Mapping[str, Any], names: Sequence[str]) -> dict:
    """What the page shows of one logged group: rollouts, every estimator's per-turn
    advantages (logged or recomputed, or why not), oracle roles, MC truth."""
    from .trainers.samples import oracle_roles, rebuild_group, recompute

    group = rebuild_group(rec)
    again = recompute(rec, [n for n in names if n in _registered()], group)
    trained = rec.get("estimator")
    probe = rec.get("source") == "probe"
    sets, notes, sources = {}, {}, {}
    for name in names:
        logged = (rec.get("credit") or {}).get(name)
        redo = again.get(name, {"skipped": "not a registered estimator here"})
        if logged is not None:
            values = logged.get("token_mean") or logged["turn"]
            sources[name] = "logged"
            how = ("computed by the probe with the real model and services" if probe
                   else "logged during training" + (" (the run's estimator)"
                                                      if name == trained else ""))
            if logged.get("token_mean"):
                how += "; a turn's colour is the mean of its token advantages"
            if "turn" in redo:
                d = _max_diff(redo["turn"], values)
                how += ("; recomputing it from the log gives the same values" if d < 1e-6
                        else f"; recomputed from the log (oracle judge, logged scores) it "
                             f"differs by up to {d:.3g}")
            sets[name], notes[name] = _rows(values), how
        elif "turn" in redo:
            sources[name] = "recomputed"
            sets[name] = _rows(redo["turn"])
            extra = ", oracle judge" if "judge" in _requirements(name) else ""
            params = "the run's params" if name == trained else "default params"
            notes[name] = f"recomputed from the logged inputs ({params}{extra})"
        else:
            sources[name], sets[name], notes[name] = "unavailable", None, redo["skipped"]
    out = {"task_id": rec["task_id"], "step": rec.get("step"),
           "slot": rec.get("slot", 0), "groups_at_step": rec.get("groups_at_step"),
           "task": rec["trajectories"][0].get("task", "") if rec["trajectories"] else "",
           "rollouts": [{"outcome": tr["outcome"], "success": tr["success"],
                         "stop": tr["stop"], "info": tr.get("info", {}),
                         "turns": tr["turns"]} for tr in rec["trajectories"]],
           "sets": sets, "notes": notes, "sources": sources,
           "roles": oracle_roles(group), "gold": _gold_scores(rec, group)}
    mc = rec.get("mc_advantage")
    if mc is not None:
        out["mc"] = _rows(mc)
        if rec.get("mc_se") is not None:
            out["mc_se"] = _rows(rec["mc_se"])
        truth = [x for row in mc for x in row]
        known = [k for k, x in enumerate(truth) if x is not None]  # null: no MC value
        out["mc_spearman"] = {}
        for n, v in sets.items():
            if v is not None and len(known) > 1:
                flat = [x for row in v for x in row]
                out["mc_spearman"][n] = _r(spearman([flat[k] for k in known],
                                                    [truth[k] for k in known]))
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank correlation, ties averaged (as the probe reports it); 0 without spread."""
    import numpy as np

    def ranks(x):
        x = np.asarray(x, dtype=np.float64)
        _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        return (first + (counts - 1) / 2.0)[inv]
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _registered() -> list[str]:
    from . import credit
    return credit.list_estimators()


def _requirements(name: str) -> tuple[str, ...]:
    from . import credit
    try:
        return credit.requirements(name)
    except KeyError:
        return ()


def _probe_path(run_dir: Path, probe: str | Path | None) -> Path | None:
    if probe is not None:
        p = Path(probe)
        p = p / PROBE_SAMPLES_FILE if p.is_dir() else p
        if not p.exists():
            raise ViewError(f"no probe samples at {p} (turngym probe --out DIR writes "
                            f"DIR/{PROBE_SAMPLES_FILE})")
        return p
    for p in (run_dir / PROBE_SAMPLES_FILE, run_dir / "probe" / PROBE_SAMPLES_FILE):
        if p.exists():
            return p
    return None


def _ranges(steps: Sequence[int]) -> str:
    out, steps = [], sorted(set(steps))
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out)


def build_view(run_dir: str | Path, step: int | None = None,
               probe: str | Path | None = None) -> tuple[dict, dict[str, list]]:
    """(index, per-step group views) for the page.  Raises :class:`ViewError` when
    there is nothing to show."""
    from .trainers.samples import SAMPLES_FILE, read_samples

    run = Path(run_dir)
    if not run.is_dir():
        raise ViewError(f"{run} is not a directory")
    train_path = run / SAMPLES_FILE
    probe_path = _probe_path(run, probe)
    records, status = ([], {"torn": 0, "capped_at": None})
    if train_path.exists():
        records, status = read_samples(train_path)
    elif probe_path is None:
        raise ViewError(f"no {SAMPLES_FILE} in {run}: runs log trajectory samples during RL "
                        "when logging.samples_per_step > 0 (a probe writes "
                        f"{PROBE_SAMPLES_FILE} with --out)")
    if step is not None:
        logged = [r["step"] for r in records]
        records = [r for r in records if r["step"] == step]
        if not records:
            raise ViewError(f"no samples at step {step} in {train_path}; logged steps: "
                            f"{_ranges(logged) or 'none'}")
    probe_records = read_samples(probe_path)[0] if probe_path is not None else []
    if not records and not probe_records:
        raise ViewError(f"{train_path if train_path.exists() else probe_path} holds no "
                        "complete group record")
    trained = [r.get("estimator") for r in records if r.get("estimator")]
    first = sorted(set(trained), key=trained.index)
    logged_names = [n for r in records + probe_records for n in (r.get("credit") or {})]
    names = list(dict.fromkeys(first + _registered() + logged_names))
    steps, blobs = [], {}
    by_step: dict[int, list] = {}
    for r in records:
        by_step.setdefault(int(r["step"]), []).append(r)
    parts = [(f"s{s}", f"step {s}", s, "train", recs) for s, recs in sorted(by_step.items())]
    if probe_records:
        parts.append(("probe", "probe (MC truth)", None, "probe", probe_records))
    for key, label, s, source, recs in parts:
        views = [group_view(r, names) for r in recs]
        blobs[key] = views
        steps.append({"key": key, "label": label, "step": s, "source": source,
                      "groups_at_step": recs[0].get("groups_at_step") or len(recs),
                      "groups": [{"task_id": v["task_id"], "rollouts": len(v["rollouts"]),
                                  "wins": sum(bool(x["success"]) for x in v["rollouts"]),
                                  "turns": sum(len(x["turns"]) for x in v["rollouts"])}
                                 for v in views]})
    default = first[0] if first else ("grpo" if "grpo" in names else names[0])
    index = {"title": run.resolve().name, "run_dir": str(run), "trained": first,
             "estimators": names, "default_estimator": default, "steps": steps,
             "capped_at": status.get("capped_at"), "torn": status.get("torn", 0),
             "initial": len(steps) - 1 - (1 if probe_records and records else 0)}
    return index, blobs


def _json_for_html(obj: Any) -> str:
    """JSON that cannot end its ``<script>`` element or open a comment: every ``<``,
    ``>`` and ``&`` (and U+2028/9) becomes a ``\\u`` escape."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


_PLACEHOLDER = re.compile(r"%(CSP|TITLE|STYLE|INDEX|DATA|SCRIPT)%")


def render_html(index: dict, blobs: Mapping[str, list]) -> str:
    script = _SCRIPT
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    csp = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
           f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'")
    data = "\n".join(f'<script type="application/json" id="d-{html.escape(k)}">'
                     f"{_json_for_html(v)}</script>" for k, v in blobs.items())
    parts = {"CSP": csp, "TITLE": html.escape(f"turngym view: {index['title']}"),
             "STYLE": _STYLE, "INDEX": _json_for_html(index), "DATA": data, "SCRIPT": script}
    # one pass: a placeholder inside inserted (agent-written) text stays text
    return _PLACEHOLDER.sub(lambda m: parts[m[1]], _PAGE)


def write_view(run_dir: str | Path, out: str | Path | None = None, step: int | None = None,
               probe: str | Path | None = None) -> tuple[Path, dict]:
    """Writes the page (default ``RUN_DIR/view.html``); returns (path, index)."""
    from .trainers.checkpoint import write_atomic_text

    index, blobs = build_view(run_dir, step, probe)
    path = Path(out) if out else Path(run_dir) / "view.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_text(path, render_html(index, blobs))
    return path, index


def make_server(page: Path, port: int = 8765) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 that answers ``GET /`` (and ``/<page name>``) with the page
    and 404 to anything else; it serves no other file."""
    body = Path(page).read_bytes()
    names = {"/", "/" + Path(page).name}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in names:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="%CSP%">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>%TITLE%</title>
<style>%STYLE%</style></head>
<body>
<header><h1 id="title"></h1><div id="meta"></div></header>
<section id="controls">
 <div class="ctl"><span class="lbl">step</span>
  <button id="prev" title="previous logged step">&#8249;</button>
  <input id="stepRange" type="range" min="0" value="0">
  <button id="next" title="next logged step">&#8250;</button>
  <input id="stepNum" type="number" title="jump to a logged step">
  <span id="stepLabel"></span></div>
 <div class="ctl"><span class="lbl">group</span><span id="groups"></span></div>
 <div class="ctl"><span class="lbl">credit</span>
  <span id="estimators" role="radiogroup"></span></div>
 <div class="ctl"><span class="lbl">show</span>
  <select id="filter"><option value="all">all rollouts</option>
   <option value="success">successes</option><option value="failure">failures</option></select>
  <label><input id="numbers" type="checkbox"> numbers in cells</label></div>
</section>
<section id="summary"><div id="task"></div><div id="note"></div><div id="legend"></div></section>
<section id="rows"></section>
<section id="detail">
 <p class="hint">Click a turn for its action, observation and info.</p></section>
<script type="application/json" id="index">%INDEX%</script>
%DATA%
<script>%SCRIPT%</script>
</body></html>
"""

_STYLE = """
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fff}
header{padding:8px 14px;background:#263238;color:#eceff1}
h1{font-size:16px;margin:0 0 2px}
#meta{font-size:12px;opacity:.85}
#controls,#summary{padding:6px 14px;border-bottom:1px solid #ddd}
.ctl{margin:3px 0;display:flex;flex-wrap:wrap;gap:4px;align-items:center}
.lbl{width:48px;color:#666;font-weight:600}
#stepRange{width:260px}#stepNum{width:70px}
button{font:inherit;border:1px solid #aaa;background:#f5f5f5;border-radius:3px;padding:1px 7px;
cursor:pointer}
button.on{background:#263238;color:#fff;border-color:#263238}
button.na{color:#aaa;border-style:dashed}
#note{color:#555;margin:3px 0}#task{white-space:pre-wrap;max-height:4.2em;overflow:auto;
color:#333;font-family:ui-monospace,monospace;font-size:12px}
#legend{display:flex;align-items:center;gap:6px;font-size:12px}
#legend .bar{width:220px;height:12px;border:1px solid #999}
#rows{padding:6px 14px;overflow-x:auto}
.rollout{display:flex;align-items:flex-start;margin:2px 0;min-height:24px}
.rlabel{flex:0 0 210px;font-size:12px;white-space:nowrap;overflow:hidden}
.rlabel .ok{color:#1b5e20;font-weight:700}.rlabel .no{color:#b71c1c;font-weight:700}
.stop{display:inline-block;padding:0 4px;border-radius:3px;background:#eceff1;margin-left:3px}
.cellrows{display:flex;flex-direction:column;gap:1px}
.cells{display:flex;gap:1px}
.turn,.mc{width:34px;height:22px;font-size:10px;text-align:center;line-height:22px;
border:1px solid rgba(0,0,0,.15);cursor:pointer;overflow:hidden;box-sizing:border-box}
.mc{height:9px;line-height:9px;font-size:0;cursor:default}
.turn.na{background:repeating-linear-gradient(45deg,#eee 0 4px,#ddd 4px 8px)}
.turn.sel{outline:2px solid #000}
.end{font-size:11px;margin-left:5px;line-height:22px;color:#444}
#detail{padding:6px 14px;border-top:1px solid #ddd}
#detail pre{white-space:pre-wrap;background:#f7f7f7;padding:5px;margin:3px 0;max-height:22em;
overflow:auto;font-size:12px}
.hint{color:#777}.warn{color:#b71c1c}
"""

_SCRIPT = r"""
(function () {
"use strict";
var $ = function (id) { return document.getElementById(id); };
var INDEX = JSON.parse($("index").textContent);
var cache = new Map();
var state = {step: Math.max(0, INDEX.initial), group: 0, est: INDEX.default_estimator,
             filter: "all", numbers: false, sel: null};

function stepGroups(key) {  // parse a step's JSON only when it is shown (LRU of 8)
  if (cache.has(key)) { var v = cache.get(key); cache.delete(key); cache.set(key, v); return v; }
  var parsed = JSON.parse($("d-" + key).textContent);
  cache.set(key, parsed);
  if (cache.size > 8) cache.delete(cache.keys().next().value);
  return parsed;
}
function el(tag, cls, text) {
  var e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
var STOPS = [[-1, [178, 24, 43]], [-0.5, [239, 138, 98]], [0, [247, 247, 247]],
             [0.5, [103, 169, 207]], [1, [33, 102, 172]]];
function colour(x) {
  x = Math.max(-1, Math.min(1, x));
  for (var k = 1; k < STOPS.length; k++) {
    if (x <= STOPS[k][0]) {
      var a = STOPS[k - 1], b = STOPS[k], u = (x - a[0]) / (b[0] - a[0]);
      return "rgb(" + a[1].map(function (c, j) {
        return Math.round(c + u * (b[1][j] - c)); }).join(", ") + ")";
    }
  }
  return "rgb(33, 102, 172)";
}
function fmt(v) {  // null: no value (every MC continuation hit an env error)
  return v === null ? "n/a" : (v > 0 ? "+" : "") + v.toFixed(3);
}
function short(s, n) { s = String(s || ""); return s.length > n ? s.slice(0, n) + " ..." : s; }
function scaleOf(rows) {
  var m = 0;
  (rows || []).forEach(function (r) { r.forEach(function (v) { m = Math.max(m, Math.abs(v)); }); });
  return m;
}

function renderMeta() {
  $("title").textContent = "turngym view: " + INDEX.title;
  var n = INDEX.steps.filter(function (s) { return s.source === "train"; }).length;
  var meta = INDEX.run_dir + "  |  trained with " + (INDEX.trained.join(", ") || "-") +
    "  |  " + n + " logged steps";
  if (INDEX.capped_at !== null) meta += "  |  samples capped at step " + INDEX.capped_at;
  if (INDEX.torn) meta += "  |  " + INDEX.torn + " torn line(s) skipped";
  $("meta").textContent = meta;
  $("stepRange").max = String(INDEX.steps.length - 1);
}

function renderSteps() {
  var st = INDEX.steps[state.step];
  $("stepRange").value = String(state.step);
  $("stepNum").value = st.step === null ? "" : String(st.step);
  $("stepLabel").textContent = st.label + "  (" + (state.step + 1) + " of " +
    INDEX.steps.length + "; " + st.groups.length + " of " + st.groups_at_step +
    " groups logged)";
  var box = $("groups");
  box.textContent = "";
  st.groups.forEach(function (g, i) {
    var b = el("button", i === state.group ? "group on" : "group",
               g.task_id + "  " + g.wins + "/" + g.rollouts + " won, " + g.turns + " turns");
    b.dataset.g = String(i);
    b.addEventListener("click", function () { state.group = i; state.sel = null; render(); });
    box.appendChild(b);
  });
}

function renderEstimators(g) {
  var box = $("estimators");
  box.textContent = "";
  INDEX.estimators.forEach(function (name) {
    var have = g.sets[name] !== null && g.sets[name] !== undefined;
    var cls = "est" + (name === state.est ? " on" : "") + (have ? "" : " na");
    var label = name + (INDEX.trained.indexOf(name) >= 0 ? " (trained)" : "");
    var b = el("button", cls, label);
    b.dataset.est = name;
    b.setAttribute("role", "radio");
    b.setAttribute("aria-checked", name === state.est ? "true" : "false");
    b.title = g.notes[name] || "";
    b.addEventListener("click", function () { state.est = name; render(); });
    box.appendChild(b);
  });
}

function se(g, i, t) {
  var x = g.mc_se ? g.mc_se[i][t] : null;
  return x === null || x === undefined ? "" : " \u00b1 " + x.toFixed(3);
}

function tooltip(g, i, t) {
  var tr = g.rollouts[i], turn = tr.turns[t], lines = [];
  var v = g.sets[state.est];
  lines.push("turn " + t + "  " + state.est + ": " +
             (v ? fmt(v[i][t]) : "not available"));
  var others = INDEX.estimators.filter(function (n) { return n !== state.est && g.sets[n]; })
    .map(function (n) { return n + " " + fmt(g.sets[n][i][t]); });
  if (others.length) lines.push(others.join("  |  "));
  var facts = "env reward " + turn.reward;
  if (g.roles && g.roles[i][t]) facts += "  |  oracle role " + g.roles[i][t];
  if (g.mc) facts += "  |  MC truth " + fmt(g.mc[i][t]) + se(g, i, t);
  if (g.gold) facts += "  |  gold log-prob " + g.gold[i][t].toFixed(3);
  lines.push(facts);
  lines.push("action: " + short(turn.action, 200));
  lines.push("observation: " + short(turn.observation, 300));
  return lines.join("\n");
}

function renderLegend(g, scale) {
  var box = $("legend");
  box.textContent = "";
  var v = g.sets[state.est];
  if (!v) return;
  box.appendChild(el("span", null, fmt(-scale)));
  var bar = el("span", "bar");
  bar.style.background = "linear-gradient(to right, " +
    [-1, -0.5, 0, 0.5, 1].map(colour).join(", ") + ")";
  box.appendChild(bar);
  box.appendChild(el("span", null, fmt(scale)));
  box.appendChild(el("span", "hint", scale > 0 ? "(red: credit taken, blue: credit given)"
                                                : "(every advantage is 0 in this group)"));
}

function renderRows(g) {
  var rows = $("rows"), v = g.sets[state.est], scale = scaleOf(v);
  var mcScale = scaleOf(g.mc);
  rows.textContent = "";
  var note = g.notes[state.est] || "";
  if (g.mc_spearman && g.mc_spearman[state.est] !== undefined)
    note += "  |  Spearman with the MC truth over this group's turns: " +
      g.mc_spearman[state.est].toFixed(3);
  $("note").textContent = state.est + ": " + note;
  $("note").className = v ? "" : "warn";
  $("task").textContent = g.task;
  renderLegend(g, scale);
  var frag = document.createDocumentFragment(), shown = 0;
  g.rollouts.forEach(function (tr, i) {
    if (state.filter === "success" && !tr.success) return;
    if (state.filter === "failure" && tr.success) return;
    shown++;
    var row = el("div", "rollout");
    row.dataset.i = String(i);
    row.dataset.success = tr.success ? "1" : "0";
    var lab = el("div", "rlabel");
    lab.appendChild(el("span", null, "#" + i + " "));
    lab.appendChild(el("span", tr.success ? "ok" : "no", tr.success ? "\u2713" : "\u2717"));
    lab.appendChild(el("span", null, " R=" + tr.outcome.toFixed(2) + " "));
    lab.appendChild(el("span", "stop", tr.stop));
    lab.title = "outcome " + tr.outcome + ", stop reason " + tr.stop + ", " +
      tr.turns.length + " turns";
    row.appendChild(lab);
    var stack = el("div", "cellrows"), cells = el("div", "cells");
    tr.turns.forEach(function (turn, t) {
      var c = el("div", "turn");
      c.dataset.i = String(i);
      c.dataset.t = String(t);
      if (v) {
        var x = v[i][t];
        c.style.background = colour(scale > 0 ? x / scale : 0);
        c.style.color = scale > 0 && Math.abs(x / scale) > 0.6 ? "#fff" : "#222";
        c.dataset.adv = String(x);
        if (state.numbers) c.textContent = x.toFixed(2);
      } else {
        c.className = "turn na";
      }
      if (state.sel && state.sel[0] === i && state.sel[1] === t) c.className += " sel";
      c.title = tooltip(g, i, t);
      c.addEventListener("click", function () { state.sel = [i, t]; render(); });
      cells.appendChild(c);
    });
    stack.appendChild(cells);
    if (g.mc) {
      var mc = el("div", "cells");
      mc.title = "Monte-Carlo true advantage V(s_t+1) - V(s_t)";
      tr.turns.forEach(function (turn, t) {
        var m = el("div", "mc");
        m.style.background = colour(mcScale > 0 ? g.mc[i][t] / mcScale : 0);
        m.title = "turn " + t + "  MC truth " + fmt(g.mc[i][t]) + se(g, i, t);
        mc.appendChild(m);
      });
      stack.appendChild(mc);
    }
    row.appendChild(stack);
    row.appendChild(el("span", "end", tr.turns.length + " turns"));
    frag.appendChild(row);
  });
  rows.appendChild(frag);
  if (!shown) rows.appendChild(el("p", "hint", "No rollout matches the filter."));
}

function renderDetail(g) {
  var box = $("detail");
  box.textContent = "";
  if (!state.sel || !g.rollouts[state.sel[0]]) {
    box.appendChild(el("p", "hint", "Click a turn for its action, observation and info."));
    return;
  }
  var i = state.sel[0], t = state.sel[1], turn = g.rollouts[i].turns[t];
  box.appendChild(el("h3", null, "rollout #" + i + ", turn " + t));
  var adv = INDEX.estimators.filter(function (n) { return g.sets[n]; })
    .map(function (n) { return n + ": " + fmt(g.sets[n][i][t]); });
  if (g.mc) adv.push("MC truth: " + fmt(g.mc[i][t]) + se(g, i, t));
  box.appendChild(el("pre", "adv", adv.join("\n")));
  box.appendChild(el("div", "lbl", "action"));
  box.appendChild(el("pre", "action", turn.action));
  if (turn.response) {
    box.appendChild(el("div", "lbl", "response"));
    box.appendChild(el("pre", "response", turn.response));
  }
  box.appendChild(el("div", "lbl", "observation"));
  box.appendChild(el("pre", "observation", turn.observation));
  box.appendChild(el("div", "lbl", "info"));
  var info = Object.assign({reward: turn.reward, oracle_role: g.roles ? g.roles[i][t] : null},
                           turn.info);
  box.appendChild(el("pre", "info", JSON.stringify(info, null, 1)));
}

function render() {
  var st = INDEX.steps[state.step];
  var groups = stepGroups(st.key);
  if (state.group >= groups.length) state.group = 0;
  var g = groups[state.group];
  renderSteps();
  renderEstimators(g);
  renderRows(g);
  renderDetail(g);
  document.body.dataset.step = st.key;
  document.body.dataset.group = String(state.group);
  document.body.dataset.estimator = state.est;
}

function goStep(k) {
  k = Math.max(0, Math.min(INDEX.steps.length - 1, k));
  if (k === state.step) return;
  state.step = k;
  state.group = 0; state.sel = null; render();
}
$("prev").addEventListener("click", function () { goStep(state.step - 1); });
$("next").addEventListener("click", function () { goStep(state.step + 1); });
$("stepRange").addEventListener("input", function () { goStep(Number($("stepRange").value)); });
$("stepNum").addEventListener("change", function () {
  var want = Number($("stepNum").value), best = 0, gap = Infinity;
  INDEX.steps.forEach(function (s, k) {
    if (s.step !== null && Math.abs(s.step - want) < gap) {
      gap = Math.abs(s.step - want); best = k;
    }
  });
  goStep(best);
});
$("filter").addEventListener("change", function () { state.filter = $("filter").value; render(); });
$("numbers").addEventListener("change", function () {
  state.numbers = $("numbers").checked; render();
});
renderMeta();
render();
document.body.dataset.ready = "1";
})();
"""
