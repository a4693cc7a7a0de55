"""An incident in one run, with every lane of the report in it, on a clock moved by hand.

worker-a plans and starts a side effect, then goes silent; the watchdog finds it
unavailable and revokes its lease, leaving the side effect's outcome unknown; the owner
reconciles it; worker-b claims, keeps heart-beating without progress until the watchdog
marks the run stalled, raises and clears a blocker, then finishes: artifact, evidence,
result, review, one delivery with a receipt (retried once, which writes nothing).

Every beat carries the worker's token count so far (attrs), so the log records each one
and the heartbeat lane has them all: a beat that only says "alive" again would be kept
beside the log (docs/architecture.md, "Liveness beside the log").
"""

from __future__ import annotations

from pathlib import Path

from handoff import Ledger
from handoff.watchdog import watch_once
from tests.support import Clock

#: The goal holds markup: a report must show it as text, never run it.
GOAL = "Write the incident report for INC-4711 <script>document.title='pwned'</script>"


def incident(lg: Ledger, clock: Clock, tmp: Path, run: str = "inc-4711") -> str:
    result = tmp / f"{run}.md"
    lg.open(run_id=run, goal=GOAL, origin="pagerduty:INC-4711", target="chat:#ops", owner="alice",
            result_path=str(result), require_review=True, heartbeat_timeout_s=10, progress_timeout_s=30,
            retry_budget=5)
    a = lg.claim(run, "worker-a")
    clock.advance(1)
    lg.transition(run, a, "planning")
    lg.progress(run, a, "plan_committed", "summary, timeline, follow-ups")
    lg.transition(run, a, "executing")
    for i in range(3):
        clock.advance(3)
        lg.heartbeat(run, a, attrs={"tokens_out": 100 * (i + 1)})
    lg.progress(run, a, "tool_outcome", "section 1 of 3 drafted")
    lg.effect_start(run, a, "post-draft", "POST /drafts (the draft to the wiki)")
    clock.advance(15)  # worker-a goes silent
    watch_once(lg, name="ops", now_us=clock(), interval_s=5)
    lg.effect_confirm(run, "post-draft", "done", note="wiki shows draft 17", by="alice")
    clock.advance(2)
    b = lg.claim(run, "worker-b")
    if lg.checkpoint(run).state != "executing":
        lg.transition(run, b, "executing")
    lg.progress(run, b, "note", "resuming after section 1")
    for i in range(12):  # alive, busy, not advancing
        clock.advance(4)
        lg.heartbeat(run, b, attrs={"tokens_out": 50 * (i + 1)})
        lg.progress(run, b, "tool_retry", "vendor API answered 503")
        watch_once(lg, name="ops", now_us=clock(), interval_s=5)
    lg.block(run, "the vendor API is down", "ops restores the API", lease=b)
    clock.advance(5)
    lg.unblock(run, "the API is back", lease=b)
    lg.progress(run, b, "tool_outcome", "sections 2-3 drafted")
    lg.transition(run, b, "verifying")
    result.write_text("# INC-4711\n\n## Summary\nA cache node failed.\n\n## Timeline\n...\n\n## Follow-ups\n...\n")
    lg.artifact(run, b, str(result))
    lg.evidence(run, "structure", "pass", "3 of 3 sections", lease=b)
    lg.submit(run, b, "incident report written")
    clock.advance(10)
    lg.review(run, True, "timeline checks out", by="alice")
    lg.deliver(run, "inc-4711-report", by="alice")
    clock.advance(1)
    lg.delivered(run, "inc-4711-report", "chat:#ops message 1")
    assert lg.deliver(run, "inc-4711-report", by="alice").unchanged  # a retry writes nothing
    return run
