"""How the ledger reads to people and programs: text and JSON-ready documents.

The CLI, the demo and (soon) reports print through these functions, so a packet, a
timeline or a time reads the same wherever it shows. Everything here is pure: it takes
what the ``Ledger`` returned and gives back strings or plain dicts, never reads the
store, the clock or the terminal. The documents are the ``--json`` shapes of
docs/cli.md; changing one changes a documented interface.

Text:
    ``visible`` (ledger text made safe to print: the one home of that rule), ``iso``,
    ``iso_ms`` (times), ``one_line``, ``table`` / ``table_lines`` (aligned columns),
    ``summarize`` (an event in one line), ``format_packet``, ``format_log``.
Documents:
    ``packet`` is ``Ledger.status`` itself; ``write_doc``, ``delivery_doc``, ``log_row``,
    ``run_row``, ``stall_row`` and ``action_doc`` build the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from handoff.ledger.inputs import CONTROL_CHARS
from handoff.reducers import delivery as dl
from handoff.reducers.checkpoint import iso

__all__ = [
    "visible", "lines", "iso", "iso_ms", "one_line", "cells", "table_lines", "table", "summarize", "attrs_text",
    "format_packet",
    "LOG_HEADERS", "log_row", "log_rows", "log_cells", "format_log", "write_doc", "delivery_doc",
    "run_row", "stall_row", "action_doc", "LEDGER_LOG_HEADERS", "ledger_row", "ledger_log_cells", "format_diff",
]


# --- text pieces -------------------------------------------------------------------------


#: What ``visible`` escapes: what the ledger refuses on input (inputs.CONTROL_CHARS, which
#: an older log or an imported one may still hold), tab and newline, the Unicode line and
#: paragraph separators, and lone surrogates (an undecodable byte of a file name or of
#: the environment, as Python reads them).
_UNSAFE = re.compile(f"[\t\n{CONTROL_CHARS}\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    if "\udc80" <= c <= "\udcff":  # surrogateescape's stand-in for the byte it could not decode
        return f"\\x{ord(c) - 0xDC00:02x}"
    return f"\\u{ord(c):04x}"  # also a valid JSON escape, so JSON text stays JSON


def visible(text: object) -> str:
    """``text`` safe to print as (part of) one line: every character that could start a
    line, move the cursor, act as a terminal escape or reorder what a reader sees is shown
    as an escape instead (``\\n``, ``\\t``, ``\\u001b``, ``\\u202e``; an undecodable byte as
    ``\\xNN``). Every text renderer prints ledger text through it, so a reason, a detail or
    a name can never forge a line of output or hide what follows it. Idempotent: a
    backslash is left as it is."""
    text = str(text)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def lines(rows: Iterable[object]) -> str:
    """Lines of output joined by newlines, each made ``visible``: a line is only ever the
    line its renderer meant, whatever text it holds."""
    return "\n".join(visible(r) for r in rows)


def iso_ms(text: str | None) -> str | None:
    """An ``iso`` time cut to milliseconds, for tables: '...:03.123456Z' -> '...:03.123Z'."""
    if not text or "." not in text:
        return text
    head, frac = text.rstrip("Z").split(".", 1)
    return f"{head}.{frac[:3]}Z"


def one_line(text: object, limit: int = 72) -> str:
    """``text`` on one line (runs of whitespace become one space, the rest ``visible``), cut
    to ``limit`` with '…'."""
    text = visible(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cells(row: Iterable[Any]) -> list[str]:
    """A table row as strings: None prints as '-', each cell ``visible`` (one line)."""
    return ["-" if c is None else visible(c) for c in row]


def table_lines(rows: Iterable[Sequence[str]], widths: Sequence[int]) -> list[str]:
    """Rows of strings padded to ``widths``, two spaces apart; the last column is not padded."""
    return ["  ".join(c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)).rstrip()
            for row in rows]


def table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """An aligned table with a header line, each column as wide as its widest cell."""
    body = [cells(row) for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    return "\n".join(table_lines([headers, *body], widths))  # cells are visible already


# --- events and packets --------------------------------------------------------------------


def summarize(event: Any) -> str:
    """One line on what an event says, for timelines: what it records, then its ``attrs``."""
    from handoff.ledger import events as ev

    return _said(event) + attrs_text(ev.attrs_of(event))


_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+-]+")


def attrs_text(attrs: dict[str, Any]) -> str:
    """A record's attributes as a compact suffix: `` {model=x, tokens=12}``, empty when none.
    Text that is not one plain word is shown JSON-quoted, so a value holding ``, `` or
    ``}`` cannot pass for another attribute; booleans print as true/false, as given."""
    if not attrs:
        return ""
    shown = []
    for k, v in attrs.items():
        if isinstance(v, bool):
            text = "true" if v else "false"
        elif isinstance(v, str):
            text = v if _PLAIN.fullmatch(v) and v not in ("true", "false") else json.dumps(v, ensure_ascii=False)
        else:
            text = repr(v)
        shown.append(f"{k}={text}")
    return " {" + ", ".join(shown) + "}"


def _said(event: Any) -> str:
    from handoff.ledger import events as ev

    e = event
    match e:
        case ev.HandoffOpened():
            return f"contract: {e.goal!r} for {e.owner} -> {e.target}" + (" (review required)" if e.require_review else "")
        case ev.LeaseGranted():
            return f"{e.worker} holds lease {e.lease}"
        case ev.LeaseReleased():
            return f"lease {e.lease} released" + (f": {e.reason}" if e.reason else "")
        case ev.LeaseRevoked():
            return f"lease {e.lease} revoked: {e.reason}"
        case ev.AuthorityTransferred():
            return f"{e.to} may {e.action}"
        case ev.HeartbeatRecorded():
            return "alive"
        case ev.StateChanged():
            return f"{e.from_state} -> {e.to_state}" + (f" ({e.reason})" if e.reason else "")
        case ev.ProgressRecorded():
            return f"{e.kind}" + (f": {e.detail}" if e.detail else "") + ("" if e.advances else " [not progress]")
        case ev.ArtifactRecorded():
            return (f"{e.kind} {e.path} ({e.bytes} B, sha256 {e.sha256[:12]})" if e.exists
                    else f"{e.kind} {e.path} (missing)")
        case ev.EvidenceRecorded():
            return f"{e.kind}: {e.outcome}" + (f" ({e.detail})" if e.detail else "")
        case ev.BlockerRaised():
            return f"#{e.blocker_id} {e.reason}; next: {e.next_action}"
        case ev.BlockerCleared():
            return f"#{e.blocker_id} cleared: {e.resolution}"
        case ev.SideEffectStarted():
            return f"{e.key}: {e.what}"
        case ev.SideEffectConfirmed():
            return f"{e.key}: {e.outcome}"
        case ev.ReconciliationRecorded():
            return f"{e.key}: {e.outcome}" + (f" ({e.note})" if e.note else "")
        case ev.ResultSubmitted():
            return (e.summary or "result") + f" ({len(e.artifacts)} artifact{'s' if len(e.artifacts) != 1 else ''})"
        case ev.ReviewDecided():
            return f"{'approved' if e.approved else 'rejected'} by {e.by}" + (f": {e.notes}" if e.notes else "")
        case ev.DeliveryAttempted():
            return f"{e.key} to {e.target} by {e.by}"
        case ev.DeliveryConfirmed():
            return f"{e.key} receipt {e.receipt}"
        case ev.DeliveryFailed():
            return f"{e.key}: {e.error}"
        case ev.RunClosed():
            return f"{e.disposition} by {e.by}" + (f": {e.reason}" if e.reason else "")
        case ev.WatchdogObserved():
            return f"{e.classification} at progress_seq {e.progress_seq}"
        case ev.RecoveryDecided():
            return f"{e.action} ({e.classification}): {e.reason}"
        case ev.RunForked():
            return f"continues {e.parent} as of seq {e.parent_seq}"
        case ev.SanitizationChecked():
            return _sanitization(e)
        case ev.RunReopened():
            return f"sent back to verifying by {e.by} (check at seq {e.check_seq} failed): {e.reason}"
        case ev.GraphCheckpointSaved():
            step = e.metadata.get("step")
            where = f"thread {e.thread_id}" + (f" ns {e.namespace}" if e.namespace else "")
            return (f"graph checkpoint {e.checkpoint_id} of {where}"
                    + (f", step {step}" if isinstance(step, int) else "") + f", {len(e.values)} values")
        case ev.GraphWritesSaved():
            return f"{len(e.writes)} writes of task {e.task_id} to checkpoint {e.checkpoint_id}"
        case ev.ValuesErased():
            what = "every saved checkpoint" if e.everything else f"{len(e.checkpoints)} checkpoints"
            return f"{e.reason}: {what} and {len(e.values)} values erased"
    return ev.tag_of(e)


def _sanitization(e: Any) -> str:
    """A check's verdict and, when it failed, which detectors fired where: the detector,
    part and line, never the matched text (a finding holds none)."""
    from handoff.reducers.sanitize import describe

    scanned = f"{len(e.items)} part{'s' if len(e.items) != 1 else ''}"
    if e.passed:
        return f"passed: {scanned} scanned, nothing found (sha256 {e.bundle_sha256[:12]})"
    fired = sorted({f.detector for f in e.findings})
    return (f"FAILED: {', '.join(fired) or 'a part could not be read'} fired in {scanned} scanned"
            + (f" ({describe(e.findings)})" if e.findings else ""))


def format_packet(p: dict[str, Any]) -> str:
    """A checkpoint packet (``Ledger.status``) as short aligned lines."""
    def iso(v: str | None) -> str:
        return v or "-"

    lp = p.get("last_progress")
    h = p["health"]
    mon = p["monitored"]
    d = p["delivery"]
    rows = [
        ("run", p["run_id"] + (f"  (fork of {p['fork_parent']} at seq {p['fork_seq']})" if p.get("fork_parent") else "")),
        ("state", p["state"] + ("  (terminal)" if p["terminal"] else "")),
        ("goal", one_line(p["goal"], 100)),
        ("origin", p["origin"] or "-"),
        ("target", p["target"]),
        ("owner", p["owner"] + ("  (review required)" if p.get("require_review") else "")),
        ("worker", f"{p['worker']} (lease {p['lease']})" if p["lease"] is not None else "none (no lease held)"),
        ("progress", f"seq {p['progress_seq']}" + (f", last {lp['kind']} at {lp['at']}" if lp else ", none yet")),
        ("heartbeat", iso(p["last_heartbeat_at"])),
        ("health", f"{h['classification']}: {h['reason']}" + (f" (action: {h['action']})" if h["action"] != "none" else "")),
        ("monitored", ("yes, by " + ", ".join(mon["watchers"])) if mon["covered"] else
         "no live watcher covers it" + (f" (last observed by {mon['last_observed_by']} at {mon['last_observed_at']})"
                                        if mon.get("last_observed_by") else "")),
        ("delivery", f"{d['status']}: {d['detail']}"),
    ]
    if p.get("result_path"):
        rows.insert(5, ("result", p["result_path"]))
    if p.get("review"):
        r = p["review"]
        rows.append(("review", f"{'approved' if r['approved'] else 'rejected'} by {r['by']}" + (f": {r['notes']}" if r["notes"] else "")))
    if p.get("result"):
        rows.append(("submitted", one_line(p["result"]["summary"] or "(no summary)", 100) + f" (seq {p['result']['seq']})"))
    rows.append(("last seq", f"{p['last_seq']}, updated {iso(p.get('updated_at'))}"))
    width = max(len(k) for k, _ in rows)
    out = [f"{k.ljust(width)}  {v}" for k, v in rows]
    for title, items, fmt in (
        ("blockers", p["blockers"], lambda b: [f"#{b['id']}", b["reason"], "next: " + b["next_action"], f"seq {b['seq']}"]),
        ("artifacts", p["artifacts"], lambda a: [a["kind"], a["path"], f"{a['bytes']} B" if a["exists"] else "MISSING",
                                                  f"sha256 {a['sha256'][:12]}" if a["sha256"] else "", f"seq {a['seq']}"]),
        ("evidence", p["evidence"], lambda e: [e["kind"], e["outcome"], one_line(e["detail"], 60) or "-", f"seq {e['seq']}"]),
        ("pending effects", p["pending_effects"], lambda e: [e["key"], one_line(e["what"], 60), f"lease {e['lease']}", f"seq {e['seq']}"]),
    ):
        if items:
            out.append(f"{title}:")
            body = table([""] * len(fmt(items[0])), [fmt(i) for i in items]).split("\n")[1:]
            out.extend("  " + b for b in body)
        else:
            out.append(f"{title.ljust(width)}  none")
    return lines(out)


# --- the timeline --------------------------------------------------------------------------

LOG_HEADERS = ["SEQ", "TIME", "ACTOR", "LEASE", "TYPE", "SUMMARY"]


def log_row(rec: Any) -> dict[str, Any]:
    """One stored event (a ``Recorded``) as a row of 'handoff log' (its --json shape): a
    row names its run, so rows of one run read the same as rows across runs."""
    import msgspec

    event = rec.event
    return {
        "run_id": rec.run_id, "seq": rec.seq, "position": rec.position, "at": iso(rec.recorded_us), "actor": rec.actor,
        "lease": rec.lease, "type": rec.type, "key": rec.idempotency_key, "summary": summarize(event),
        "data": msgspec.to_builtins(event),
    }


def ledger_row(rec: Any) -> dict[str, Any]:
    """A row of 'handoff log' without RUN: ``log_row``, which names its run."""
    return log_row(rec)


#: The columns of 'handoff log' without RUN: every stream, in position order.
LEDGER_LOG_HEADERS = ["POSITION", "TIME", "RUN", "SEQ", "ACTOR", "LEASE", "TYPE", "SUMMARY"]


def ledger_log_cells(row: dict[str, Any], width: int = 60) -> list[Any]:
    """A ``log_row`` as the cells of ``LEDGER_LOG_HEADERS``."""
    return [row["position"], iso_ms(row["at"]), row["run_id"], row["seq"], row["actor"], row["lease"], row["type"],
            one_line(row["summary"], width)]


def log_rows(records: Iterable[Any]) -> list[dict[str, Any]]:
    return [log_row(rec) for rec in records]


def log_cells(row: dict[str, Any], width: int = 72) -> list[Any]:
    """A ``log_row`` as the cells of a timeline table (``LOG_HEADERS``)."""
    return [row["seq"], iso_ms(row["at"]), row["actor"], row["lease"], row["type"], one_line(row["summary"], width)]


def format_log(rows: Iterable[dict[str, Any]], *, width: int = 72) -> str:
    """``log_row``s as a timeline table."""
    return table(LOG_HEADERS, [log_cells(r, width) for r in rows])


# --- the --json documents of the CLI (docs/cli.md) ------------------------------------------


def write_doc(out: Any) -> dict[str, Any]:
    """What a write (an ``Outcome``) did, and where the run stands after it."""
    r, cp = out.result, out.checkpoint
    return {
        "run_id": r.run_id, "outcome": r.outcome, "first_seq": r.first_seq, "last_seq": r.last_seq,
        "state": cp.state, "worker": cp.worker, "lease": cp.lease, "progress_seq": cp.progress_seq,
    }


def beat_doc(cp: Any) -> dict[str, Any]:
    """After a heartbeat: the run's last beat as it now stands (kept beside the log or logged)."""
    return {"last_heartbeat_at": iso(cp.watch.last_heartbeat_us)}


def delivery_doc(cp: Any) -> dict[str, Any]:
    """The target and the delivery's stage (reducers.delivery.stage: no clock involved)."""
    d = cp.delivery
    return {"target": cp.target, "delivery": {"status": dl.stage(d, ready=cp.delivery_ready), "key": d.latest_key,
                                              "receipt": d.receipt, "attempts": len(d.attempts)}}


#: The keys of ``run_row`` and ``stall_row``, in order: the CSV columns of the listings.
RUN_ROW_KEYS = ("run_id", "state", "owner", "target", "worker", "lease", "progress_seq", "health", "action",
                "updated_at", "goal")
STALL_ROW_KEYS = ("run_id", "state", "classification", "action", "reason", "worker", "lease", "last_heartbeat_at",
                  "progress_seq", "last_progress", "retries", "retry_budget")


def run_row(cp: Any, health: Any) -> dict[str, Any]:
    """A run in a listing ('handoff status' without RUN); ``health`` is stall.classify's."""
    return {
        "run_id": cp.run_id, "state": cp.state, "owner": cp.owner, "target": cp.target,
        "worker": cp.worker, "lease": cp.lease, "progress_seq": cp.progress_seq,
        "health": health.classification, "action": health.action,
        "updated_at": iso(cp.last_event_us), "goal": cp.goal,
    }


def stall_row(cp: Any, h: Any) -> dict[str, Any]:
    """A run that needs attention, with the evidence ('handoff stalls')."""
    w = cp.watch
    return {
        "run_id": cp.run_id, "state": cp.state, "classification": h.classification, "action": h.action,
        "reason": h.reason, "worker": cp.worker, "lease": cp.lease,
        "last_heartbeat_at": iso(w.last_heartbeat_us), "progress_seq": w.progress_seq,
        "last_progress": None if w.last_progress is None else {
            "seq": w.last_progress.seq, "kind": w.last_progress.kind, "at": iso(w.last_progress.at_us)},
        "retries": w.repeats, "retry_budget": cp.policy.retry_budget,
    }


def action_doc(a: Any) -> dict[str, Any]:
    """One watchdog action (``handoff.watchdog.Action``)."""
    return {"run_id": a.run_id, "classification": a.classification, "action": a.action, "outcome": a.outcome,
            "key": a.key, "progress_seq": a.progress_seq, "lease": a.lease, "reason": a.reason, "seq": a.seq}


def _shown(value: Any, limit: int = 60) -> str:
    """A value of a diff on one line; a missing one (None) as '-', as tables print it."""
    return "-" if value is None else one_line(value, limit)


def format_diff(doc: dict[str, Any]) -> str:
    """``Ledger.diff``'s document as short lines: the first divergence, then what differs."""
    a, b = doc["run_a"], doc["run_b"]
    head = (f"a = {a}, b = {b}: {doc['compared']['a']} and {doc['compared']['b']} events compared "
            f"(heartbeats left out: {doc['heartbeats']['a']} and {doc['heartbeats']['b']})")
    first = doc["first_divergence"]
    if first is None:
        return lines([head, "the same: every step matches"])
    out = [head, f"the same for {doc['common_steps']} step(s); first divergence at step {first['step']}: {first['what']}"]
    for side in ("a", "b"):
        w = first[side]
        out.append(f"  {side}: " + ("(no more events)" if w is None else
                                   f"{w['run_id']} seq {w['seq']} {w['type']} at {iso_ms(w['at'])}"))
    for d in first["differs"]:
        out.append(f"  {d['field']}: a {_shown(d['a'])} | b {_shown(d['b'])}")
    af = doc["after"]
    out.append("after it:")
    for key in ("state", "progress_seq"):
        v = af[key]
        out.append(f"  {key}: a {_shown(v['a'])}, b {_shown(v['b'])}" + ("" if v["a"] != v["b"] else " (same)"))
    arts = af["artifacts"]
    out.append(f"  artifacts: {len(arts['same'])} the same by sha256; changed: {', '.join(arts['changed']) or 'none'}; "
              f"only in a: {', '.join(arts['only_a']) or 'none'}; only in b: {', '.join(arts['only_b']) or 'none'}")
    ev_diff = af["evidence"]
    out.append("  evidence: " + (", ".join(f"{k} a {_shown(v['a'])} b {_shown(v['b'])}" for k, v in ev_diff.items())
                                 or "the same"))
    da, db = af["delivery"]["a"], af["delivery"]["b"]
    out.append(f"  delivery: a {da['status']}" + (f" ({da['receipt']})" if da["receipt"] else "")
              + f", b {db['status']}" + (f" ({db['receipt']})" if db["receipt"] else ""))
    for side in ("a", "b"):
        counts = af["events_after"][side]
        out.append(f"  events after it in {side}: " + (", ".join(f"{n} {t}" for t, n in counts.items()) or "none"))
    return lines(out)
