"""The trace export keeps no key and no lease secret, wherever a worker wrote one: keys are
matched as values, not as words (``key:K``, ``idem_K``, ``X-K``, ``Kx``), a lease token
wherever it stands (``tok_1.<secret>``), and a lease token's secret on its own
(``token=<secret>``, found by its digest). A ``file://`` delivery names its file by a
digest of the key, so the receipt (and the trace's ``handoff.receipt``) holds no key.
And ``handoff otel --endpoint`` with a malformed URL is input (exit 2), nothing written.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from handoff.facade import Ledger
from handoff.delivery.adapters import file_name
from handoff.reducers import trace as tr
from tests.support import Handoff
from tests.delivery.conftest import outbox, ready_run

IDEM = "idem-7f3a9c2e1b44"        # an idempotency key (long: matched anywhere)
EFFECT = "fx-deploy-4711abcd"     # a side effect's key


def _text(trace: tr.Trace) -> str:
    return json.dumps([[s.name, s.status_message, s.attributes, [[e.name, e.attributes] for e in s.events]]
                       for s in trace.spans])


def _story(lg: Ledger, run: str) -> tuple[str, str]:
    """A worker that wrote its keys and its lease token into details in every spelling
    the old scrub missed; its token and the token's secret."""
    tok = lg.claim(run, "w1")
    secret = tok.secret
    lg.transition(run, tok, "planning")
    lg.progress(run, tok, "plan_committed", "the plan", key=IDEM)
    lg.transition(run, tok, "executing")
    lg.effect_start(run, tok, EFFECT, f"deploy under X-{EFFECT}")
    lg.effect_confirm(run, EFFECT, "done", lease=tok)
    lg.progress(run, tok, "note", f"retried key:{IDEM}, idem_{IDEM}, X-{IDEM}, {IDEM}x; "
                                  f"token={secret} tok_{tok} lease={tok}")
    return tok, secret


def test_keys_and_lease_secrets_are_matched_as_values(backend):
    with Ledger(backend.address()) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", run_id="scrub-1")
        tok, secret = _story(lg, run)
        text = _text(tr.build(lg.store.history(run), run))
    for needle in (IDEM, EFFECT, secret, str(tok)):
        assert needle not in text, needle
    assert text.count(tr.REDACTED_KEY) == 5 and text.count(tr.REDACTED_TOKEN) == 3
    assert f"X-{tr.REDACTED_KEY}" in text and f"idem_{tr.REDACTED_KEY}" in text and f"key:{tr.REDACTED_KEY}" in text
    assert f"token={tr.REDACTED_TOKEN}" in text and f"tok_{tr.REDACTED_TOKEN}" in text


def test_a_secret_glued_to_word_characters_is_found_by_its_digest():
    """The secret inside a longer run of base64 characters (``idem_<secret>``, ``X<secret>``)."""
    from handoff.ledger.store import lease_digest, new_lease_secret

    secret, digest = new_lease_secret()
    for text in (f"idem_{secret}", f"X{secret}", f"{secret}_tail", f"a-{'b' * 300}-{secret}-c", f"k={secret}"):
        assert secret not in str(tr._clean(text, None, frozenset({digest}))), text
    other = "A" * 43
    assert tr._clean(f"token={other}", None, frozenset({lease_digest(secret)})) == f"token={other}"


def test_a_short_key_is_matched_where_no_letter_or_digit_touches_it():
    span = tr.Span("1" * 16, None, "s", 0, 0, {"a": "key:v1 idem_v1 X-v1 /v1/ and v10 xv1 nv1y"}, [])
    tr.scrub(span, {"v1"})
    assert span.attributes["a"] == "key:[key] idem_[key] X-[key] /[key]/ and v10 xv1 nv1y"


def test_a_file_delivery_is_named_by_a_digest_of_its_key(backend, tmp_path):
    box = outbox(tmp_path)
    key = "inc-4711-report"
    with Ledger(backend.address()) as lg:
        run = ready_run(lg, tmp_path, f"file://{box}")
        sent = lg.deliver(run, key, send=True, by="alice")
        assert sent.status == "confirmed" and key not in sent.receipt
        digest = hashlib.sha256(f"{run}\0{key}".encode()).hexdigest()[:32]
        assert [p.name for p in box.iterdir()] == [f"{run}.{digest}.json"] == [file_name(run, key)]
        assert digest in sent.receipt
        # A repeat under the same key finds its file and sends nothing new.
        again = lg.deliver(run, key, send=True, by="alice")
        assert again.status == "confirmed" and len(list(box.iterdir())) == 1
        receipts = [r.event.receipt for r in lg.log(run) if r.type == "delivery_confirmed"]
        assert receipts and all(key not in r for r in receipts)
        text = _text(tr.build(lg.store.history(run), run))
    assert key not in text


def test_file_names_stay_distinct_for_every_run_and_key():
    names = {file_name(r, k) for r in ("r", "r.x", "r_x", "a/b") for k in ("x", "r.x", "../../etc/passwd", "x\u00e9")}
    assert len(names) == 16
    assert all("/" not in n and not n.startswith(".") and len(n) < 200 for n in names)
    assert all("passwd" not in n for n in names)


@pytest.mark.parametrize("endpoint", ["http://[::1", "http://[::1]:99999", "http://", "https://host:port/"])
def test_a_malformed_collector_address_is_input(tmp_path, endpoint):
    pytest.importorskip("opentelemetry")
    h = Handoff(str(tmp_path / "l.db"))
    run = h("open", "--goal", "g", "--target", "chat:#x", "--owner", "alice").stdout.strip()
    before = h.json("log", run)
    r = h("otel", run, "--endpoint", endpoint, "--json", code=2)
    err = json.loads(r.stderr or r.stdout)["error"]
    assert err["type"] == "InvalidInput" and "collector's address" in err["message"]
    assert h.json("log", run) == before
