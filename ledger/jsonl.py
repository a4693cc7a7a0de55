"""Export and import of runs as JSON Lines: one event, with its whole envelope, per line.

Hashes travel with the events, so an imported run is verified link by link before any of
it is accepted, and a tampered line is refused with its line number.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated, Any

import msgspec

from . import events as ev
from .errors import InvalidInput, RedactedExportRefused
from .inputs import check_run_id
from .store import DEFAULT_MAX_PAYLOAD, GENESIS_HASH, Recorded, chain_hash


#: Every integer of a line fits SQLite's INTEGER (and the msgpack header the hash covers):
#: a larger one is refused as malformed input instead of overflowing on the way in.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Line(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    run_id: str
    seq: Int64
    type: str
    actor: str
    lease: Int64 | None
    idempotency_key: str | None
    recorded_us: Int64
    schema_version: Int64
    payload: msgspec.Raw
    prev_hash: str
    hash: str
    position: Int64 | None = None
    idempotency_digest: str | None = None
    batch_size: Int64 = 1


class ExportedEvent(_Line, frozen=True, forbid_unknown_fields=True):
    """The shape of one exported line (documented in docs/cli.md).

    ``db_role``: the database role that inserted the event, as the PostgreSQL server
    recorded it (absent from SQLite's exports, so those lines read as every earlier
    version wrote them). Shown, never imported: the importing session's role is the one
    that inserts the copy."""

    db_role: str | None = None


#: The most bytes a line holds besides its payload: the keys, three hashes, seven
#: integers, and the run id, actor, key and database role at their longest, each
#: character at its worst (4 UTF-8 bytes, or a 6-byte escape). That comes to about 2.5 KB
#: (tests/faults/test_import_limits.py builds the largest one); the rest is margin.
ENVELOPE_BYTES = 4096
#: How much of an input a reader asks for at once.
READ_CHUNK = 1 << 16


def line_limit(max_payload: int = DEFAULT_MAX_PAYLOAD) -> int:
    """The longest line an export of a store with ``max_payload`` can hold: anything longer
    cannot be an event that store accepts, so a reader refuses it without reading on."""
    return max_payload + ENVELOPE_BYTES


def _too_long(lineno: int, max_payload: int) -> InvalidInput:
    return InvalidInput(
        f"line {lineno} is longer than {line_limit(max_payload):,} bytes, the most one exported event "
        f"can take (a payload of at most {max_payload:,} bytes and its envelope); this is not an "
        "export ('handoff export' writes one event per line). Nothing was imported",
        field=f"line {lineno}", reason="line_too_long",
    )


def read_lines(source: Any, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Iterator[bytes]:
    """The lines of ``source`` (a file object, binary or text), read in chunks of
    ``READ_CHUNK``, each at most ``line_limit(max_payload)`` bytes without its newline.

    Never more than one line and one chunk are held, so an input with no newline (a
    stream of zeros, a device, a binary file) costs bounded memory and is refused as
    soon as its first line passes the limit; ``readline()`` would read it whole first."""
    limit = line_limit(max_payload)
    pending = bytearray()
    lineno = 0
    while chunk := source.read(READ_CHUNK):
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            lineno += 1
            if len(pending) + end - start > limit:
                raise _too_long(lineno, max_payload)
            if pending:
                pending += chunk[start:end]
                yield bytes(pending)
                pending.clear()
            else:
                yield chunk[start:end]
            start = end + 1
        pending += chunk[start:]
        if len(pending) > limit:
            raise _too_long(lineno + 1, max_payload)
    if pending:
        yield bytes(pending)


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(ExportedEvent)


def to_line(rec: Recorded, digest: bytes | None = None, batch_size: int = 1, db_role: str | None = None) -> bytes:
    fields = dict(
        run_id=rec.run_id, seq=rec.seq, type=rec.type, actor=rec.actor, lease=rec.lease,
        idempotency_key=rec.idempotency_key, recorded_us=rec.recorded_us,
        schema_version=rec.schema_version, payload=msgspec.Raw(rec.payload),
        prev_hash=rec.prev_hash.hex(), hash=rec.hash.hex(), position=rec.position,
        idempotency_digest=digest.hex() if digest else None, batch_size=batch_size,
    )
    if db_role is None:  # the line as every earlier version wrote it (and can read)
        return _enc.encode(_Line(**fields))
    return _enc.encode(ExportedEvent(**fields, db_role=db_role))


def _unhex(value: str, field: str, lineno: int) -> bytes:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise InvalidInput(f"line {lineno}: {field} is not hex", field=field) from None
    if len(raw) != 32:
        raise InvalidInput(f"line {lineno}: {field} must be 32 bytes of sha256", field=field)
    return raw


def parse_lines(lines: Any, max_payload: int = DEFAULT_MAX_PAYLOAD,
                ) -> Iterator[tuple[int, Recorded, bytes | None, int]]:
    """Decode and check each line: length, shape, run id, payload decodable, hash chain intact.

    ``lines``: a file object (read with ``read_lines``, in bounded chunks) or an iterable
    of lines. Raises InvalidInput naming the line for the first problem; yields (line
    number, Recorded) otherwise. Chains are checked per run in file order, so a file must
    hold each run's events in seq order (as ``export`` writes them).
    """
    last: dict[str, tuple[int, bytes]] = {}
    limit = line_limit(max_payload)
    source: Iterable[bytes | str] = read_lines(lines, max_payload) if hasattr(lines, "read") else lines
    for lineno, line in enumerate(source, 1):
        if isinstance(line, str):
            line = line.encode("utf-8", "surrogateescape")
        if len(line) > limit and len(line.rstrip(b"\r\n")) > limit:
            raise _too_long(lineno, max_payload)
        if not line.strip():
            continue
        try:
            e = _dec.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if _redacted(line):
                raise RedactedExportRefused(
                    f"line {lineno} is from a redacted export ('handoff export --redact'): a sanitized copy "
                    "for reading, whose payloads no longer match their hashes. It cannot be imported as a "
                    "ledger; import the original export instead", field=f"line {lineno}") from None
            raise InvalidInput(f"line {lineno} is not an exported event: {exc}", field=f"line {lineno}") from None
        except UnicodeDecodeError as exc:  # invalid UTF-8 inside a JSON string
            raise InvalidInput(f"line {lineno} is not valid UTF-8 (byte {exc.start})",
                               field=f"line {lineno}") from None
        except RecursionError:  # nesting deeper than the decoder can follow
            raise InvalidInput(f"line {lineno} is nested too deeply to be an exported event",
                               field=f"line {lineno}") from None
        check_run_id(e.run_id, f"line {lineno}: run_id")
        payload = bytes(e.payload)
        try:
            event = ev.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"line {lineno}: payload cannot be decoded: {exc}", field=f"line {lineno}") from None
        except RecursionError:
            raise InvalidInput(f"line {lineno}: payload is nested too deeply to be an event",
                               field=f"line {lineno}") from None
        if ev.tag_of(event) != e.type:
            raise InvalidInput(f"line {lineno}: type {e.type} does not match the payload", field=f"line {lineno}")
        prev = _unhex(e.prev_hash, "prev_hash", lineno)
        digest = _unhex(e.hash, "hash", lineno)
        want_seq, want_prev = last.get(e.run_id, (0, GENESIS_HASH))
        if e.seq != want_seq + 1 or prev != want_prev:
            raise InvalidInput(
                f"line {lineno}: run {e.run_id} seq {e.seq} does not follow seq {want_seq} in the "
                "chain; the file is out of order, incomplete or altered",
                field=f"line {lineno}",
            )
        if chain_hash(prev, e.run_id, e.seq, e.type, e.actor, e.lease, e.idempotency_key,
                      e.recorded_us, e.schema_version, payload) != digest:
            raise InvalidInput(
                f"line {lineno}: run {e.run_id} seq {e.seq} does not match its hash; the "
                "event was altered after it was written",
                field=f"line {lineno}",
            )
        last[e.run_id] = (e.seq, digest)
        idem_digest = None
        if e.idempotency_digest is not None:
            idem_digest = _unhex(e.idempotency_digest, "idempotency_digest", lineno)
        if e.batch_size < 1:
            raise InvalidInput(f"line {lineno}: batch_size must be at least 1", field="batch_size")
        yield lineno, Recorded(
            run_id=e.run_id, seq=e.seq, position=0, type=e.type, actor=e.actor, lease=e.lease,
            idempotency_key=e.idempotency_key, recorded_us=e.recorded_us,
            schema_version=e.schema_version, payload=payload, prev_hash=prev, hash=digest,
        ), idem_digest, e.batch_size


def _redacted(line: bytes) -> bool:
    """Whether a line that is not an exported event is one of a redacted export."""
    try:
        doc = msgspec.json.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("redacted") is True


def as_dict(rec: Recorded, digest: bytes | None = None, batch_size: int = 1,
            db_role: str | None = None) -> dict[str, Any]:
    return msgspec.json.decode(to_line(rec, digest, batch_size, db_role))
