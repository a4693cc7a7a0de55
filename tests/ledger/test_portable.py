"""Export and import: hash-checked, all or nothing, idempotent, forks bring their parents."""

import pytest

from handoff import Ledger
from handoff.ledger.errors import InvalidInput


@pytest.fixture
def source(tmp_path):
    lg = Ledger(str(tmp_path / "src.db"))
    lg.open(goal="Draft", target="chat:#ops", owner="alice", run_id="r1")
    lease = lg.claim("r1", "w1")
    lg.transition("r1", lease, "planning", key="t1")
    lg.progress("r1", lease, "plan_committed", "v1")
    lg.token = lease  # for tests that write under the lease after the trip
    lg.fork("r1", 3, new_run_id="r1.child")
    lg.open(goal="Other", target="chat:#x", owner="bob", run_id="r2")
    yield lg
    lg.close()


def _log(lg):
    return [(r.run_id, r.seq, r.hash, r.recorded_us, r.actor, r.payload) for r in lg.store.read_all()]


def test_round_trip_keeps_every_envelope_and_hash(source, tmp_path):
    lines = list(source.export())
    with Ledger(str(tmp_path / "dst.db")) as dst:
        assert dst.import_lines(lines) == {"imported": 6, "skipped": 0, "runs": 3}
        assert sorted(_log(dst)) == sorted(_log(source))
        assert dst.verify() == [] and dst.check() == []
        assert dst.status("r1.child")["fork_parent"] == "r1"


def test_importing_twice_changes_nothing(source, tmp_path):
    lines = list(source.export())
    with Ledger(str(tmp_path / "dst.db")) as dst:
        dst.import_lines(lines)
        before = _log(dst)
        assert dst.import_lines(lines) == {"imported": 0, "skipped": 6, "runs": 3}
        assert _log(dst) == before


def test_a_child_exports_its_parents_history(source):
    runs = {line.split(b'"run_id":"')[1].split(b'"')[0] for line in source.export(["r1.child"])}
    assert runs == {b"r1", b"r1.child"}


def test_idempotency_keys_survive_the_trip(source, tmp_path):
    with Ledger(str(tmp_path / "dst.db")) as dst:
        dst.import_lines(list(source.export(["r1"])))
        again = dst.transition("r1", source.token, "planning", key="t1")
        assert again.duplicate
        # The lease's digest came along: its token still proves it in the new ledger.
        assert not dst.heartbeat("r1", source.token).duplicate


@pytest.mark.parametrize(
    "tamper",
    [
        lambda ls: [ls[0].replace(b'"goal":"Draft"', b'"goal":"Drift"')] + ls[1:],  # edited payload
        lambda ls: ls[:1] + ls[2:],  # a deleted line
        lambda ls: [ls[1], ls[0]] + ls[2:],  # reordered
        lambda ls: ls[:2] + [b"{not json"] + ls[2:],  # garbage
        lambda ls: [ls[0].replace(b'"actor":"owner:alice"', b'"actor":"owner:mallory"')] + ls[1:],
    ],
    ids=["edited", "deleted", "reordered", "garbage", "re-attributed"],
)
def test_tampered_input_is_refused_and_nothing_is_written(source, tmp_path, tamper):
    lines = tamper(list(source.export()))
    with Ledger(str(tmp_path / "dst.db")) as dst:
        with pytest.raises(InvalidInput, match="line"):
            dst.import_lines(lines)
        assert _log(dst) == []


def test_a_diverging_run_is_refused(source, tmp_path):
    with Ledger(str(tmp_path / "dst.db")) as dst:
        dst.open(goal="Draft", target="chat:#ops", owner="alice", run_id="r1")
        before = _log(dst)
        with pytest.raises(InvalidInput, match="different event"):
            dst.import_lines(list(source.export(["r1"])))
        assert _log(dst) == before
