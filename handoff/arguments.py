"""The checks every argument of the Python API passes, and the names an actor is given.

A refusal is an ``InvalidInput`` naming the field, raised before anything is read or
written; the parts of ``Ledger`` (handoff/facade.py) and the CLI call these, so each rule has
this one home.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

import msgspec

from handoff.ledger.errors import InvalidInput
from handoff.ledger.store import LeaseToken, check_utf8

#: The times the API accepts (UTC µs since 1970): years 1 to 9999, what can be printed.
MIN_TIME_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_TIME_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
#: The longest lock wait the API accepts (seconds): a day.
MAX_BUSY_TIMEOUT_S = 86_400.0


# --- argument checks: every refusal an InvalidInput naming the field ------------------


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


def actor_filter(actors: tuple[str, ...] | list[str]) -> Callable[[str], bool]:
    """Whether a recorded actor (``kind:name``) is one of ``actors``: each given as
    ``kind:name``, or as a name alone (any kind). No actors: every actor matches."""
    exact = {a for a in actors if ":" in a}
    names = {a for a in actors if ":" not in a}
    if not actors:
        return lambda actor: True
    return lambda actor: actor in exact or actor.partition(":")[2] in names


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


def lease_token(value: object, field: str = "lease") -> LeaseToken:
    """The lease token a worker passed, or InvalidInput (a bare lease number is not one)."""
    return LeaseToken.parse(value, field)


def now_us() -> int:
    return time.time_ns() // 1000


def new_run_id() -> str:
    import secrets  # imported when needed: CLI start-up time is what a shell agent pays per event

    return "run-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def keyed_id(prefix: str, *parts: object) -> str:
    """A run id derived from an idempotency key and what it is scoped to: the same key
    always names the same run, so a retried keyed ``open`` or ``fork`` finds its first
    attempt (and answers ``duplicate``) instead of creating a second run."""
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{prefix}{digest[:24]}"


def login_name() -> str:
    """Who runs this process: $USER, else $LOGNAME, else the name the password database
    gives the process's uid, else ``uid-N``. Never a placeholder such as "operator", which
    would log the actor as ``operator:operator`` and hide who acted."""
    for var in ("USER", "LOGNAME"):
        name = os.environ.get(var)
        if name:
            return name
    uid = os.getuid()
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name or f"uid-{uid}"
    except (ImportError, KeyError):
        return f"uid-{uid}"


def operator_name(by: object = None) -> str:
    """The name an operator (or a person acting without a lease) is logged under: ``by``
    when given, else $HANDOFF_ACTOR, else ``login_name()``. The CLI's ``--by`` is ``by``."""
    if by is not None:
        if not isinstance(by, str) or not by.strip():
            raise InvalidInput("--by must name who is acting; leave it out to use $HANDOFF_ACTOR or your "
                               "login name", field="by")
        return by
    return os.environ.get("HANDOFF_ACTOR") or login_name()
