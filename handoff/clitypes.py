"""The click parameter types of the ``handoff`` command, and how ``--attr`` reads a value.

Each type turns one argument's text into what the library takes (a time into UTC µs, a
lease token into ``LeaseToken``, ``KEY=VALUE`` into a pair) and refuses what it cannot
read as a usage error (exit 2) naming the option, before any ledger is opened. They live
apart from cli.py so the commands read as commands; they import only click at module
level, since ``handoff --help`` builds every option (the library is loaded on use).
"""

from __future__ import annotations

import re
from typing import Any

import click


class IsoTime(click.ParamType):
    """An ISO 8601 time; a time without an offset is taken as UTC. Converted to UTC µs."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from datetime import datetime, timezone

        try:
            dt = datetime.fromisoformat(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time; write it like 2026-05-01T12:00:00Z", param, ctx)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        try:  # an offset can push a time at either end of the calendar out of it
            dt = dt.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            self.fail(f"{value!r} falls outside years 1 to 9999 in UTC", param, ctx)
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        delta = dt - epoch
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


ISO_TIME = IsoTime()


class Seconds(click.FloatRange):
    """A FloatRange that also refuses nan and infinities (which compare false to any bound)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return rv


class LeaseTokenParam(click.ParamType):
    """A lease token as claim printed it (LEASE.SECRET); a bare number is a usage error."""

    name = "TOKEN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from handoff.ledger.errors import InvalidInput
        from handoff.ledger.store import LeaseToken

        try:
            return LeaseToken.parse(value)
        except InvalidInput as exc:
            # Say what was given only by its kind: an argument may be someone's real token.
            self.fail(exc.message.replace("lease is ", "this is ", 1), param, ctx)


LEASE_TOKEN = LeaseTokenParam()


#: How ``--attr KEY=VALUE`` is given and how VALUE is read, in words for --help and docs/cli.md
#: (after the table's description of the facts themselves).
ATTR_HELP = ("Give each as KEY=VALUE (repeatable), e.g. model=claude-sonnet, "
             "gen_ai.usage.input_tokens=1200, cost_usd=0.012. VALUE true or false is a boolean; a number "
             "written as it prints (42, -7, 0.25) is a number; anything else is text, as given (007, 1e3 "
             "and 3.10 stay text). To keep a number as text, put it in double quotes: build='\"42\"'.")
_ATTR_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_ATTR_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\.[0-9]+")


def attr_value(text: str) -> Any:
    """VALUE of ``--attr KEY=VALUE``: a number only when it reads back as the very text
    given, so nothing typed is changed on the way in (3.10 stays "3.10", 007 stays "007")."""
    if text in ("true", "false"):
        return text == "true"
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if _ATTR_INT.fullmatch(text) and text != "-0":
        from handoff.ledger.inputs import ATTR_INT_RANGE

        low, high = ATTR_INT_RANGE
        if len(text) > 20 or not low <= int(text) <= high:
            raise click.BadParameter(f"{text[:30]} is a whole number outside the 64-bit range; to record it as "
                                     f"text, put it in double quotes ('\"{text[:30]}\"')")
        return int(text)
    if _ATTR_DECIMAL.fullmatch(text) and repr(float(text)) == text:
        return float(text)
    return text


class AttrParam(click.ParamType):
    """``KEY=VALUE``, read as (key, value); the bounds are the library's (check_attrs)."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        key, eq, text = str(value).partition("=")
        if not eq or not key:
            self.fail(f"{value[:60]!r} is not KEY=VALUE (for example model=claude-sonnet)", param, ctx)
        try:
            return key, attr_value(text)
        except click.BadParameter as exc:
            self.fail(f"{key[:64]}: {exc.message}", param, ctx)


def attr_map(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any] | None:
    """The --attr pairs as one map; a key given twice is a usage error, not a silent pick."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise click.UsageError(f"--attr {key} is given twice; give each key once")
        out[key] = value
    return out or None


class PositionOrTime(click.ParamType):
    """A global position (a whole number) or an ISO 8601 time: ("position", n) or ("time", µs)."""

    name = "POSITION|TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        if text.isdigit():
            return ("position", int(text))
        return ("time", ISO_TIME.convert(text, param, ctx))


POSITION_OR_TIME = PositionOrTime()
