# incident_report.py: reconstruct an incident: a report, the ledger across runs, a diff.
from handoff import Ledger, report

with Ledger("handoff.db") as lg:
    run = lg.open(run_id="inc-1", goal="Summarise INC-1", target="chat:#ops", owner="alice")
    lease = lg.claim(run, "agent-1")
    lg.transition(run, lease, "planning", worker="agent-1")
    lg.progress(run, lease, "plan_committed", "two sections", worker="agent-1")
    lg.revoke(run, "the agent's host is drained", by="ops")
    retry = lg.fork(run, 3, new_run_id="inc-1.retry", by="alice")

    tl = lg.report(run)  # the fold behind the report: lanes, answers, packets
    for answer in tl.answers:
        print(answer.question, "->", answer.answer, "proof: seq", list(answer.proof))
    page = report.html_report(tl)  # one self-contained HTML document (or markdown_report)
    assert "default-src 'none'" in page  # its content policy: the page fetches nothing
    print(lg.write_report(run, "inc-1.html")["bytes"], "bytes written to inc-1.html")

    for rec in lg.events(types=("lease_revoked", "run_forked")):  # every run, by position
        print(rec.position, rec.run_id, rec.seq, rec.type)
    doc = lg.diff(run, retry)
    print("the runs part at step", doc["first_divergence"]["step"], ":", doc["first_divergence"]["what"])
