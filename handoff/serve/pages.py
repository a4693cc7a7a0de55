"""The web view's pages as HTML text: pure functions of what the ledger returned.

Every string from the ledger passes through ``e`` (``html.escape``, quotes included) into a
text node or a quoted attribute, so a goal, a reason or a worker name holding markup is
shown as text. Liveness (the last heartbeat and its age, the worker and its lease) and
progress (the last step that counted, its kind and age, ``progress_seq``) are separate
columns: a run can be alive and not progressing, which is what the fleet page is for.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from handoff.reducers.checkpoint import iso
from handoff.render import iso_ms

from . import actions as act


def e(text: object) -> str:
    return html.escape("-" if text is None else str(text), quote=True)


def age(now_us: int, us: int | None) -> str:
    """How long ago, in words a person scans: 4s, 3m 20s, 2h 5m, 3d 4h."""
    if us is None:
        return "-"
    s = max(0, (now_us - us) // 1_000_000)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def run_url(run_id: str) -> str:
    return "/runs/" + quote(run_id, safe="")


def page(title: str, body: str, *, here: str, who: str, refresh_s: float | None = None) -> str:
    nav = "".join(f'<a href="{href}"{" class=here" if key == here else ""}>{label}</a>'
                  for key, href, label in (("fleet", "/", "Fleet"), ("attention", "/attention", "Needs attention")))
    meta = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">' + meta
            + f"<title>{e(title)} - handoff</title><link rel=\"stylesheet\" href=\"/static/serve.css\"></head><body>"
            + f'<header class="top"><strong>handoff</strong>{nav}<span class="who">{e(who)}</span></header>'
            + body + '<script src="/static/serve.js"></script></body></html>\n')


# --- the fleet ---------------------------------------------------------------------------

FLEET_COLUMNS = (
    ("run", "run"), ("state", "state"), ("health", "health"), ("beat", "last beat"), ("worker", "worker"),
    ("progress", "last progress"), ("pseq", "progress_seq"), ("owner", "owner"), ("blockers", "blockers"),
    ("delivery", "delivery"), ("goal", "goal"),
)


def fleet_row(cp: Any, health: Any, now_us: int) -> dict[str, Any]:
    """A run's cells: liveness and progress apart."""
    w = cp.watch
    lp = w.last_progress
    from handoff.reducers import delivery as dl

    dstatus = (dl.status(cp.delivery, ready=cp.delivery_ready, now_us=now_us,
                         timeout_s=cp.policy.delivery_timeout_s)[0]
               if cp.delivery.attempts or cp.state in ("ready_for_review", "succeeded", "delivered") else "-")
    return {
        "run": cp.run_id, "state": cp.state, "health": health.classification, "reason": health.reason,
        "beat": age(now_us, w.last_heartbeat_us) if cp.lease is not None else "-",
        "beat_at": iso(w.last_heartbeat_us),
        "worker": "-" if cp.worker is None else f"{cp.worker} (lease {cp.lease})",
        "progress": "-" if lp is None else f"{lp.kind}, {age(now_us, lp.at_us)} ago",
        "progress_at": None if lp is None else iso(lp.at_us), "pseq": w.progress_seq, "owner": cp.owner,
        "blockers": len(cp.blockers), "delivery": dstatus, "goal": cp.goal,
    }


def _cells(r: dict[str, Any]) -> str:
    out = [f'<td><a href="{e(run_url(r["run"]))}">{e(r["run"])}</a></td>', f'<td>{e(r["state"])}</td>',
           f'<td class="h-{e(r["health"])}" title="{e(r["reason"])}">{e(r["health"])}</td>',
           f'<td title="{e(r["beat_at"])}">{e(r["beat"])}</td>', f'<td>{e(r["worker"])}</td>',
           f'<td title="{e(r["progress_at"])}">{e(r["progress"])}</td>', f'<td>{e(r["pseq"])}</td>',
           f'<td>{e(r["owner"])}</td>', f'<td>{e(r["blockers"])}</td>', f'<td>{e(r["delivery"])}</td>',
           f'<td class="goal">{e(r["goal"])}</td>']
    return "".join(out)


def fleet_table(rows: Sequence[dict[str, Any]], params: dict[str, str], sortable: Iterable[str]) -> str:
    """The fleet's rows; the headings of the ``sortable`` columns link to the whole
    listing in their order (from its first page: a cursor belongs to one order)."""
    head = []
    sortable = set(sortable)
    for key, label in FLEET_COLUMNS:
        if key in sortable:
            q = urlencode({**{k: v for k, v in params.items() if k not in ("sort", "after", "at")}, "sort": key})
            here = ' class="sorted"' if params.get("sort") == key else ""
            head.append(f'<th{here}><a href="?{e(q)}" data-sort="{e(key)}">{e(label)}</a></th>')
        else:
            head.append(f"<th>{e(label)}</th>")
    body = "".join(f'<tr data-run="{e(r["run"])}">{_cells(r)}</tr>' for r in rows)
    return f'<table id="fleet"><thead><tr>{"".join(head)}</tr></thead><tbody>{body}</tbody></table>'


def counts_list(counts: dict[str, int], total: int, note: str) -> str:
    items = [f'<li>runs not ended: <strong data-count="total">{total}</strong></li>']
    for name, n in counts.items():
        items.append(f'<li class="h-{e(name)}"><a href="/?{e(urlencode({"health": name}))}">{e(name)}</a>: '
                     f'<strong data-count="{e(name)}">{n}</strong></li>')
    return f'<ul class="counts" id="counts">{"".join(items)}</ul><p class="note">{e(note)}</p>'


def filters_form(params: dict[str, str], states: Iterable[str], healths: Iterable[str]) -> str:
    def select(name: str, values: Iterable[str]) -> str:
        opts = ['<option value="">any</option>'] + [
            f'<option value="{e(v)}"{" selected" if params.get(name) == v else ""}>{e(v)}</option>' for v in values]
        return f'<label>{e(name)}<select name="{e(name)}">{"".join(opts)}</select></label>'

    def text(name: str, label: str) -> str:
        return f'<label>{e(label)}<input name="{e(name)}" value="{e(params.get(name, ""))}" size="12"></label>'

    keep = (f'<input type="hidden" name="sort" value="{e(params["sort"])}">' if params.get("sort") else "")
    return ('<form class="filters" method="get" action="/">' + keep + select("state", states)
            + select("health", healths)
            + text("owner", "owner") + text("worker", "worker") + text("queue", "queue (target)")
            + text("q", "text in the goal") + '<button type="submit">Filter</button> <a href="/">clear</a></form>')


def pager(params: dict[str, str], nxt: dict[str, str] | None, more: int | None) -> str:
    """Links to the first page and the next (``nxt``: the parameters that continue the
    listing), with how many runs follow when they were counted."""
    parts = []
    base = {k: v for k, v in params.items() if k not in ("after", "at")}
    if params.get("after"):
        parts.append(f'<a href="?{e(urlencode(base))}">first page</a>')
    if nxt is not None:
        q = urlencode({**base, **nxt})
        label = f"next page ({more} more)" if more is not None else "next page"
        parts.append(f'<a id="next" href="?{e(q)}">{e(label)}</a>')
    return f'<div class="pager">{"".join(parts)}</div>'


def search_note(searched: int, capped: bool, left: int | None, filled: bool, cap: int, continued: bool) -> str:
    """How far a page's search (text in the goal, health judged run by run) read, so an
    empty or short page never passes for "nothing matches"."""
    if capped:
        rest = (f"{left:,} more that the other filters select are not searched yet"
                if left is not None else "the runs after it are not searched yet")
        text = (f"Searched {searched:,} runs for this page, the most a page reads ({cap:,}); {rest}: "
                "the next page searches on from there.")
    elif filled:
        text = f"Searched {searched:,} runs to fill this page; the next page searches on."
    else:
        text = (f"Searched every run the other filters select{' after the previous pages' if continued else ''} "
                f"({searched:,} on this page).")
    return f'<p class="note" id="searched" data-searched="{searched}" data-capped="{int(capped)}">{e(text)}</p>'


# --- needs attention ----------------------------------------------------------------------


def attention_table(rows: Sequence[dict[str, Any]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("run", "why", "what is needed", "state", "last beat", "worker",
                                              "last progress", "owner", "goal"))
    body = "".join(
        f'<tr data-run="{e(r["run"])}" data-why="{e(r["why"])}"><td><a href="{e(run_url(r["run"]))}">{e(r["run"])}</a>'
        f'</td><td class="h-{e(r["health"])}">{e(r["why"])}</td><td>{e(r["needed"])}</td><td>{e(r["state"])}</td>'
        f'<td>{e(r["beat"])}</td><td>{e(r["worker"])}</td><td>{e(r["progress"])}</td><td>{e(r["owner"])}</td>'
        f'<td class="goal">{e(r["goal"])}</td></tr>'
        for r in rows)
    return f'<table id="attention"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# --- a run --------------------------------------------------------------------------------


def fact_rows(p: dict[str, Any], cp: Any, now_us: int) -> list[tuple[str, str, object]]:
    """The packet's answers as (label, key, value), liveness and progress apart, and where
    a next worker resumes: what the run page shows and its live feed updates."""
    w = cp.watch
    lp = w.last_progress
    h = p["health"]
    pending = ", ".join(f"{x['key']} ({x['what']})" for x in p["pending_effects"]) or "none"
    blockers = "; ".join(f"#{b['id']} {b['reason']} (next: {b['next_action']})" for b in p["blockers"]) or "none"
    resume = (f"{cp.state} after progress_seq {w.progress_seq}"
              + (f" ({lp.kind} at seq {lp.event_seq})" if lp is not None else "")
              + f"; side effects awaiting an outcome: {pending}; next: {h['reason']}")
    return [
        ("state", "state", p["state"]), ("health", "health", h["classification"]), ("why", "reason", h["reason"]),
        ("liveness: last heartbeat", "beat", (f"{age(now_us, w.last_heartbeat_us)} ago ({iso_ms(p['last_heartbeat_at'])})"
                                              if cp.lease is not None else "no lease held")),
        ("worker", "worker", "-" if cp.worker is None else f"{cp.worker} (lease {cp.lease})"),
        ("progress: last step", "progress", "-" if lp is None else f"{lp.kind}, {age(now_us, lp.at_us)} ago (seq {lp.event_seq})"),
        ("progress_seq", "progress_seq", w.progress_seq),
        ("blockers", "blockers", blockers), ("delivery", "delivery", f"{p['delivery']['status']}: {p['delivery']['detail']}"),
        ("resume point", "resume", resume), ("owner, target", "owner", f"{p['owner']} -> {p['target']}"),
        ("last seq", "last_seq", p["last_seq"]),
    ]


def facts(p: dict[str, Any], cp: Any, now_us: int) -> str:
    cls = {"health": f' class="h-{e(p["health"]["classification"])}"'}
    return '<dl class="facts" id="facts">' + "".join(
        f'<dt>{e(label)}</dt><dd data-fact="{key}"{cls.get(key, "")}>{e(value)}</dd>'
        for label, key, value in fact_rows(p, cp, now_us)) + "</dl>"


def status_doc(p: dict[str, Any], cp: Any, now_us: int) -> dict[str, str]:
    """The facts the live page updates without a reload (as text)."""
    return {key: str(value) for _, key, value in fact_rows(p, cp, now_us)}


def events_table(rows: Sequence[dict[str, Any]]) -> str:
    body = "".join(
        f'<tr id="seq-{r["seq"]}"><td><a href="#seq-{r["seq"]}">{r["seq"]}</a></td><td>{e(r["at"])}</td>'
        f'<td>{e(r["actor"])}</td><td class="type">{e(r["type"])}</td><td>{e(r["summary"])}</td></tr>'
        for r in rows)
    head = "".join(f"<th>{h}</th>" for h in ("seq", "time (UTC)", "actor", "type", "what"))
    return f'<table id="events"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def action_forms(run_id: str, cp: Any, offered: Sequence[act.Action]) -> str:
    """One form per action: it asks for the row's fields and leads to a confirmation."""
    forms = []
    for a in offered:
        inputs = []
        for f in a.fields:
            label = e(f.name.replace("_", " "))
            if f.fixed:
                value = cp.lease if f.name == "lease_number" else ""
                inputs.append(f'<input type="hidden" name="{e(f.name)}" value="{e(value)}">'
                              f'<span class="note">{label}: {e(value)}</span>')
            elif f.kind == "choice":
                opts = "".join(f'<option value="{e(c)}">{e(c)}</option>' for c in f.choices)
                inputs.append(f'<label>{label} <select name="{e(f.name)}">{opts}</select></label>')
            else:
                inputs.append(f'<label>{label} <input name="{e(f.name)}" size="24"></label>')
        forms.append(f'<form method="get" action="{e(run_url(run_id))}/confirm/{e(a.id)}" data-action="{e(a.id)}">'
                     f'<legend>{e(a.label)}</legend>{"".join(inputs)}<button type="submit">{e(a.label)}...</button></form>')
    if not forms:
        return ""
    return '<h2>Actions</h2><div class="actions" id="actions">' + "".join(forms) + "</div>"


def confirm_body(run_id: str, a: act.Action, args: dict[str, Any], who: str, csrf: str) -> str:
    listed = "".join(f"<dt>{e(k.replace('_', ' '))}</dt><dd>{e(v)}</dd>" for k, v in args.items())
    hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in args.items()
                     if k in {f.name for f in a.fields})
    return (f'<main><h1>{e(a.label)}: run {e(run_id)}?</h1><p>This appends the ordinary '
            f'<code>{e(a.row.command)}</code> event to the run\'s log, recorded as <strong>{e(who)}</strong>; '
            'the ledger checks it as it checks the same command from the CLI.</p>'
            f'<dl class="facts">{listed}</dl>'
            f'<form method="post" action="{e(run_url(run_id))}/do/{e(a.id)}" id="confirm">{hidden}'
            f'<input type="hidden" name="csrf" value="{e(csrf)}"><button type="submit">Confirm: {e(a.label)}</button> '
            f'<a href="{e(run_url(run_id))}">cancel</a></form></main>')
