"""The argument checks decide makes: each takes a field's name and a value, and returns
the value as the ledger stores it or refuses it with InvalidInput naming the field.

Pure functions of their arguments, so the API can run the same check before it builds a
command (``check_attrs``, ``check_progress_kinds``) and an import meets the same rules
as an append. The rule for characters and whole numbers is the store's (check_chars,
check_seq): one rule for every text and count in the ledger.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from msgspec import UNSET, UnsetType

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput
from handoff.ledger.store import check_chars, check_seq, check_utf8

from . import transitions as T

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


#: The bounds of a contract's own progress kinds (``progress_kinds``).
MAX_DECLARED_KINDS = 32
KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def check_progress_kinds(value: object, field: str = "progress_kinds") -> ev.DeclaredKinds | UnsetType:
    """A contract's own progress kinds by working state, checked when the run opens.

    Only new names: a built-in kind keeps the state the table gives it, and activity that
    never counts (``note``, ``waiting``, ...) cannot be declared progress, so noise stays
    noise. The result lists states in lifecycle order, each state's kinds in the order
    given and once; none at all is ``UNSET``."""
    if value is UNSET or value is None:
        return UNSET
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field} must map working states to lists of kind names", field=field)
    declarable = ", ".join(s for s in T.STATES if s in T.DECLARABLE)
    out: dict[str, list[str]] = {}
    for state, kinds in value.items():
        if state not in T.DECLARABLE:
            raise InvalidInput(f"{field}: {str(state)[:60]!r} is not a working state; kinds may be declared "
                               f"for {declarable}", field=field)
        if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)):
            raise InvalidInput(f"{field}.{state} must be a list of kind names", field=field)
        own = out.setdefault(state, [])
        for kind in kinds:
            if not isinstance(kind, str) or not KIND_NAME.fullmatch(kind):
                raise InvalidInput(f"{field}.{state}: {repr(kind)[:80]} is not a kind name (a lowercase letter, "
                                   "then up to 63 lowercase letters, digits or _)", field=field)
            if kind in T.NOT_PROGRESS:
                raise InvalidInput(f"{field}.{state}: {kind} is activity that never counts as progress; it "
                                   "cannot be declared progress", field=field)
            if kind in T.ALL_PROGRESS_KINDS:
                where = ", ".join(s for s, ks in T.PROGRESS_KINDS.items() if kind in ks)
                raise InvalidInput(f"{field}.{state}: {kind} is a built-in progress kind (of {where}); declare "
                                   "a name of your own", field=field)
            if kind not in own:
                own.append(kind)
    total = sum(len(k) for k in out.values())
    if total > MAX_DECLARED_KINDS:
        raise InvalidInput(f"{field} declares {total} kinds, over the limit of {MAX_DECLARED_KINDS}", field=field)
    ordered = {s: tuple(out[s]) for s in T.STATES if out.get(s)}
    return ordered or UNSET

