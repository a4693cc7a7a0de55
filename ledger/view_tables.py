"""View tables in neutral terms, and the interface each backend's view store implements.

Projections (``projections/``) derive rows from the log and keep them in tables of their
own. They declare those tables here, in words every backend understands (a column is
text, int, real or blob, nullable or not; a primary key; indexes, one of them partial), and
talk to the backend's ``ViewStore`` through a small vocabulary: write a run's rows
(only what changed is written), keep tracking positions and versions, build shadow
tables for a rebuild and swap them in, and read by key, by equality filters, by a range
on one column, in order, a page at a time. No SQL crosses this line: ledger/viewsql.py
turns it into SQL for both backends, whose view stores (``ledger/sqlite/sqlite_view_store.py``,
``ledger/postgres/postgres_view_store.py``) give only their dialect.

Every view table keeps the order its rows were first written in: ``ORDINAL`` names that
order as a pseudo-column (SQLite tables keep it implicitly; a PostgreSQL table holds an
identity column). A row updated in place keeps its ordinal, so "oldest first" is stable.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import msgspec

ColumnType = Literal["text", "int", "real", "blob"]

#: The pseudo-column holding a row's creation order; selectable and orderable.
ORDINAL = "_ordinal"
#: The tables every view store keeps beside the views: each view's tracking position
#: (the last log position applied) and the version of the fold that made its rows.
TRACKING = "projection_positions"
VERSIONS = "projection_versions"
#: A view by name: its table and the version of the fold that makes its rows.
Views = Mapping[str, tuple["TableSpec", int]]


class _NotNull:
    """A filter value: the column holds any value but NULL."""

    _instance: _NotNull | None = None

    def __new__(cls) -> _NotNull:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_NULL"


#: ``where={"lease": NOT_NULL}``: rows whose lease is set.
NOT_NULL = _NotNull()


class Column(msgspec.Struct, frozen=True):
    name: str
    type: ColumnType
    nullable: bool = True


class Index(msgspec.Struct, frozen=True):
    """A secondary index: ``suffix`` names it (``<table>_<suffix>``); ``where`` makes it
    partial, as equality terms (a value, or ``NOT_NULL``) that its rows all satisfy."""

    suffix: str
    columns: tuple[str, ...]
    where: tuple[tuple[str, Any], ...] = ()


class TableSpec(msgspec.Struct, frozen=True):
    """One view table: its columns in order, primary key and indexes."""

    name: str
    columns: tuple[Column, ...]
    pk: tuple[str, ...]
    indexes: tuple[Index, ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def indexed_columns(self) -> set[str]:
        """The columns some index reads: its keys or its partial predicate."""
        out: set[str] = set()
        for ix in self.indexes:
            out.update(ix.columns)
            out.update(c for c, _ in ix.where)
        return out


def columns(**kinds: str) -> tuple[Column, ...]:
    """Shorthand: ``columns(run_id="text!", lease="int")``; a trailing ``!`` is NOT NULL."""
    return tuple(Column(n, k.rstrip("!"), not k.endswith("!")) for n, k in kinds.items())  # type: ignore[arg-type]


Row = Mapping[str, Any]


class ViewWriter(abc.ABC):
    """Writes to view tables; valid only inside the store transaction that handed it out.

    ``table`` arguments are handles from ``ViewStore.table`` or ``ViewStore.shadow``.
    """

    @abc.abstractmethod
    def sync_one(self, table: Any, row: Row) -> None:
        """Make the row with ``row``'s key equal ``row``, writing nothing if it already is."""

    @abc.abstractmethod
    def sync_many(self, table: Any, run_id: str, rows: Sequence[Row]) -> None:
        """Make the run's rows equal ``rows``: delete those gone, write those that differ."""

    @abc.abstractmethod
    def fill(self, table: Any, run_id: str, rows: Sequence[Row], *, many: bool) -> None:
        """A shadow table's rows for a run, written outright (``many``: replace the run's rows)."""

    @abc.abstractmethod
    def advance(self, names: Sequence[str], last_position: int, run_id: str) -> None:
        """This write (of ``run_id``, up to ``last_position``) kept the named projections.
        Inline upkeep calls it on every write; a backend records it only where ``lagging``
        needs it (both mark the writes that did not keep every view, so a write that kept
        them all writes nothing here)."""

    @abc.abstractmethod
    def set_positions(self, positions: Mapping[str, int]) -> None: ...


class ViewStore(ViewWriter):
    """A backend's view tables, their tracking positions and versions, and their reads.

    The write methods (``ViewWriter``'s, ``prepare``, ``create_shadows``, ``swap_in``)
    run inside a transaction of the owning store (``store.write_transaction``); the
    reads run on their own or inside ``store.read_transaction`` for one snapshot.
    """

    # --- schema, tracking and versions ------------------------------------------------

    @abc.abstractmethod
    def needs_prepare(self, views: Views) -> bool:
        """True if a table, the tracking rows or a version is missing or out of date."""

    @abc.abstractmethod
    def outdated(self, views: Views) -> list[str]:
        """The views among ``views`` whose rows were kept by another version of their fold
        (or before versions were recorded): ``prepare`` remakes them, a rebuild refolds them."""

    @abc.abstractmethod
    def prepare(self, views: Views) -> None:
        """Create missing tables (tracking at 0) and set views kept at another version
        back to position 0, so a catch-up refolds them. Inside a write transaction."""

    @abc.abstractmethod
    def positions(self) -> dict[str, int]: ...

    def lagging(self, names: Iterable[str], last_position: int) -> dict[str, int]:
        """The projections among ``names`` that catch-up must refold, each with the
        position to refold after. Here: those whose tracking row is behind the log's
        ``last_position``; a backend that marks each write instead overrides it."""
        wanted = set(names)
        return {n: pos for n, pos in self.positions().items() if n in wanted and pos < last_position}

    @abc.abstractmethod
    def table(self, spec: TableSpec) -> Any:
        """A handle for writing ``spec``'s table (statements prepared once)."""

    # --- rebuild ----------------------------------------------------------------------

    @abc.abstractmethod
    def create_shadows(self, specs: Sequence[TableSpec]) -> list[Any]:
        """Empty shadow tables for a rebuild (dropping any a killed rebuild left); handles."""

    @abc.abstractmethod
    def shadow(self, spec: TableSpec) -> Any:
        """The handle of a shadow table ``create_shadows`` made (maybe in an earlier transaction)."""

    @abc.abstractmethod
    def swap_in(self, views: Views, position: int) -> dict[str, int]:
        """Replace each table by its shadow with its indexes, tracking at ``position``;
        returns each table's row count. Inside the write transaction that makes it atomic."""

    # --- reads ------------------------------------------------------------------------

    @abc.abstractmethod
    def get(self, table: str, key: Sequence[Any], columns: Sequence[str]) -> tuple[Any, ...] | None:
        """One row's columns by primary key, or None."""

    @abc.abstractmethod
    def get_many(self, table: str, keys: Iterable[Any], columns: Sequence[str]) -> dict[Any, tuple[Any, ...]]:
        """Rows of a one-column primary key table by key: {key: columns}; missing keys absent."""

    @abc.abstractmethod
    def select(
        self,
        table: str,
        columns: Sequence[str],
        *,
        where: Mapping[str, Any] | None = None,
        where_not: Mapping[str, Any] | None = None,
        between: tuple[str, Any, Any] | None = None,
        order: Sequence[str] | None = None,
        after: Sequence[Any] | None = None,
        limit: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """Rows matching every filter: ``where`` column = value (None: is null; a tuple:
        one of; ``NOT_NULL``), ``where_not`` column is distinct from value, ``between``
        (column, low, high) inclusive with None for open and never null; in ``order``
        (column names, ``ORDINAL`` allowed), after the keyset ``after`` (values of the
        order columns), at most ``limit``. Without ``order`` the order is the backend's."""

    def select_joined(self, table: str, columns: Sequence[str], other: str, other_columns: Sequence[str],
                      *, key: str = "run_id", **filters: Any) -> list[tuple[Any, ...]]:
        """``select`` on ``table`` (same filters), each row followed by ``other_columns`` of the
        row of ``other`` whose one-column primary key ``key`` equals the row's ``key``; rows
        with no such row are left out. This default makes two lookups; a backend may answer
        it in one statement."""
        picked = self.select(table, (key, *columns), **filters)
        found = self.get_many(other, [r[0] for r in picked], other_columns) if picked else {}
        return [(*r[1:], *found[r[0]]) for r in picked if r[0] in found]

    def pages(
        self, table: str, columns: Sequence[str], *, order: Sequence[str], page: int = 1000, **filters: Any
    ) -> Iterator[tuple[Any, ...]]:
        """``select`` a page at a time by keyset; the order columns must come first in
        ``columns`` and be unique together."""
        n = len(order)
        after = None
        while True:
            rows = self.select(table, columns, order=order, after=after, limit=page, **filters)
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1][:n]

    @abc.abstractmethod
    def count(self, table: str, *, where: Mapping[str, Any] | None = None,
              where_not: Mapping[str, Any] | None = None, order: Sequence[str] | None = None,
              after: Sequence[Any] | None = None) -> int:
        """How many rows ``select`` with the same filters (and keyset) would return."""
