"""Property tests of the pure rules: the gate, the delivery transitions and the detectors.

A RuleBasedStateMachine drives one public run through decide and the fold alone (no
store): results recorded and re-submitted, checks passed and failed over current and stale
bundles, attempts under a few keys, sends confirmed, failed and unanswered, by the right
and the wrong people. Whatever the order, the invariants hold, and at the end every event
of the history is admitted again by reducers.admit, as an import would be.
"""

from __future__ import annotations

import hashlib
import os
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from handoff.ledger import events as ev
from handoff.ledger.errors import LedgerError
from handoff.ledger.store import GENESIS_HASH, Actor, Recorded
from handoff.reducers import admit as admission
from handoff.reducers import commands as C
from handoff.reducers import sanitize as sz
from handoff.reducers.checkpoint import evolve, initial
from handoff.reducers.decide import Context, decide

RUN = "r1"
OWNER = Actor("owner", "alice")
WORKER = Actor("worker", "w1")
KEYS = ("k1", "k2", "k3")
RULES = sz.rules_digest(())


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class GateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[Recorded] = []
        self.envelopes: list[tuple[str, int | None]] = []
        self.cp = initial(RUN)
        self.version = 0
        self.now = 1_000_000
        self.step(C.Open(goal="g", target="https://hooks.example/x", owner="alice", public=True,
                         require_review=True), OWNER)
        self.step(C.Claim(worker="w1", token_digest="a" * 64), WORKER)
        for to in ("planning", "executing"):
            self.step(C.Transition(lease=1, to=to), WORKER)
        self.record_result()

    # --- driving ----------------------------------------------------------------------

    def step(self, cmd: C.Command, actor: Actor) -> list[ev.Event] | LedgerError:
        try:
            events = decide(self.cp, cmd, Context(actor=actor))
        except LedgerError as exc:
            return exc
        lease = getattr(cmd, "lease", None) if actor.kind == "worker" else None
        self.now += 1_000
        for e in events:
            rec = Recorded(RUN, len(self.log) + 1, len(self.log) + 1, ev.tag_of(e), f"{actor.kind}:{actor.name}",
                           lease, None, self.now, ev.SCHEMA_VERSION, ev.encode(e), GENESIS_HASH, GENESIS_HASH)
            self.log.append(rec)
            self.cp = evolve(self.cp, rec, e)
        return events

    def artifact_sha(self) -> str:
        return sha(f"content v{self.version}")

    def bundle(self) -> str:
        return sha(f"bundle of v{self.version}")

    def record_result(self) -> None:
        self.version += 1
        self.step(C.RecordArtifact(lease=1, path="/w/report.md", kind="result", bytes=10,
                                   sha256=self.artifact_sha(), exists=True), WORKER)
        self.step(C.Transition(lease=1, to="verifying"), WORKER)
        self.step(C.RecordEvidence(kind="tests", outcome="pass", lease=1), WORKER)
        self.step(C.Submit(lease=1, summary=f"v{self.version}"), WORKER)

    # --- rules ------------------------------------------------------------------------

    @rule(approve=st.booleans())
    def review(self, approve: bool) -> None:
        self.step(C.ReviewResult(approve=approve), OWNER)

    @precondition(lambda self: self.cp.state == "executing")
    @rule()
    def new_result(self) -> None:
        self.record_result()

    @rule(passed=st.booleans(), stale=st.booleans(), wrong_item=st.booleans(), who=st.sampled_from(["alice", "eve"]))
    def sanitize(self, passed: bool, stale: bool, wrong_item: bool, who: str) -> None:
        digest = sha("old bundle") if stale else self.bundle()
        item_sha = sha("something else") if wrong_item else self.artifact_sha()
        findings = () if passed else (ev.Finding("secret", "/w/report.md", 3),)
        cmd = C.Sanitize(passed=passed, bundle_sha256=digest, items=(ev.ScannedItem("/w/report.md", item_sha, 10),),
                         findings=findings, rules_sha256=RULES)
        self.step(cmd, Actor("owner", who))

    @rule(key=st.sampled_from(KEYS + ("ops@example.com",)), stale=st.booleans())
    def deliver(self, key: str, stale: bool) -> None:
        before = self.cp
        out = self.step(C.Deliver(key=key, bundle_sha256=sha("old bundle") if stale else self.bundle()), OWNER)
        if isinstance(out, list) and out:
            # Written only behind a passing check of exactly this content, after its last change.
            c = before.delivery.check
            assert c is not None and c.passed and c.seq >= before.delivery.changed_seq
            assert out[0].bundle_sha256 == c.bundle_sha256  # what is sent is what was scanned
            assert {(i.name, i.sha256) for i in c.items} >= {("/w/report.md", self.artifact_sha())}
            assert not sz.scan([("key", key)])

    @rule(key=st.sampled_from(KEYS), how=st.sampled_from(["confirm", "fail", "unanswered"]))
    def outcome(self, key: str, how: str) -> None:
        cmd = {"confirm": C.ConfirmDelivery(key=key, receipt="HTTP 200"),
               "fail": C.FailDelivery(key=key, error="HTTP 400"),
               "unanswered": C.RecordUnanswered(key=key, reason="timeout")}[how]
        self.step(cmd, OWNER)

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def at_most_one_confirmation(self) -> None:
        assert sum(r.type == "delivery_confirmed" for r in self.log) <= 1

    @invariant()
    def at_most_one_open_attempt(self) -> None:
        assert sum(a.open for a in self.cp.delivery.attempts) <= 1

    @invariant()
    def delivered_exactly_when_confirmed(self) -> None:
        assert (self.cp.state == "delivered") == (self.cp.delivery.confirmed_key is not None)

    def teardown(self) -> None:
        # An import decides every event again by the same rules: all of it is admitted.
        cp, pending = initial(RUN), None
        for rec in self.log:
            pending = admission.admit(cp, pending, seq=rec.seq, actor=rec.actor, lease=rec.lease,
                                      recorded_us=rec.recorded_us, event=rec.event)
            cp = evolve(cp, rec)
        assert pending is None and cp == self.cp


TestGateMachine = GateMachine.TestCase
TestGateMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# --- the detectors -------------------------------------------------------------------

PLANTED = {
    "secret": st.builds(lambda s: "AKIA" + s, st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=16, max_size=16))
    | st.builds(lambda s: "ghp_" + s, st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=36, max_size=40)),
    "home_dir": st.builds(lambda u: f"/home/{u}/notes", st.text("abcdefghij", min_size=1, max_size=8)),
    "private_address": st.builds(lambda a, b: f"192.168.{a}.{b}", st.integers(0, 255), st.integers(0, 255)),
    "email": st.builds(lambda u, d: f"{u}@{d}.com", st.text("abcxyz", min_size=1, max_size=6),
                       st.text("abcxyz", min_size=2, max_size=6)),
    "host_name": st.builds(lambda h: f"{h}.internal", st.text("abcdefgh", min_size=1, max_size=8)),
}
WORDS = st.lists(st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8), max_size=8).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), detector=st.sampled_from(sorted(PLANTED)), before=WORDS, after=WORDS)
def test_a_planted_value_is_always_found_where_it_is(data, detector, before, after):
    planted = data.draw(PLANTED[detector])
    text = f"line one\n{before} {planted} {after}\nline three"
    found = sz.scan([("artifact", text)])
    assert any(f.detector == detector and f.line == 2 for f in found), (planted, found)
    assert all(planted not in repr(f) for f in found)  # a finding never carries the text


@settings(max_examples=200, deadline=None)
@given(words=WORDS)
def test_plain_words_pass(words):
    assert sz.scan([("summary", words)]) == ()


def test_the_gate_is_silent_for_a_target_that_is_not_public():
    from handoff.reducers.delivery import Delivery

    sz.gate(Delivery(target="chat:#ops"), run_id="r", key="k", bundle_sha256="", artifacts=[])


def test_rules_digest_names_the_patterns():
    assert sz.rules_digest(()) != sz.rules_digest(("x",)) and re.fullmatch(r"[0-9a-f]{64}", RULES)


#: Plain regular expressions of what the anchored detectors find (slow: they try every
#: position). The fast detectors must find a match on every line these do.
REFERENCE = {
    "email": re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"),
    "host_name": re.compile(r"\b(?:[a-z0-9-]+\.)+(?:local|localdomain|internal|intranet|corp|lan|home\.arpa)\b",
                            re.I),
    "secret": re.compile(r"(?i:password|passwd|secret|api[_-]?key|token)[ \t\"'`\\]*(?::=?|=>?|>)\s*"
                         r"(?:\\?[\"'`][^\"'`\\\n]{4,}|[^\s\"'`\\<]{8,})"),
}
PIECES = st.sampled_from(["a", "b", "x1", "-", ".", "@", " ", "\t", ":", "=", "\n", "internal", "corp", "com", "org",
                          "token", "Password", "secret", "api_key", "abcdefghij", "'", '"', ">", "\\", "%", "_"])


@settings(max_examples=int(os.environ.get("HANDOFF_DETECTOR_EXAMPLES", "300")), deadline=None)
@given(st.lists(PIECES, max_size=30).map("".join))
def test_the_fast_detectors_miss_nothing_the_plain_expressions_find(text):
    found = {(f.detector, f.line) for f in sz.scan([("t", text)])}
    for name, rx in REFERENCE.items():
        for m in rx.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            assert (name, line) in found or any(
                (name, ln) in found for ln in range(line, text.count("\n", 0, m.end()) + 2)), (name, m.group())
