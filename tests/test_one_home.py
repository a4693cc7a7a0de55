"""One home for each fact, and a library that never reaches up into its shell.

Each test pins a finding of issue 11: it fails if the second copy, or the import of
``cli`` from the library, comes back.
"""

from __future__ import annotations

import ast
import re
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import msgspec

from handoff import render
from handoff.ledger import events as ev
from handoff.ledger.store import Recorded
from handoff.projections import view_rows
from handoff.reducers import checkpoint, delivery

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("ledger", "reducers", "projections", "handoff")


def library_sources() -> list[Path]:
    return [p for pkg in LIBRARY for p in sorted((ROOT / pkg).rglob("*.py"))]


# --- the library never imports the shell ----------------------------------------------------


def _installed_name(path: Path) -> str:
    """ledger/sqlite.py -> handoff.ledger.sqlite: the name the module is imported by."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "handoff" else ["handoff", *parts])


def _imported_names(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (``from a import b``: a and a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _imported_names_of(source: str) -> set[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    try:
        return _imported_names(Path(f.name))
    finally:
        os.unlink(f.name)


def _names_cli(names: set[str]) -> bool:
    return any(n in ("cli", "handoff.cli") or n.startswith(("cli.", "handoff.cli.")) for n in names)


def test_no_library_module_names_cli():
    offenders = [str(p.relative_to(ROOT)) for p in library_sources()
                 if not p.is_symlink() and _names_cli(_imported_names(p))]
    assert offenders == [], f"the library imports the shell (cli.py) in {offenders}"
    assert _names_cli(_imported_names_of("from handoff import cli\n")) and _names_cli(
        _imported_names_of("import handoff.cli as c\n"))  # the check sees both forms


def test_the_demo_and_the_renderers_run_without_cli(tmp_path):
    """Import every library module and render a real run's packet and timeline the way the
    demo's finale does; cli must never have been loaded."""
    modules = sorted({_installed_name(p) for p in library_sources() if not p.is_symlink()})
    code = f"""
import importlib, sys
for name in {modules!r}:
    importlib.import_module(name)
from handoff import Ledger, render
with Ledger({str(tmp_path / "l.db")!r}) as lg:
    lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
    lg.claim("r1", "w1")
    print(render.format_packet(lg.status("r1")))
    print(render.format_log(render.log_rows(lg.log("r1"))))
assert "handoff.cli" not in sys.modules and "cli" not in sys.modules, "the library imported cli"
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "lease_granted" in done.stdout


def _recorded(seq: int, us: int, event: ev.Event) -> Recorded:
    return Recorded(run_id="r1", seq=seq, position=seq, type=ev.tag_of(event), actor="owner:alice", lease=None,
                    idempotency_key=None, recorded_us=us, schema_version=ev.SCHEMA_VERSION,
                    payload=ev.encode(event), prev_hash=b"", hash=b"")


# --- time formatting: one formatter ------------------------------------------------------------


def test_the_packet_and_the_log_print_one_instant_alike(tmp_path):
    """Before: packets used their own formatter, which dropped the fraction of a whole
    second ('...:00Z' where the log said '...:00.000000Z') and turned the last µs of year
    9999 into 'us-since-1970'."""
    for us in (1_777_636_800_000_000, 253_402_300_799_999_999, -62_135_596_800_000_000, 1_777_636_800_123_456):
        rec = _recorded(1, us, ev.HeartbeatRecorded())
        at = render.log_row(rec)["at"]
        assert at == checkpoint.iso(us)
        assert at.endswith("Z") and "." in at and len(at.rsplit(".", 1)[1]) == 7, at


def test_no_second_iso_formatter():
    """Only reducers/checkpoint.py turns µs into ISO text; the rest call its ``iso``."""
    offenders = []
    for path in [*library_sources(), ROOT / "cli.py"]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("reducers/checkpoint.py",):
            continue
        text = path.read_text()
        if ".isoformat(" in text or "+00:00" in text:
            offenders.append(rel)
    assert offenders == []


# --- delivery status: one rule -----------------------------------------------------------------

_KEYS = st.sampled_from(["k1", "k2", "k3"])
_STEPS = st.lists(st.tuples(st.sampled_from(["attempt", "confirm", "fail"]), _KEYS), max_size=8)


def _delivery(steps: list[tuple[str, str]]) -> delivery.Delivery:
    d = delivery.initial()
    for i, (what, key) in enumerate(steps, 1):
        event: ev.Event = (ev.DeliveryAttempted(key=key, target="chat:#ops", by="alice") if what == "attempt" else
                           ev.DeliveryConfirmed(key=key, receipt="r") if what == "confirm" else
                           ev.DeliveryFailed(key=key, error="e"))
        rec = _recorded(i, i * 1_000_000, event)
        d = delivery.evolve(d, rec, event)
    return d


@settings(max_examples=200, deadline=None)
@given(steps=_STEPS, later_s=st.integers(0, 2000))
def test_every_reader_of_delivery_status_agrees(steps, later_s):
    """The packet (with a clock), the deliveries view and the CLI's write documents (without
    one) all give reducers.delivery's answer. Before, the CLI had its own rule, with a value
    ('not_attempted') no other place knew."""
    d = _delivery(steps)
    cp = msgspec.structs.replace(checkpoint.initial("r1"), delivery=d)
    stage = delivery.stage(d, ready=cp.delivery_ready)
    assert stage in delivery.STAGES and stage != "ambiguous"
    assert view_rows.delivery_row(cp)["status"] == stage
    assert render.delivery_doc(cp)["delivery"]["status"] == stage
    now = (len(steps) + later_s) * 1_000_000
    judged, _ = delivery.status(d, ready=cp.delivery_ready, now_us=now, timeout_s=600.0)
    assert judged == stage or (stage, judged) == ("attempted", "ambiguous")
    assert checkpoint.packet(cp, now_us=now)["delivery"]["status"] == judged
    assert render.delivery_doc(cp)["delivery"]["key"] == view_rows.delivery_row(cp)["key"] == d.latest_key


def test_no_module_outside_reducers_delivery_decides_a_delivery_status():
    """The words of the rule ('confirmed' if ... 'attempted' if ...) appear in one module."""
    offenders = []
    for path in [*library_sources(), ROOT / "cli.py"]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("reducers/delivery.py",):
            continue
        text = path.read_text()
        if "not_attempted" in text or ('"confirmed" if' in text) or ('status = "attempted"' in text):
            offenders.append(rel)
    assert offenders == []


def test_delivery_status_values_are_the_documented_ones():
    doc = (ROOT / "docs" / "cli.md").read_text()
    listed = ", ".join(f"`{s}`" for s in delivery.STAGES)
    assert f"`delivery.status` is one of {listed}" in doc.replace("\n", " ")
    assert os.path.exists(ROOT / "reducers" / "delivery.py")


# --- policy defaults: ledger.events.Policy ---------------------------------------------------

_POLICY_NAME = re.compile(r"(heartbeat|progress|delivery)[-_]timeout|retry[-_]budget|owner[-_]cap")
_LITERAL_DEFAULT = re.compile(r"(default=|Field\(|[:\w]\s=\s)(60\.0|300\.0|600\.0|3|10)\b")


def test_policy_defaults_are_written_once():
    """Before: the contract model, Ledger.open's signature and the CLI's options each wrote
    60.0 / 300.0 / 3 / 600.0 / 10 again beside ledger.events.Policy."""
    offenders = []
    for path in [*library_sources(), ROOT / "cli.py"]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("ledger/events.py",):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _POLICY_NAME.search(line) and _LITERAL_DEFAULT.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def test_every_entry_point_opens_with_the_stored_defaults():
    import inspect

    from handoff import cli
    from handoff import Ledger, contract

    stored = msgspec.structs.asdict(ev.Policy())
    assert contract.Policy().model_dump() == stored
    sig = inspect.signature(Ledger.open)
    assert {k: sig.parameters[k].default for k in stored} == stored
    options = {p.name: p.default for p in cli.main.commands["open"].params}
    assert {k: options[k.removesuffix("_s")] for k in stored} == stored


# --- exit codes: the error classes ------------------------------------------------------------


def _documented_exit_codes() -> dict[str, int]:
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Exit codes"):].split("\n\n", 2)[1]
    out = {}
    for row in table.splitlines()[2:]:
        code, _meaning, types = (c.strip() for c in row.strip("|").split(" | "))
        for name in re.findall(r"`(\w+)`", types):
            out[name] = int(code)
    return out


def test_every_error_type_is_documented_with_its_exit_code():
    """docs/cli.md's table lists each LedgerError subclass under its own exit_code. Before,
    the table, cli.py's constants and the classes were three separate copies."""
    from handoff.ledger import errors

    documented = _documented_exit_codes()
    types = [t for t in vars(errors).values()
             if isinstance(t, type) and issubclass(t, errors.LedgerError) and t is not errors.LedgerError]
    assert types
    assert {t.__name__: int(t.exit_code) for t in types} == documented


def test_cli_writes_no_exit_code_of_its_own():
    text = (ROOT / "cli.py").read_text()
    assert not re.search(r"\bexit\((?:[1-4])\)|EXIT_(?:REFUSED|USAGE|STORE|PROBLEMS)\b", text)


# --- terminal states: reducers/transitions.py ---------------------------------------------------


def test_no_hard_coded_terminal_state_list_outside_transitions():
    """A line naming two or more terminal states as strings is a second copy of
    transitions.TERMINAL / CLOSE_DISPOSITIONS (cli.py had two: close's choices and --all's
    help; decide.py one). The stored types' Literals are checked against the table below."""
    from handoff.reducers import transitions as T

    names = "|".join(sorted(T.TERMINAL | {d.replace("_", "-") for d in T.TERMINAL}))
    quoted = re.compile(rf"[\"'`]({names})[\"'`]")
    offenders = []
    for path in [*library_sources(), ROOT / "cli.py"]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("reducers/transitions.py",):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if len(set(quoted.findall(line))) >= 2 and "Literal[" not in line:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def test_the_stored_close_dispositions_are_the_table_s():
    import typing

    from handoff.reducers import commands as C
    from handoff.reducers import transitions as T

    for struct in (ev.RunClosed, C.Close):
        hint = typing.get_type_hints(struct)["disposition"]
        assert set(typing.get_args(hint)) == set(T.CLOSE_DISPOSITIONS), struct
    assert T.TERMINAL == {T.DELIVERED, *T.CLOSE_DISPOSITIONS}
