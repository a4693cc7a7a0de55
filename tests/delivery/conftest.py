"""Fixtures of the delivery tests: a run ready to deliver, and a real receiver."""

from __future__ import annotations


import pytest

from handoff.facade import Ledger

from .server import Receiver


@pytest.fixture
def receiver():
    rx = Receiver()
    yield rx
    rx.close()


def ready_run(lg: Ledger, tmp_path, target: str, *, content: str = "# Report\n\nAll checks passed.\n",
              summary: str = "the report is done", public: bool = False, owner: str = "alice", **open_kw) -> str:
    """Open, claim, record one artifact, submit, pass evidence: a run ready to deliver."""
    n = len(list(tmp_path.glob("work*")))
    path = tmp_path / ("work" if n == 0 else f"work{n}") / "report.md"  # one directory per run
    path.parent.mkdir()
    path.write_text(content)
    run = lg.open(goal="write the report", target=target, owner=owner, public=public, **open_kw)
    tok = lg.claim(run, "w1")
    lg.transition(run, tok, "planning")
    lg.transition(run, tok, "executing")
    lg.artifact(run, tok, str(path))
    lg.transition(run, tok, "verifying")
    lg.evidence(run, "tests", "pass", lease=tok)
    lg.submit(run, tok, summary)
    return run


def log_types(lg: Ledger, run: str) -> list[str]:
    return [r.type for r in lg.log(run)]


def outbox(tmp_path):
    d = tmp_path / "outbox"
    d.mkdir(exist_ok=True)
    return d


