"""Every check of a value that enters the ledger from outside: an argument of the Python
API or the CLI, a command's field, an envelope of an imported event, a file name.

Each check takes a value and the name of the field it came in, and returns the value as
the ledger keeps it or refuses it with ``InvalidInput`` (``ReservedKey`` for a key another
actor kind owns) naming that field, before anything is read or written. They are pure
functions of their arguments, so decide's handlers call them as the API and the CLI do:
the API can run a handler's check before it builds a command, and an import meets the
same rules as an append. One rule for characters (``check_chars``) and one for whole numbers
(``check_seq``) hold for every text and count in the ledger; names, keys and free text
build on them.

Two argument orders, by caller: the store's and the API's checks take the value first
(``check_seq(value, field)``); the checks the handlers of decide call take the field first
(``text(field, value)``). Two checks live elsewhere, beside what they consult: the one of
a contract's own progress kinds (``check_progress_kinds``) with the lifecycle's tables in
reducers/transitions.py, and the one of a file handoff may write (``check_target``, which
looks at the file system) in ledger/files.py.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from . import events as ev
from .errors import InvalidInput, ReservedKey
from .store import Actor

RUN_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ACTOR_KINDS = ("worker", "owner", "watchdog", "operator")
#: The characters no text in the ledger may hold (tab and newline aside, which free text
#: may): C0 controls and DEL, the C1 controls (U+0080-U+009F, which some terminals obey
#: as escapes), and the bidirectional embeddings, overrides and isolates (U+202A-U+202E,
#: U+2066-U+2069), which make a terminal or a page show text in another order than the
#: one stored. ``check_chars`` applies it; names, keys and ``render.visible`` build on it.
CONTROL_CHARS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
CONTROL_RE = re.compile(f"[{CONTROL_CHARS}]")
ACTOR_NAME_RE = re.compile(f"[^\t\n{CONTROL_CHARS}]{{1,128}}")


# --- run ids, text, whole numbers, actors and keys: the store's envelope -----------


def check_run_id(run_id: object, field: str = "run_id") -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        shown = repr(run_id)[:60]
        raise InvalidInput(
            f"{field} {shown} is not a valid run id: use 1 to 128 characters from "
            "letters, digits and . _ : -",
            field=field,
        )
    return run_id


def check_utf8(value: str, field: str) -> str:
    """Refuse text that cannot be stored as UTF-8: lone surrogates, which is what Python
    makes of invalid UTF-8 bytes in argv, the environment or a file name."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{field} is not valid UTF-8 text (an undecodable byte or lone surrogate at "
            f"character {exc.start}); pass it as UTF-8",
            field=field,
        ) from None
    return value


def check_chars(value: str, field: str) -> str:
    """Refuse text holding a character of ``CONTROL_CHARS``, naming the field, the
    character and where it is: such text could rewrite the lines or the order in which
    a terminal, a report or a chat shows it."""
    m = CONTROL_RE.search(value)
    if m is not None:
        kind = ("a bidirectional text control" if m.group() >= "\u202a" else
                "a C1 control character" if m.group() >= "\x80" else "a NUL or control character")
        raise InvalidInput(
            f"{field} contains {kind} (U+{ord(m.group()):04X} at character {m.start()}); only "
            "printable text, tabs and newlines are accepted",
            field=field,
        )
    return value


def check_seq(value: object, field: str, *, low: int = 0, high: int = 2**53) -> int:
    """A seq or position argument: a whole number (not a bool) from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value)[:60]
        raise InvalidInput(f"{field} must be a whole number from {low} to {high}, got {shown}", field=field)
    return value


def check_actor(actor: Actor) -> Actor:
    if not isinstance(actor, Actor) or actor.kind not in ACTOR_KINDS:
        raise InvalidInput(
            f"actor kind must be one of {', '.join(ACTOR_KINDS)}, got {getattr(actor, 'kind', actor)!r}",
            field="actor",
        )
    if not isinstance(actor.name, str) or not ACTOR_NAME_RE.fullmatch(actor.name):
        raise InvalidInput(
            "actor name must be 1 to 128 printable characters", field="actor.name"
        )
    check_utf8(actor.name, "actor.name")
    return actor


def check_idempotency_key(key: str | None, actor: Actor | None = None) -> str | None:
    """A well-formed key; with ``actor``, also one that actor's kind may use (see
    ``RESERVED_KEY_PREFIXES``)."""
    if key is None:
        return None
    if not isinstance(key, str) or not ACTOR_NAME_RE.fullmatch(key) or len(key) > 200:
        raise InvalidInput(
            "idempotency key must be 1 to 128 printable characters", field="idempotency_key"
        )
    check_utf8(key, "idempotency_key")
    if actor is not None:
        for prefix, kind in RESERVED_KEY_PREFIXES.items():
            if key.startswith(prefix) and actor.kind != kind:
                raise ReservedKey(
                    f"idempotency keys starting with {prefix!r} belong to the {kind} (it records "
                    f"its own decisions under them); a {actor.kind} may not use {key!r}. Choose "
                    "a key without that prefix",
                    field="idempotency_key",
                )
    return key


#: Key prefixes only one actor kind may write under, so nobody can take a key another
#: actor will need: a worker that recorded anything under the watchdog's key for a
#: revocation would turn that revocation into a no-op.
RESERVED_KEY_PREFIXES = {"watch:": "watchdog"}


# --- file names (what is at the path: ledger/files.py's check_target) --------------


def check_path(path: object, field: str = "path") -> str:
    """A file name as given: text or a path object, not empty, without NUL bytes."""
    try:
        p = os.fspath(path)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidInput(f"{field} must be a file path, got {type(path).__name__}", field=field) from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p or "\x00" in p:
        raise InvalidInput(f"{field} must be a non-empty file path without NUL bytes", field=field)
    return p


# --- arguments of the Python API and the CLI ---------------------------------------

#: The times the API accepts (UTC µs since 1970): years 1 to 9999, what can be printed.
MIN_TIME_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_TIME_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
#: The longest lock wait the API accepts (seconds): a day.
MAX_BUSY_TIMEOUT_S = 86_400.0


def check_time_us(value: object, field: str) -> int:
    """A moment as whole UTC microseconds (not a bool) within years 1..9999."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_TIME_US <= value <= MAX_TIME_US:
        shown = repr(value)[:60]
        raise InvalidInput(
            f"{field} must be whole microseconds since 1970 (UTC) within years 1 to 9999, got {shown}",
            field=field,
        )
    return value


def check_seconds(value: object, field: str, *, low: float = 0.0, high: float = MAX_BUSY_TIMEOUT_S,
                  low_open: bool = False) -> float:
    """A finite number of seconds (not a bool) within bounds."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (low < value if low_open else low <= value) and value <= high)
    if not ok:
        shown = repr(value)[:60]
        above = "above" if low_open else "at least"
        raise InvalidInput(f"{field} must be a finite number of seconds {above} {low:g} and at most {high:g}, "
                           f"got {shown}", field=field)
    return float(value)  # type: ignore[arg-type]


def check_text(value: object, field: str, _depth: int = 0) -> None:
    """Every string in a command (its fields, their tuples, nested structs) must encode as
    UTF-8: a lone surrogate (invalid UTF-8 from argv, say) would otherwise pass decide and
    fail while the event is encoded. Types themselves are decide's business."""
    if isinstance(value, str):
        check_utf8(value, field)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            if isinstance(item, str):
                check_utf8(item, f"{field}[{i}]")
    elif isinstance(value, msgspec.Struct) and _depth < 3:
        for name in value.__struct_fields__:
            check_text(getattr(value, name), f"{field}.{name}" if field else name, _depth + 1)


def check_filter(value: object, field: str) -> str | None:
    """An optional text filter of a query (owner, state, ...): None, or UTF-8 text."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, got {type(value).__name__}", field=field)
    return check_utf8(value, field)


def check_texts(values: Any, field: str) -> tuple[str, ...]:
    """A filter given as several texts (states, health), checked one by one."""
    values = (values,) if isinstance(values, str) else tuple(values)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise InvalidInput(f"{field}[{i}] must be text, got {type(value).__name__}", field=field)
        check_filter(value, f"{field}[{i}]")
    return values


def check_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise InvalidInput(f"limit must be a whole number from 1 to 1000000, got {repr(value)[:60]}", field="limit")
    return value


# --- the fields of a command, checked by decide's handlers -------------------------

MAX_TEXT = 16_384
MAX_NAME = 200
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def text(field: str, value: object, *, max_len: int = MAX_TEXT, empty: bool = True) -> str:
    """Free text up to ``max_len`` characters (non-blank unless ``empty``), in the ledger's characters."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, got {type(value).__name__}", field=field)
    if not empty and not value.strip():
        raise InvalidInput(f"{field} must not be empty", field=field)
    if len(value) > max_len:
        raise InvalidInput(f"{field} is {len(value)} characters, over the limit of {max_len}", field=field)
    return check_chars(value, field)  # the one rule for control characters, names and keys use it too


def name(field: str, value: object) -> str:
    """A name (a worker, a key, a kind): one non-blank line of at most MAX_NAME characters."""
    v = text(field, value, max_len=MAX_NAME, empty=False)
    if "\n" in v or "\t" in v:
        raise InvalidInput(f"{field} must be a single line", field=field)
    return v


def count(field: str, value: object, *, low: int = 0, high: int = 2**53) -> int:
    """A whole number from ``low`` to ``high``."""
    return check_seq(value, field, low=low, high=high)  # one rule for whole numbers, everywhere


def seconds(field: str, value: object) -> float:
    """A duration of a contract's policy: finite, above 0, at most 10^7 seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= 10**7:
        raise InvalidInput(f"{field} must be a number of seconds above 0 and at most 10^7, got {value!r}", field=field)
    return float(value)


def choice(field: str, value: object, allowed) -> str:
    """One of ``allowed``; the refusal lists them."""
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInput(f"{field} must be one of {', '.join(sorted(allowed))}, got {value!r:.80}", field=field)
    return value  # type: ignore[return-value]


def digest(field: str, value: object) -> str:
    """A sha256 as the ledger writes it: 64 lowercase hex digits."""
    if not isinstance(value, str) or not HEX_DIGEST.fullmatch(value):
        raise InvalidInput(f"{field} must be a sha256 as 64 lowercase hex digits, got {str(value)[:80]!r}", field=field)
    return value


def text_map(field: str, value: object) -> dict:
    """A map with text keys (a graph's checkpoint, metadata or values), copied."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidInput(f"{field} must be a map with text keys", field=field)
    return dict(value)


def line(field: str, value: object, max_len: int) -> str:
    """A text of one line that may be empty (a namespace, a parent id)."""
    v = text(field, value, max_len=max_len)
    if "\n" in v or "\t" in v:
        raise InvalidInput(f"{field} must be a single line", field=field)
    return v


def plain(field: str, value: object) -> None:
    """Every text inside a graph's map (keys and values, at any depth) holds to the rule of
    every other text of the ledger: no control or bidirectional character."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            check_chars(v, field)
        elif isinstance(v, Mapping):
            for k, item in v.items():
                if isinstance(k, str):
                    check_chars(k, field)
                stack.append(item)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


#: The bounds of a record's ``attrs``: a few facts about one step (model, tokens, cost,
#: tool, trace and span ids), not a place to store output. Keys may be dotted, as
#: OpenTelemetry names are (``gen_ai.usage.input_tokens``).
MAX_ATTRS = 32
MAX_ATTR_KEY = 64
MAX_ATTR_TEXT = 1_000
ATTR_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,%d}" % MAX_ATTR_KEY)
#: Whole numbers must fit a signed 64-bit integer, what every reader of JSON can hold.
ATTR_INT_RANGE = (-(2**63), 2**63 - 1)


def check_attrs(value: object, field: str = "attrs") -> ev.Attrs | UnsetType:
    """A record's attributes, refused (InvalidInput naming the key) past their bounds.

    Called by the API before a command is built and again by every handler, so a map
    inside an imported event meets the same rule. An empty map is ``UNSET``: the event
    then encodes as it did before attributes existed."""
    if value is UNSET or value is None:
        return UNSET
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field} must be a map of names to text, numbers or true/false, got "
                           f"{type(value).__name__}", field=field)
    if len(value) > MAX_ATTRS:
        raise InvalidInput(f"{field} has {len(value)} entries, over the limit of {MAX_ATTRS}; keep the few "
                           "facts about this step (model, tokens, cost, tool, trace id)", field=field)
    out: dict[str, str | int | float | bool] = {}
    for key, v in value.items():
        if not isinstance(key, str) or not ATTR_KEY.fullmatch(key):
            shown = repr(key)[:80]
            raise InvalidInput(f"{field} key {shown} must be 1 to {MAX_ATTR_KEY} characters from letters, digits "
                               "and . _ : -", field=field)
        where = f"{field}[{key}]"
        if isinstance(v, bool):
            out[key] = bool(v)
        elif isinstance(v, int):
            low, high = ATTR_INT_RANGE
            if not low <= v <= high:
                raise InvalidInput(f"{where} is a whole number outside the 64-bit range ({low} to {high}); "
                                   "pass it as text", field=f"{field}.{key}")
            out[key] = int(v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidInput(f"{where} is {v!r}; a number must be finite", field=f"{field}.{key}")
            out[key] = float(v)
        elif isinstance(v, str):
            check_utf8(v, where)
            out[key] = str(text(where, v, max_len=MAX_ATTR_TEXT))
        else:
            raise InvalidInput(f"{where} must be text, a number or true/false, got {type(v).__name__}",
                               field=f"{field}.{key}")
    return out or UNSET
