"""The ASGI app: the fleet, needs-attention and run pages, the live feed, the actions.

Reads go through ``Ledger``'s listings a page at a time (``runs_page``, ``iter_stalls``,
``status``, ``log``, ``report``), so a page costs what its hundred rows cost, not what the
ledger holds. Writes exist only when the server was started as an operator, and each is
the row's ``Ledger`` method (handoff/serve/actions.py) after a confirmation page and a
CSRF token check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import itertools
import json
import re
import secrets
import threading
import time
from typing import Any
from urllib.parse import quote

from handoff.ledger.errors import LedgerError, StoreUnavailable
from handoff.reducers import stall
from handoff.reducers.transitions import STATES

from . import actions as act
from . import pages as pg
from .feed import DROPPED, MAX_FOLLOWERS, QUEUE, Feed, FeedFull, event_row
from .flash import Signer
from .listing import PAGE, SCAN_CAP, SORT_LABELS, SORTS
from .listing import counts as health_counts
from .listing import fleet as fleet_listing
from .static import CSS, JS

#: Events the run page lists when it opens (newest first); older ones are in the report.
RECENT = 200
#: Longest a send to a live feed's browser may take before the connection is closed (a
#: tab that stopped reading frees its slot; its queue is bounded meanwhile, see feed.py).
SEND_TIMEOUT_S = 30.0

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src data:; connect-src 'self'; "
       "frame-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'self'")


@dataclasses.dataclass
class Config:
    """How the server was started: the ledger's address, who acts and whether it may write
    (``operator``), how often the fleet pages reload (seconds); ``clock`` is the ledger's
    (UTC µs; default the system clock), the moment liveness and progress are judged at;
    ``max_feeds``: live feeds served at once; ``feed_queue``: batches one feed may have
    waiting before it is dropped (handoff/serve/feed.py)."""

    db: str
    name: str
    operator: bool = False
    refresh_s: float = 5.0
    busy_timeout_s: float = 5.0
    clock: Any = None
    max_feeds: int = MAX_FOLLOWERS
    feed_queue: int = QUEUE


class Server:
    """The state the endpoints share: the request ledger, the feed, the CSRF secret, the
    flash signer, and the fleet's health counts of the last refresh period."""

    def __init__(self, config: Config) -> None:
        from handoff.facade import Ledger

        self.config = config
        self.ledger = Ledger(config.db, create=False, busy_timeout_s=config.busy_timeout_s, clock=config.clock)
        self.lock = threading.Lock()  # one request at a time on the request ledger's connection
        self.feed = Feed(self.ledger, max_followers=config.max_feeds, queue=config.feed_queue)
        self.csrf = secrets.token_urlsafe(32)
        self.flash = Signer()
        self._counts: tuple[float, Any] | None = None
        #: The last reports drawn, by (run, last seq): fifty pages following a busy run
        #: reload the report together, and share one drawing of each version.
        self.reports: dict[tuple[str, int], str] = {}
        self.who = (f"operator {config.name}: actions on" if config.operator
                    else f"read-only as {config.name} (start with --as operator for actions)")

    def read(self, fn: Any, *args: Any, **kw: Any) -> Any:
        with self.lock:
            return fn(self.ledger, *args, **kw)

    def counts(self, lg: Any) -> tuple[dict[str, int], int, str, int]:
        """The fleet's health counts and the moment they were judged, kept for one refresh
        period: every open fleet page reloads once a period, so however many are open the
        stall index is scanned at most once a period under the request lock, and a count is
        never more than one period old. Called holding the lock."""
        t = time.monotonic()
        if self._counts is not None and t - self._counts[0] < self.config.refresh_s:
            return self._counts[1]
        now = lg.clock()
        value = (*health_counts(lg, now), now)
        self._counts = (t, value)
        return value


def _params(request: Any, names: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k in names if (v := request.query_params.get(k, "").strip())}


# --- what each page reads ------------------------------------------------------------------


def _needed(cp: Any, h: Any) -> tuple[str, str]:
    """Why a run is listed under needs attention, and what a person does about it."""
    if cp.state == "blocked":
        b = cp.blockers[-1] if cp.blockers else None
        why = "paused by the watchdog" if b and b.reason.startswith("paused by watchdog") else "blocked on its owner"
        return why, (f"{b.reason} (next: {b.next_action})" if b else "unblock it")
    if cp.state == "ready_for_review":
        return "result awaiting review", "approve or reject the result"
    labels = {"stalled": "stalled: alive, not progressing", "unavailable": "worker silent or dead",
              "needs_reconciliation": "side effects need reconciliation", "delivery_ambiguous": "delivery ambiguous",
              "needs_worker": "needs a worker", "unclaimed": "no worker holds it", "unopened": "no contract"}
    return labels.get(h.classification, h.classification), h.reason


def attention_rows(lg: Any, now: int, after: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Needs attention: the stall index's verdicts, then blocked runs, then results awaiting
    review (state columns), a page of each; returns the rows and the cursors to go on."""
    rows: list[dict[str, Any]] = []
    nexts: dict[str, str] = {}

    def add(cp: Any, h: Any) -> None:
        why, needed = _needed(cp, h)
        r = pg.fleet_row(cp, h, now)
        rows.append({**r, "why": why, "needed": needed})

    page = lg.stalls_page(limit=PAGE, now=now, after=after.get("s"))
    for cp, h in page.items:
        add(cp, h)
    if page.next:
        nexts["s"] = page.next
    for key, state in (("b", "blocked"), ("r", "ready_for_review")):
        pg_ = lg.runs_page(limit=PAGE, after=after.get(key), states=(state,))
        for cp in pg_.items:
            add(cp, stall.classify(cp, now_us=now))
        if pg_.next:
            nexts[key] = pg_.next
    return rows, nexts


def report_document(lg: Any, run_id: str) -> str:
    """The incident report of ``handoff report`` (handoff.report, the same renderer), with
    each record's idempotency key and lease-token digest left out: the page shows no secret."""
    import msgspec

    from handoff import report

    tl = lg.report(run_id)
    records = [{**r, "key": None, "data": {k: v for k, v in r["data"].items() if k != "token_digest"}}
               if isinstance(r.get("data"), dict) else {**r, "key": None} for r in tl.records]
    return report.html_report(msgspec.structs.replace(tl, records=records))


_META_CSP = re.compile(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)"')


# --- the app -------------------------------------------------------------------------------


def make_app(config: Config) -> Any:
    """The Starlette app (without the address guard: ``serve`` wraps it)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Route
    from starlette.concurrency import run_in_threadpool

    server = Server(config)

    def html(text: str, status: int = 200) -> Any:
        return HTMLResponse(text, status_code=status, headers=_headers(CSP))

    def refused(message: str, status: int) -> Any:
        return html(pg.page("Refused", f"<main><h1>Refused</h1><p class=\"flash refused\">{pg.e(message)}</p></main>",
                            here="", who=server.who), status)

    async def render(work: Any) -> Any:
        """A page drawn on the ledger's thread, or the refusal of what the request asked:
        404 for a run that does not exist, 503 while the store cannot be reached (try
        again), 400 for any other input the ledger refused."""
        try:
            return html(await call(work))
        except StoreUnavailable as exc:
            return refused(exc.message, 503)
        except LedgerError as exc:
            return refused(exc.message, 404 if exc.type == "UnknownRun" else 400)

    async def call(fn: Any, *a: Any, **kw: Any) -> Any:
        return await run_in_threadpool(server.read, fn, *a, **kw)

    async def fleet(request: Any) -> Any:
        p = _params(request, ("state", "health", "owner", "worker", "queue", "q", "after", "at", "sort"))
        if p.get("state") and p["state"] not in STATES:
            return refused(f"no state {p['state'][:40]!r}; it is one of: {', '.join(STATES)}", 400)
        if p.get("health") and p["health"] not in stall.CLASSIFICATIONS:
            return refused(f"no health {p['health'][:40]!r}; it is one of: {', '.join(sorted(stall.CLASSIFICATIONS))}", 400)

        def work(lg: Any) -> str:
            c, total, note, counted = server.counts(lg)
            now = lg.clock()
            page = fleet_listing(lg, p, now)
            rows = page.rows
            searching = page.searched is not None
            empty = "No run matches." if not searching or not (page.capped or page.next) else \
                "No run matches among the runs this page searched."
            sort = p.get("sort") or "opened"
            body = ("<main><h1>Fleet</h1>" + pg.counts_list(c, total, note)
                    + f'<p class="note" id="counted">Counted at {pg.e(pg.iso_ms(pg.iso(counted)))}; the counts are '
                      f"kept for {config.refresh_s:g}s (the refresh period), the rows below are read afresh.</p>"
                    + pg.filters_form(p, STATES, sorted(stall.CLASSIFICATIONS))
                    + (pg.search_note(page.searched, page.capped, page.left, page.next is not None, SCAN_CAP,
                                      bool(p.get("after"))) if searching else "")
                    + (pg.fleet_table(rows, p, SORTS) if rows else f'<p id="empty">{empty}</p>')
                    + pg.pager(p, page.next, page.more)
                    + f'<p class="note">Liveness (last beat, worker) and progress (last step, progress_seq) are '
                      f"judged at {pg.e(pg.iso_ms(pg.iso(now)))}; the page reloads every {config.refresh_s:g}s. "
                      f'<span id="sorted" data-sort="{pg.e(sort)}">Sorted by {pg.e(SORT_LABELS[sort])}, across '
                      "every page</span>" + ("" if sort == "opened" else ' (<a href="/">the order runs were '
                                                                          "opened</a>)") + ". Text in the goal "
                      f"and health are judged run by run: a page reads at most {SCAN_CAP:,} runs and says how far "
                      "it read.</p></main>")
            return pg.page("Fleet", body, here="fleet", who=server.who, refresh_s=config.refresh_s)

        return await render(work)

    async def attention(request: Any) -> Any:
        after = _params(request, ("s", "b", "r"))

        def work(lg: Any) -> str:
            now = lg.clock()
            rows, nexts = attention_rows(lg, now, after)
            more = "".join(f'<a href="/attention?{pg.e(k)}={pg.e(quote(v))}">more {pg.e(label)}</a> '
                           for k, v in nexts.items()
                           for label in ({"s": "verdicts", "b": "blocked runs", "r": "results to review"}[k],))
            body = ("<main><h1>Needs attention</h1><p class=\"note\">What a person must act on: runs alive but "
                    "not progressing, silent or dead workers, side effects to reconcile, ambiguous deliveries "
                    "(the watchdog's verdicts at this moment), runs blocked on their owner or paused by the "
                    f"watchdog, results awaiting review. Reloads every {config.refresh_s:g}s.</p>"
                    + (pg.attention_table(rows) if rows else '<p id="empty">Nothing needs attention.</p>')
                    + f'<div class="pager">{more}</div></main>')
            return pg.page("Needs attention", body, here="attention", who=server.who, refresh_s=config.refresh_s)

        return await render(work)

    async def run_page(request: Any) -> Any:
        run_id = request.path_params["run_id"]
        said = server.flash.read(run_id, request.query_params.get("flash", ""))

        def work(lg: Any) -> str:
            now = lg.clock()
            p = lg.status(run_id, now=now)
            cp = lg.checkpoint(run_id)
            recent = list(lg.log(run_id, after_seq=max(0, cp.last_seq - RECENT)))
            rows = [event_row(r) for r in reversed(recent)]
            note = ""
            if said is not None:  # only what this server signed for this run (flash.py)
                kind, text = said
                note = f'<p class="flash {"ok" if kind == "done" else "refused"}" id="flash">{pg.e(text)}</p>'
            forms = pg.action_forms(run_id, cp, act.offered(cp)) if config.operator else ""
            url = pg.run_url(run_id)
            body = (f'<main data-run="{pg.e(run_id)}" data-last-seq="{cp.last_seq}" data-feed="{pg.e(url)}/feed">'
                    f'<h1>Run <span id="run-id">{pg.e(run_id)}</span> <span id="live" class="live">connecting</span></h1>'
                    f'<p id="goal">{pg.e(p["goal"])}</p>{note}' + pg.facts(p, cp, now) + forms
                    + "<h2>Latest events</h2>" + pg.events_table(rows)
                    + (f'<p class="note">The {RECENT} latest are listed; the report below has them all.</p>'
                       if cp.last_seq > RECENT else "")
                    + f'<h2>Incident report</h2><iframe class="report" src="{pg.e(url)}/report" '
                      f'title="incident report of {pg.e(run_id)}"></iframe></main>')
            return pg.page(f"Run {run_id}", body, here="", who=server.who)

        return await render(work)

    async def run_report(request: Any) -> Any:
        run_id = request.path_params["run_id"]
        def drawn(lg: Any) -> str:
            head = lg.store.head(run_id)
            key = (run_id, 0 if head is None else head.last_seq)
            doc = server.reports.get(key)
            if doc is None:
                doc = report_document(lg, run_id)
                if len(server.reports) >= 8:
                    server.reports.pop(next(iter(server.reports)))
                server.reports[key] = doc
            return doc

        try:
            doc = await call(drawn)
        except LedgerError as exc:
            return refused(exc.message, 404 if exc.type == "UnknownRun" else 400)
        m = _META_CSP.search(doc)
        policy = (m.group(1) if m else "default-src 'none'") + "; frame-ancestors 'self'"
        return HTMLResponse(doc, headers=_headers(policy))

    async def run_feed(request: Any) -> Any:
        from sse_starlette.sse import EventSourceResponse

        run_id = request.path_params["run_id"]
        raw = request.headers.get("last-event-id") or request.query_params.get("after", "0")
        # ASCII digits only, and few: "²".isdigit() is true, and int() refuses 4,300 digits.
        after = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else 0
        try:
            await call(lambda lg: lg.checkpoint(run_id))
        except LedgerError as exc:
            return PlainTextResponse(exc.message, status_code=404 if exc.type == "UnknownRun" else 400)
        try:
            q = server.feed.follow(run_id)
        except FeedFull as exc:
            return PlainTextResponse(exc.message, status_code=503,
                                     headers={"Retry-After": str(max(1, int(config.refresh_s)))})

        def status(lg: Any) -> dict[str, str]:
            now = lg.clock()
            return pg.status_doc(lg.status(run_id, now=now), lg.checkpoint(run_id), now)

        async def stream() -> Any:
            nonlocal after
            try:
                missed = await call(lambda lg: [event_row(r) for r in itertools.islice(lg.log(run_id, after_seq=after), 1000)])
                if missed:
                    after = missed[-1]["seq"]
                    yield {"event": "events", "id": str(after), "data": json.dumps(missed)}
                yield {"event": "status", "data": json.dumps(await call(status))}
                while True:
                    try:
                        rows = await asyncio.wait_for(q.get(), timeout=config.refresh_s)
                    except asyncio.TimeoutError:
                        yield {"event": "status", "data": json.dumps(await call(status))}
                        continue
                    if rows is DROPPED:
                        yield {"event": "dropped", "data": json.dumps(
                            f"this page fell more than {server.feed.queue} batches of events behind the run and "
                            "stopped following it; reload the page to catch up (the log has every event)")}
                        return
                    rows = [r for r in rows if r["seq"] > after]
                    if rows:
                        after = rows[-1]["seq"]
                        yield {"event": "events", "id": str(after), "data": json.dumps(rows)}
                        yield {"event": "status", "data": json.dumps(await call(status))}
            finally:
                server.feed.unfollow(run_id, q)

        return EventSourceResponse(stream(), ping=15, send_timeout=SEND_TIMEOUT_S,
                                   headers={"Cache-Control": "no-store"})

    def _action(request: Any) -> act.Action | None:
        return act.BY_ID.get(request.path_params["action"])

    def acting(request: Any) -> tuple[str, act.Action | None, Any]:
        """The run and the action a request names, or the refusal to answer it with: a
        read-only server acts on nothing, and an action must be one of the table's."""
        run_id, a = request.path_params["run_id"], _action(request)
        if not config.operator:
            return run_id, a, refused("this server is read-only; start it with 'handoff serve --as operator' "
                                      "to act", 403)
        return run_id, a, (refused("no such action", 404) if a is None else None)

    async def confirm(request: Any) -> Any:
        run_id, a, refusal = acting(request)
        if refusal is not None or a is None:
            return refusal
        try:
            args = act.arguments(a, dict(request.query_params))
            await call(lambda lg: lg.checkpoint(run_id))
        except LedgerError as exc:
            return refused(exc.message, 400)
        return html(pg.page(f"Confirm: {a.label}", pg.confirm_body(run_id, a, args, f"operator {config.name}",
                                                                   server.csrf), here="", who=server.who))

    async def do(request: Any) -> Any:
        run_id, a, refusal = acting(request)
        if refusal is not None or a is None:
            return refusal
        form = {k: str(v) for k, v in (await request.form()).items()}
        if not hmac.compare_digest(form.get("csrf", "").encode(), server.csrf.encode()):
            return refused("the form's CSRF token is missing or not this server's; open the run page again and "
                           "confirm from there", 403)
        url = pg.run_url(run_id)
        try:
            out = await call(act.perform, a, run_id, config.name, form)
        except LedgerError as exc:
            flash = server.flash.sign(run_id, "refused", f"{exc.type}: {exc.message}")
            return RedirectResponse(f"{url}?flash={flash}", status_code=303)
        said = f"{a.label}: recorded at seq {out.result.last_seq} as {config.name}"
        if out.duplicate:
            said = f"{a.label}: nothing new to record"
        flash = server.flash.sign(run_id, "done", said)
        return RedirectResponse(f"{url}?flash={flash}#seq-{out.result.last_seq}", status_code=303)

    async def css(request: Any) -> Any:
        return Response(CSS, media_type="text/css", headers=_headers(CSP))

    async def js(request: Any) -> Any:
        return Response(JS, media_type="text/javascript", headers=_headers(CSP))

    async def startup() -> None:
        server.feed.start(asyncio.get_running_loop())

    async def shutdown() -> None:
        server.feed.stop()
        server.ledger.close()

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        await startup()
        try:
            yield
        finally:
            await shutdown()

    routes = [
        Route("/", fleet), Route("/attention", attention),
        Route("/runs/{run_id}", run_page), Route("/runs/{run_id}/report", run_report),
        Route("/runs/{run_id}/feed", run_feed),
        Route("/runs/{run_id}/confirm/{action}", confirm), Route("/runs/{run_id}/do/{action}", do, methods=["POST"]),
        Route("/static/serve.css", css), Route("/static/serve.js", js),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = server
    return app


def _headers(policy: str) -> dict[str, str]:
    return {"Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin", "Cache-Control": "no-store", "X-Frame-Options": "SAMEORIGIN"}
