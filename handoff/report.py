"""The incident report: a run's timeline drawn as one self-contained HTML file, or Markdown.

``Ledger.report`` folds the run (reducers/timeline.py); this module only draws what the
fold gave, so the CLI (``handoff report``), the demo and a Python caller print the very
same report. The HTML makes no request of any kind when opened: styles, script and
graphics are inline, and its Content-Security-Policy forbids every fetch, so a report
mailed around or opened from a ticket can neither leak who reads it nor change. Every
string from the ledger is escaped (HTML) or sits in a JSON block the script reads as
text: a goal or a receipt holding markup is shown, never run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from handoff.reducers.checkpoint import iso
from handoff.reducers.timeline import KEYFRAME_EVERY, Item, Timeline
from handoff.render import visible

__all__ = ["html_report", "markdown_report", "render", "FORMATS", "BIN_OVER", "BINS"]

#: The formats ``render`` draws.
FORMATS = ("html", "md")

#: More heartbeats than this in a run and its heartbeat lane is drawn as ``BINS`` bins.
BIN_OVER = 600
BINS = 240
#: The Markdown timeline lists at most this many rows (runs of heartbeats count as one).
MD_ROWS = 300

_W, _LABEL, _RIGHT, _LANE_H, _AXIS_H = 1200, 190, 10, 26, 34
_X0, _X1 = _LABEL, _W - _RIGHT


def _x(tl: Timeline, us: int) -> float:
    span = max(1, tl.end_us - tl.start_us)
    return round(_X0 + (us - tl.start_us) / span * (_X1 - _X0), 1)


_HTML_SPECIAL = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})


def _e(text: object) -> str:
    """The one escape of the HTML report: every text node and every attribute value passes
    through it (``_tag`` applies it to attributes), so no ledger string, however crafted,
    can close an attribute or a tag. ``_tag`` always quotes with '"', so "'" stays as it is
    (the CSP's 'none' reads as written)."""
    return str(text).translate(_HTML_SPECIAL)


def _tag(name: str, attrs: dict[str, object] | None = None, inner: str = "", *, void: bool = False) -> str:
    """An element with every attribute value escaped (None leaves it out). ``inner`` is
    markup already built by ``_tag`` or escaped by ``_e``."""
    at = "".join(f' {k}="{_e(v)}"' for k, v in (attrs or {}).items() if v is not None)
    return f"<{name}{at}/>" if void else f"<{name}{at}>{inner}</{name}>"


def _cls(*tokens: str) -> str:
    """A class attribute from names, some of which come from the log (a kind, a state): each
    kept to letters, digits, '-' and '_', so a name can neither add a class nor break out."""
    return " ".join(re.sub(r"[^A-Za-z0-9_-]", "_", t) for t in tokens if t)


def _json_for_script(doc: Any) -> str:
    """JSON safe inside <script type="application/json">: no '<', '>' or '&' survives."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _clock(us: int) -> str:
    text = iso(us, ms=True) or ""
    return text[11:23]


# --- the lanes -----------------------------------------------------------------------


def _item_svg(tl: Timeline, item: Item, y: int) -> str:
    title = _tag("title", None, _e(f"seq {item.seq}: {item.label}"))
    x = _x(tl, item.start_us)
    seqs = {"data-seq": item.seq, "data-end-seq": item.end_seq}
    if item.end_us is not None or item.open:
        end = _x(tl, item.end_us if item.end_us is not None else tl.end_us)
        w = max(2.0, round(end - x, 1))
        text = ""
        if item.lane == "state" and w > 8 * len(item.label) + 8:  # a band wide enough names its state
            text = _tag("text", {"class": "band-label", "x": round(x + 4, 1), "y": y + _LANE_H / 2 + 4}, _e(item.label))
        return _tag("rect", {"class": _cls("ev", "span", item.kind, "open" if item.open else ""), **seqs, "x": x,
                             "y": y + 4, "width": w, "height": _LANE_H - 8, "rx": 2}, title) + text
    cy = y + _LANE_H / 2
    return _tag("path", {"class": _cls("ev", "mark", item.kind), **seqs,
                         "d": f"M{x} {cy - 7}L{x + 6} {cy}L{x} {cy + 7}L{x - 6} {cy}Z"}, title)


def _beats_svg(tl: Timeline, y: int) -> str:
    beats = tl.beats
    if len(beats) <= BIN_OVER:
        return "".join(
            _tag("rect", {"class": "ev beat", "data-seq": s, "x": _x(tl, us) - 0.5, "y": y + 5, "width": 1.5,
                          "height": _LANE_H - 10}, _tag("title", None, _e(f"seq {s}: heartbeat at {iso(us, ms=True)}")))
            for s, us in beats)
    span = max(1, tl.end_us - tl.start_us)
    bins: list[list[int]] = [[] for _ in range(BINS)]
    for s, us in beats:
        bins[min(BINS - 1, (us - tl.start_us) * BINS // span)].append(s)
    most = max(len(b) for b in bins)
    out = []
    w = (_X1 - _X0) / BINS
    for i, seqs in enumerate(bins):
        if not seqs:
            continue
        h = max(2.0, round((_LANE_H - 8) * len(seqs) / most, 1))
        out.append(_tag("rect", {
            "class": "bin", "data-first": seqs[0], "data-last": seqs[-1], "data-count": len(seqs),
            "x": round(_X0 + i * w, 1), "y": round(y + _LANE_H - 4 - h, 1), "width": round(max(1.0, w - 0.5), 1),
            "height": h}, _tag("title", None, _e(f"{len(seqs)} heartbeats, seq {seqs[0]} to {seqs[-1]}"))))
    return "".join(out)


def _timeline_svg(tl: Timeline) -> str:
    rows = {lane: i for i, (lane, _) in enumerate(tl.lanes)}
    height = _AXIS_H + _LANE_H * len(tl.lanes) + 6
    parts = []
    for i in range(7):  # the time axis
        us = tl.start_us + (tl.end_us - tl.start_us) * i // 6
        x = _x(tl, us)
        anchor = "start" if i == 0 else "end" if i == 6 else "middle"
        parts.append(_tag("line", {"class": "tick", "x1": x, "y1": _AXIS_H - 8, "x2": x, "y2": height}, void=True)
                     + _tag("text", {"class": "axis", "x": x, "y": _AXIS_H - 14, "text-anchor": anchor}, _e(_clock(us))))
    for lane, title in tl.lanes:
        y = _AXIS_H + rows[lane] * _LANE_H
        inner = [_tag("rect", {"class": "lane-bg", "x": 0, "y": y, "width": _W, "height": _LANE_H}, void=True),
                 _tag("text", {"class": "lane-title", "x": 6, "y": y + _LANE_H / 2 + 4}, _e(title))]
        if lane == "heartbeats":
            inner.append(_beats_svg(tl, y))
        inner.extend(_item_svg(tl, it, y) for it in tl.items if it.lane == lane)
        parts.append(_tag("g", {"class": "lane", "data-lane": lane}, "".join(inner)))
    return _tag("svg", {"id": "timeline", "xmlns": "http://www.w3.org/2000/svg", "viewBox": f"0 0 {_W} {height}",
                        "width": "100%", "role": "img", "aria-label": f"timeline of run {tl.run_id}"}, "".join(parts))


# --- the page ------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#fff}
header{padding:14px 20px;background:#1d2330;color:#fff}header h1{margin:0;font-size:19px}
header p{margin:4px 0 0;color:#c9d1e0}main{display:grid;grid-template-columns:minmax(0,1fr) 430px;gap:16px;padding:16px 20px}
section{margin-bottom:16px}section h2,aside h2{font-size:15px;margin:0 0 8px}#summary dl{display:grid;grid-template-columns:260px 1fr;gap:4px 14px;margin:0}
#summary dt{font-weight:600}#summary dd{margin:0}a.proof{margin-left:6px;font-size:12px;color:#2456c7;cursor:pointer}
#timeline{display:block;margin:14px 0;border:1px solid #d8dde8;background:#fbfcfe}
.lane-bg{fill:transparent}.lane:nth-child(odd) .lane-bg{fill:#f2f4f9}.lane-title{font-size:12px;fill:#333}
.axis{font-size:11px;fill:#555}.tick{stroke:#e0e4ee}.ev{cursor:pointer;stroke:#1d2330;stroke-width:.4}
.ev.selected{stroke:#e4007c;stroke-width:2.5}.span{fill:#9fb3d9}.span.open{fill-opacity:.6}
.state-queued{fill:#c9ced8}.state-planning{fill:#a7c4f2}.state-executing{fill:#6f9de8}.state-verifying{fill:#8c7be0}
.state-blocked{fill:#f0b54a}.state-unknown{fill:#e87f5c}.state-ready_for_review{fill:#b38ce0}.state-succeeded{fill:#67c28f}
.state-delivered{fill:#2f9e5b}.state-no_op,.state-cancelled{fill:#9aa0a8}.state-failed{fill:#d9534f}
.lease-held{fill:#7fb8e6}.lease-released{fill:#9cc9a4}.lease-revoked{fill:#e07a6f}.lease-superseded{fill:#c4a3e0}
.beat{fill:#3a8f5c;stroke:none}.bin{fill:#3a8f5c;cursor:pointer}.bin.selected{fill:#e4007c}
.progress{fill:#2456c7}.activity{fill:#fff}.window-stalled{fill:#f6c65b;fill-opacity:.55}.window-unavailable{fill:#e07a6f;fill-opacity:.45}
.mark[class*="action-"]{fill:#d9534f}.mark[class*="observed-"]{fill:#f6c65b}.blocker{fill:#f0b54a}
.effect-pending{fill:#e8c16a}.effect-done{fill:#67c28f}.effect-absent{fill:#9aa0a8}.effect-reconciled{fill:#8c7be0}.effect-unknown{fill:#d9534f}
.artifact{fill:#6f9de8}.artifact-missing,.evidence-fail{fill:#d9534f}.artifact-withdrawn,.evidence-skipped{fill:#9aa0a8}.evidence-pass{fill:#2f9e5b}
.submitted{fill:#8c7be0}.approved{fill:#2f9e5b}.rejected{fill:#d9534f}.transferred{fill:#c9ced8}
.delivery-attempted{fill:#e8c16a}.delivery-confirmed{fill:#67c28f}.delivery-failed{fill:#d9534f}.delivered{fill:#2f9e5b}
.fork,.closed{fill:#1d2330}
table{border-collapse:collapse;width:100%;font-size:12.5px}td,th{border-bottom:1px solid #e3e7ef;padding:3px 6px;text-align:left;vertical-align:top}
#events tr{cursor:pointer}#events tr.selected{background:#ffe3f2}#events td.type{font-family:ui-monospace,monospace}
aside{position:sticky;top:0;align-self:start;max-height:100vh;overflow:auto;border-left:1px solid #d8dde8;padding-left:14px}
pre{white-space:pre-wrap;word-break:break-all;font-size:12px;background:#f5f7fb;padding:8px;margin:0}
.note{color:#6a7385;font-size:12.5px}button.beat-pick{font:inherit;font-size:12px;margin:2px;cursor:pointer}
.legend{font-size:12px;color:#555}.band-label{font-size:11px;fill:#1d2330;pointer-events:none}
aside td{word-break:break-all}aside td:first-child{width:110px;color:#555}
@media print{aside{display:none}main{display:block}#timeline{break-inside:avoid}}
"""

_JS = r"""
"use strict";
const D = JSON.parse(document.getElementById("report-data").textContent);
const seqs = D.records.map(r => r.seq);
const C = D.compact;
function last(arr, x) { let lo = 0, hi = arr.length; while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] <= x) lo = m + 1; else hi = m; } return lo - 1; }
function compactSeqs() { if (!C._seq) { const s = []; let acc = 0; for (const d of C.seq) { acc += d; s.push(acc); } const t = []; acc = 0; for (const d of C.us) { acc += d; t.push(acc); } C._seq = s; C._us = t; } return C._seq; }
function packetAt(i) {
  const k = i - (i % D.keyframe_every);
  const p = Object.assign({}, D.packets[k]);
  for (let j = k + 1; j <= i; j++) Object.assign(p, D.packets[j].delta);
  return p;
}
function fmt(v) { return (v === null || v === undefined) ? "-" : (typeof v === "object" ? JSON.stringify(v) : String(v)); }
function kvTable(obj, keys) {
  const t = document.createElement("table");
  for (const k of keys) { const tr = t.insertRow(); const a = tr.insertCell(); const b = tr.insertCell(); a.textContent = k; b.textContent = fmt(obj[k]); }
  return t;
}
function pre(obj) { const p = document.createElement("pre"); p.textContent = JSON.stringify(obj, null, 2); return p; }
function clearSel() { for (const el of document.querySelectorAll(".selected")) el.classList.remove("selected"); }
function select(seq) {
  seq = Number(seq);
  clearSel();
  for (const el of document.querySelectorAll('[data-seq="' + seq + '"]')) if (!el.classList.contains("proof")) el.classList.add("selected");
  const rec = document.getElementById("asof-record"), pk = document.getElementById("asof-packet"), note = document.getElementById("asof-note");
  rec.textContent = ""; pk.textContent = ""; note.textContent = "";
  document.getElementById("asof-title").textContent = "seq " + seq;
  const i = last(seqs, seq);
  if (i >= 0 && seqs[i] === seq) {
    const r = D.records[i];
    rec.appendChild(kvTable(r, ["seq", "position", "at", "type", "actor", "lease", "key", "summary", "schema_version", "prev_hash", "hash"]));
    const h = document.createElement("h3"); h.textContent = "payload"; rec.appendChild(h); rec.appendChild(pre(r.data));
    pk.appendChild(pre(packetAt(i)));
    note.textContent = "The checkpoint packet as it stood right after seq " + seq + ", health judged at " + r.at + ".";
  } else {
    const cs = compactSeqs(); const j = last(cs, seq);
    if (j < 0 || cs[j] !== seq) { note.textContent = "seq " + seq + " is not part of this report."; return; }
    const r = {seq: seq, at: new Date(C._us[j] / 1000).toISOString(), type: D.types[C.type[j]], actor: D.actors[C.actor[j]], lease: C.lease[j]};
    rec.appendChild(kvTable(r, ["seq", "at", "type", "actor", "lease"]));
    if (i >= 0) pk.appendChild(pre(packetAt(i)));
    note.textContent = "This report keeps " + D.compact_count + " events of this long run as seq and time only; the packet shown is the one after seq " + (i >= 0 ? seqs[i] : "-") +
      ", the last event kept whole before it (a heartbeat moves only last_heartbeat_at, last_seq and updated_at). The exact record: " + D.commands.record.replace("SEQ", seq) + "; the exact packet: " + D.commands.replay.replace("SEQ", seq) + ".";
  }
  document.getElementById("asof").scrollTop = 0;
}
function showBin(el) {
  clearSel(); el.classList.add("selected");
  const first = Number(el.dataset.first), lastSeq = Number(el.dataset.last);
  const found = [];
  for (const r of D.records) if (r.type === "heartbeat_recorded" && r.seq >= first && r.seq <= lastSeq) found.push(r.seq);
  const cs = compactSeqs();
  for (let j = Math.max(0, last(cs, first - 1)); j < cs.length && cs[j] <= lastSeq; j++) if (cs[j] >= first && D.types[C.type[j]] === "heartbeat_recorded") found.push(cs[j]);
  found.sort((a, b) => a - b);
  const rec = document.getElementById("asof-record"), pk = document.getElementById("asof-packet"), note = document.getElementById("asof-note");
  rec.textContent = ""; pk.textContent = "";
  document.getElementById("asof-title").textContent = el.dataset.count + " heartbeats, seq " + first + " to " + lastSeq;
  note.textContent = "Heartbeats are drawn in bins in a run this long; pick one to see its record.";
  for (const s of found.slice(0, 500)) { const b = document.createElement("button"); b.className = "beat-pick"; b.dataset.seq = s; b.textContent = s; rec.appendChild(b); }
  if (found.length > 500) { const p = document.createElement("p"); p.textContent = (found.length - 500) + " more; see " + D.commands.beats.replace("FIRST", first - 1); rec.appendChild(p); }
}
document.addEventListener("click", ev => {
  const bin = ev.target.closest(".bin");
  if (bin) { showBin(bin); return; }
  const el = ev.target.closest("[data-seq]");
  if (el) { ev.preventDefault(); select(el.dataset.seq); }
});
document.body.dataset.ready = "1";
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _script_data(tl: Timeline, db_hint: str) -> dict[str, Any]:
    types = sorted({c[2] for c in tl.compact})
    actors = sorted({c[3] for c in tl.compact})
    ti = {t: i for i, t in enumerate(types)}
    ai = {a: i for i, a in enumerate(actors)}
    seq_d, us_d, prev_s, prev_u = [], [], 0, 0
    for s, us, *_ in tl.compact:  # deltas: a long run of heartbeats costs a few bytes each
        seq_d.append(s - prev_s)
        us_d.append(us - prev_u)
        prev_s, prev_u = s, us
    run = tl.run_id
    return {
        "run_id": run, "records": tl.records, "packets": tl.packets, "keyframe_every": KEYFRAME_EVERY,
        "types": types, "actors": actors, "compact_count": len(tl.compact),
        "compact": {"seq": seq_d, "us": us_d, "type": [ti[c[2]] for c in tl.compact],
                    "actor": [ai[c[3]] for c in tl.compact], "lease": [c[4] for c in tl.compact]},
        "commands": {"record": f"handoff {db_hint}export {run} (the line with \"seq\": SEQ)",
                     "replay": f"handoff {db_hint}replay {run} --at SEQ",
                     "beats": f"handoff {db_hint}log {run} --type heartbeat_recorded --after FIRST"},
    }


def _answers_html(tl: Timeline) -> str:
    rows = []
    for a in tl.answers:
        proofs = "".join(_tag("a", {"class": "proof", "href": f"#ev-{s}", "data-seq": s}, _e(f"seq {s}")) for s in a.proof)
        rows.append(_tag("dt", None, _e(a.question))
                    + _tag("dd", {"data-answer": a.id}, _tag("span", {"class": "answer"}, _e(a.answer)) + proofs))
    return _tag("dl", None, "".join(rows))


def _events_html(tl: Timeline) -> str:
    rows = []
    beats = 0
    for r in tl.records:
        if r["type"] == "heartbeat_recorded" and len(tl.beats) > BIN_OVER:
            beats += 1
            continue
        cells = [_tag("td", None, _e(r["seq"])), _tag("td", None, _e(_clock(r["at_us"]))), _tag("td", None, _e(r["actor"])),
                 _tag("td", {"class": "type"}, _e(r["type"])), _tag("td", None, _e(r["summary"]))]
        rows.append(_tag("tr", {"id": f"ev-{r['seq']}", "data-seq": r["seq"]}, "".join(cells)))
    skipped = beats + sum(1 for c in tl.compact if c[2] == "heartbeat_recorded")
    note = (_tag("p", {"class": "note"}, _e(f"{skipped} heartbeats are in the heartbeat lane's bins, not listed here."))
            if skipped else "")
    head = "".join(_tag("th", None, _e(h)) for h in ("seq", "time (UTC)", "actor", "type", "what"))
    return (_tag("table", {"id": "events"}, _tag("thead", None, _tag("tr", None, head)) + _tag("tbody", None, "".join(rows)))
            + note)


def html_report(tl: Timeline, *, as_of: str | None = None, db_hint: str = "") -> str:
    """The report as one HTML document (str). ``as_of`` says in words where the story was
    cut (``--at``/``--as-of``); ``db_hint`` (e.g. "--db x.db ") goes into the commands the
    page suggests for events it keeps as seq and time only."""
    data = _json_for_script(_script_data(tl, db_hint))
    csp = (f"default-src 'none'; script-src {_csp_hash(_JS)}; style-src {_csp_hash(_CSS)}; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    p = tl.final_packet
    fork = ""
    if tl.fork:
        f = tl.fork
        fork = _tag("p", {"id": "fork"}, _e("Forked from ") + _tag("code", None, _e(f["parent"]))
                    + _e(f" at its seq {f['parent_seq']} (seq {f['seq']} here): the packets include the origin's "
                         "history; its events are in ")
                    + _tag("code", None, _e(f"handoff report {f['parent']} --at {f['parent_seq']}")) + ".")
    cut = as_of or f"the end of the log (seq {tl.last_seq})"
    legend = ("state bands; a lease span per worker (blue held, green released, red revoked, violet superseded); "
              "heartbeat ticks apart from progress marks (filled: progress, hollow: activity only); watchdog "
              "windows (yellow stalled, red unavailable) and actions; blockers; side effects; artifacts and "
              "evidence; review; delivery attempts and the confirmation.")
    story = _tag("div", {"id": "story"}, "".join([
        _tag("section", {"id": "summary"}, _tag("h2", None, "Summary") + _answers_html(tl) + fork),
        _tag("section", {"id": "lanes"},
             _tag("h2", None, _e(f"Timeline, {iso(tl.start_us, ms=True)} to {iso(tl.end_us, ms=True)} (UTC)"))
             + _timeline_svg(tl) + _tag("p", {"class": "legend"}, _e(legend))),
        _tag("section", {"id": "event-list"}, _tag("h2", None, "Events") + _events_html(tl)),
    ]))
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        _tag("meta", {"http-equiv": "Content-Security-Policy", "content": csp}, void=True),
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        _tag("title", None, _e(f"Incident report: {tl.run_id}")), f"<style>{_CSS}</style></head><body>",
        _tag("header", None, _tag("h1", None, _e("Incident report: run ") + _tag("span", {"id": "run-id"}, _e(tl.run_id)))
             + _tag("p", None, f"{_e(p['goal'])} &middot; owner {_e(p['owner'])} &rarr; {_e(p['target'])} &middot; "
                               f"as the ledger stood at {_e(cut)}, {_e(iso(tl.end_us, ms=True))}")),
        "<main>", story,
        '<aside id="asof"><h2 id="asof-title">Select an event</h2><p id="asof-note" class="note">Click any mark, span, '
        "row or proof link: its whole record shows here, and the checkpoint packet as it stood right after it."
        '</p><div id="asof-record"></div><h2>Packet right after this event</h2><div id="asof-packet"></div></aside></main>',
        # The data block is JSON made safe for a script element (no '<', '>' or '&' survives);
        # the scripts and styles are fixed text, hashed into the CSP.
        f'<script type="application/json" id="report-data">{data}</script>',
        f"<script>{_JS}</script></body></html>\n",
    ])


# --- Markdown --------------------------------------------------------------------------


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]<>|"})


def _md(text: object) -> str:
    """Ledger text on one line (``render.one_line``'s rule, uncut) with Markdown's active
    characters escaped: a goal or a detail cannot become a link, an image that fetches,
    HTML, a table cell break or a terminal escape."""
    return visible(" ".join(str(text).split())).translate(_MD_SPECIAL)


def markdown_report(tl: Timeline, *, as_of: str | None = None) -> str:
    """The summary and a compact timeline as Markdown, for a ticket or a chat thread:
    runs of heartbeats become one row, and at most ``MD_ROWS`` rows are listed."""
    p = tl.final_packet
    cut = as_of or f"the end of the log (seq {tl.last_seq})"
    lines = [f"# Incident report: run `{tl.run_id}`", "",
             f"{_md(p['goal'])}; owner {_md(p['owner'])}, target {_md(p['target'])}. As the ledger stood at "
             f"{_md(cut)}, {iso(tl.end_us, ms=True)}.", ""]
    if tl.fork:
        lines += [f"Forked from `{tl.fork['parent']}` at its seq {tl.fork['parent_seq']}.", ""]
    lines += ["## Summary", ""]
    for a in tl.answers:
        proof = f" (proof: {', '.join(f'seq {s}' for s in a.proof)})" if a.proof else ""
        lines.append(f"- **{_md(a.question)}** {_md(a.answer)}{proof}")
    lines += ["", "## Timeline", "", "| seq | time (UTC) | actor | event | what |", "|---|---|---|---|---|"]
    rows: list[str] = []
    run: list[tuple[int, int, str]] = []  # a run of consecutive heartbeats

    def flush() -> None:
        if run:
            s0, t0, actor = run[0]
            s1, t1, _ = run[-1]
            seqs = f"{s0}" if s0 == s1 else f"{s0}-{s1}"
            times = _clock(t0) if s0 == s1 else f"{_clock(t0)}-{_clock(t1)}"
            rows.append(f"| {seqs} | {times} | {_md(actor)} | {len(run)} x heartbeat_recorded | |")
            run.clear()

    events = sorted([(r["seq"], r["at_us"], r["actor"], r["type"], r["summary"]) for r in tl.records]
                    + [(c[0], c[1], c[3], c[2], "") for c in tl.compact])
    for seq, us, actor, type_, summary in events:
        if type_ == "heartbeat_recorded":
            run.append((seq, us, actor))
            continue
        flush()
        rows.append(f"| {seq} | {_clock(us)} | {_md(actor)} | {type_} | {_md(summary)} |")
    flush()
    lines += rows[:MD_ROWS]
    if len(rows) > MD_ROWS:
        lines += ["", f"{len(rows) - MD_ROWS} more rows not shown: `handoff log {tl.run_id} --no-heartbeats`."]
    return "\n".join(lines) + "\n"


def render(tl: Timeline, fmt: str, *, as_of: str | None = None, db_hint: str = "") -> str:
    """The report in ``fmt`` ("html" or "md")."""
    if fmt == "md":
        return markdown_report(tl, as_of=as_of)
    return html_report(tl, as_of=as_of, db_hint=db_hint)
