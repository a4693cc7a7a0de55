"""Which storage backend a ledger address names, and opening it.

One place for the forms a user may give (``Ledger(...)``, the CLI's ``--db`` and
``HANDOFF_DB`` all come here):

- a file path (``handoff.db``, ``/srv/ledger.db``) or ``:memory:``: SQLite;
- ``sqlite:///abs/path``, ``sqlite:rel/path`` or ``sqlite::memory:``, optionally with
  backend settings as a query (``sqlite:///abs/path?synchronous=NORMAL``);
- ``postgresql://...`` (or ``postgres://``): the PostgreSQL backend (ledger/postgres/;
  needs the postgres extra: ``pip install '.[postgres]'`` from the checkout, else
  ``BackendUnavailable``, whose message says what to install).

A new backend adds its scheme to ``open_store`` and a package of its own beside
ledger/sqlite/; nothing above ledger/ changes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from .errors import BackendUnavailable, InvalidInput
from .store import Capabilities, EventStore

#: The settings each backend accepts in its address's query (and as keyword options).
SQLITE_OPTIONS = ("synchronous",)
_POSTGRES = ("postgresql", "postgres")
#: The backend modules; each offers ``is_driver_error(exc)``.
BACKEND_MODULES = ("handoff.ledger.sqlite", "handoff.ledger.postgres")


def is_driver_error(exc: BaseException) -> bool:
    """Did a loaded backend's driver raise ``exc`` without the backend mapping it to a
    LedgerError? (A store failure, exit 3, rather than a bug.)"""
    for name in BACKEND_MODULES:
        module = sys.modules.get(name)
        if module is not None and module.is_driver_error(exc):
            return True
    return False


class Address:
    """A parsed ledger address: the backend's name, where, and its settings."""

    __slots__ = ("backend", "location", "options")

    def __init__(self, backend: str, location: str, options: dict[str, str]) -> None:
        self.backend = backend
        self.location = location
        self.options = options

    def __repr__(self) -> str:
        return f"Address({self.backend!r}, {self.location!r}, {self.options!r})"


def _query(text: str, field: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split("&"):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise InvalidInput(f"{field}: setting {part!r} must be written name=value", field=field)
        out[name] = value
    return out


def parse(target: object, field: str = "db") -> Address:
    """Tell which backend ``target`` names; refuse what names none (``InvalidInput``)."""
    try:
        text = os.fspath(target)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidInput(
            f"{field} must be a file path or a ledger URL, got {type(target).__name__}", field=field
        ) from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text or "\x00" in text:
        raise InvalidInput(f"{field} must be a non-empty file path or URL without NUL bytes", field=field)
    scheme, sep, rest = text.partition(":")
    if not sep or "/" in scheme or "\\" in scheme or len(scheme) < 2 or text == ":memory:":
        # A plain path (a one-letter "scheme" is a Windows drive letter).
        return Address("sqlite", text, {})
    scheme = scheme.lower()
    if scheme == "sqlite":
        where, _, query = rest.partition("?")
        if where.startswith("//"):
            host, slash, path = where[2:].partition("/")
            if host:
                raise InvalidInput(
                    f"{field} {text!r} names a host ({host}); an SQLite ledger is a local file: "
                    "write sqlite:///absolute/path or sqlite:relative/path",
                    field=field,
                )
            where = slash + path
        if not where:
            raise InvalidInput(f"{field} {text!r} names no file; write sqlite:///absolute/path", field=field)
        options = _query(query, field)
        unknown = sorted(set(options) - set(SQLITE_OPTIONS))
        if unknown:
            raise InvalidInput(
                f"{field}: the SQLite backend has no setting {unknown[0]!r}; it accepts "
                f"{', '.join(SQLITE_OPTIONS)}",
                field=field,
            )
        return Address("sqlite", where, options)
    if scheme in _POSTGRES:
        return Address("postgresql", text, {})
    if rest.startswith("//"):
        raise InvalidInput(
            f"{field} {text!r} names a {scheme!r} ledger; the backends are sqlite (a file path or "
            "sqlite:///path) and, in a later release, postgresql://",
            field=field,
        )
    # "name:with-colon.db" and the like: a relative file name that happens to hold a colon.
    return Address("sqlite", text, {})


def capabilities_of(target: object, field: str = "db") -> Capabilities:
    """What the backend ``target`` names offers (``EventStore.capabilities``), without
    opening it: ``init`` and ``import`` ask whether an address is a file before one exists."""
    address = parse(target, field)
    if address.backend == "postgresql":
        from .postgres.postgres_store import PostgresStore  # loads without the driver; opening needs it

        return PostgresStore.capabilities
    from .sqlite import SqliteStore

    if address.location == ":memory:":  # no file: a memory store is gone when it closes
        return msgspec.structs.replace(SqliteStore.capabilities, is_file=False)
    return SqliteStore.capabilities


def open_store(
    target: object,
    *,
    readonly: bool = False,
    create: bool = True,
    busy_timeout_s: float = 5.0,
    clock: Callable[[], int] | None = None,
    field: str = "db",
    **options: Any,
) -> EventStore:
    """Open the store ``target`` names. ``options`` are backend settings (for SQLite:
    ``synchronous``); the address's own query wins over none, and both may not disagree."""
    address = parse(target, field)
    if address.backend == "postgresql":
        return _open_postgres(address, readonly=readonly, create=create,
                              busy_timeout_s=busy_timeout_s, clock=clock, field=field, **options)
    settings = {k: v for k, v in options.items() if v is not None}
    for name, value in address.options.items():
        if name in settings and str(settings[name]).upper() != value.upper():
            raise InvalidInput(
                f"{field} sets {name}={value} but the caller passed {name}={settings[name]}; give it once",
                field=name,
            )
        settings[name] = value.upper() if name == "synchronous" else value
    unknown = sorted(set(settings) - set(SQLITE_OPTIONS))
    if unknown:
        raise InvalidInput(
            f"the SQLite backend has no setting {unknown[0]!r}; it accepts {', '.join(SQLITE_OPTIONS)}",
            field=unknown[0],
        )
    from .sqlite import SqliteStore  # loaded only when an SQLite ledger is opened

    return SqliteStore(
        address.location, readonly=readonly, create=create, busy_timeout_s=busy_timeout_s,
        clock=clock, **settings,
    )


def _open_postgres(address: Address, *, readonly: bool, create: bool, busy_timeout_s: float,
                   clock: Callable[[], int] | None, field: str, **options: Any) -> EventStore:
    unknown = sorted(k for k, v in options.items() if v is not None)
    if unknown:
        raise InvalidInput(
            f"the PostgreSQL backend has no setting {unknown[0]!r}; its settings are the "
            "connection URL's own (host, port, dbname, user, sslmode...)",
            field=unknown[0],
        )
    try:
        import psycopg  # noqa: F401 - the optional driver
    except ImportError:
        from .extras import install_hint

        raise BackendUnavailable(
            f"{field} names a PostgreSQL ledger, but the PostgreSQL driver is not installed; "
            f"install it with: {install_hint('postgres')}",
            field=field,
        ) from None
    from .postgres import PostgresStore  # loaded only when a PostgreSQL ledger is opened

    url = address.location
    if url.lower().startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    return PostgresStore(url, readonly=readonly, create=create, busy_timeout_s=busy_timeout_s, clock=clock)
