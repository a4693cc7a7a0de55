"""How the ``handoff`` command prints: lines, JSON documents, tables, JSON Lines and CSV.

The commands print their documents, write outcomes and listings through here, so a
listing streams (memory stays flat however long it is), ``--json`` / ``--format`` mean
the same on every command, and text a worker or an operator typed is made visible
(``render.visible``) before it reaches a terminal. What a document holds is the renderers' (handoff/render.py); this module only
lays it out. Apart from cli.py so the commands read as commands; the renderer and the
standard library's json and csv are imported on use, as a shell agent pays every import.
"""

from __future__ import annotations

import sys
from typing import Any

import click


def printable(text: str) -> str:
    """Output of several lines with each line made ``render.visible``: an undecodable byte of
    a file name shows as \\xNN, a control character as an escape, and the lines stay the
    ones the renderer meant (JSON stays JSON: its escapes are JSON's)."""
    from handoff.render import lines

    return lines(text.split("\n"))


def emit(doc: dict[str, Any], as_json: bool, text: str | None) -> None:
    """Print ``doc`` as --json prints it, or else ``text`` (nothing when it is None)."""
    if as_json:
        import json

        click.echo(printable(json.dumps(doc, indent=2, ensure_ascii=False, default=str)))
    elif text is not None:
        click.echo(printable(text))


def echo_write(out: Any, as_json: bool, did: str, *, unchanged: str | None = None, **extra: Any) -> None:
    """Print what a write did: one line, or the write document. ``unchanged``: the line
    for an accepted write that wrote no event, where the generic one would mislead."""
    from handoff import render as R

    doc = {**R.write_doc(out), **extra}
    r, cp = out.result, out.checkpoint
    if r.outcome == "duplicate":
        text = f"{r.run_id}: already recorded; nothing new written (state {cp.state})"
    elif r.outcome == "unchanged" and unchanged:
        text = f"{r.run_id}: {unchanged}"
    elif r.outcome == "unchanged":
        text = f"{r.run_id}: nothing to add, it is already so; nothing written (at seq {r.last_seq}; state {cp.state})"
    else:
        seqs = f"seq {r.first_seq}" if r.first_seq == r.last_seq else f"seq {r.first_seq}-{r.last_seq}"
        text = f"{r.run_id}: {did} ({seqs}; state {cp.state})"
    emit(doc, as_json, text)


# --- output that streams: memory flat however long the listing ------------------------

TABLE_WINDOW = 256  # a streamed table sizes its columns from this many rows at a time


def stream_table(headers: list[str], rows: Any, *, window: int = TABLE_WINDOW) -> int:
    """Print an aligned table as its rows arrive; returns how many rows were printed.

    Columns are sized from the header and the first ``window`` rows, and only widen for
    later windows, so a long listing never has to be held whole to be printed.
    """
    import itertools

    from handoff.render import cells, table_lines

    widths = [len(h) for h in headers]
    it = iter(rows)
    printed = 0
    while chunk := [cells(row) for row in itertools.islice(it, window)]:
        for row in chunk:
            for i, c in enumerate(row):
                widths[i] = max(widths[i], len(c))
        click.echo("\n".join(table_lines([headers, *chunk] if not printed else chunk, widths)))
        printed += len(chunk)
    return printed


def stream_json(head: dict[str, Any], key: str, items: Any, tail: Any = None) -> int:
    """Print ``{**head, key: [*items], **tail()}`` exactly as ``json.dumps(..., indent=2)``
    would, one item at a time; ``tail`` is called after the last item. Returns the count."""
    import json

    def dumps(value: Any, depth: int) -> str:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str).replace("\n", "\n" + "  " * depth)

    out = ["{"]
    for k, v in head.items():
        out.append(f"\n  {dumps(k, 1)}: {dumps(v, 1)},")
    out.append(f"\n  {dumps(key, 1)}: [")
    n = 0
    for item in items:
        out.append(("," if n else "") + "\n    " + dumps(item, 2))
        n += 1
        if len(out) >= TABLE_WINDOW:  # written in batches: one write per item is slow
            click.echo("".join(out), nl=False)
            out.clear()
    click.echo("".join(out), nl=False)
    end = ["\n  ]" if n else "]"]
    for k, v in (tail() if tail is not None else {}).items():
        end.append(f",\n  {dumps(k, 1)}: {dumps(v, 1)}")
    click.echo("".join(end) + "\n}")
    return n


def stream_jsonl(items: Any, *, flush_each: bool = False) -> int:
    """One compact JSON document per line (each written at once with ``flush_each``, for --follow)."""
    import json

    n = 0
    out = []
    for item in items:
        out.append(json.dumps(item, ensure_ascii=False, default=str))
        n += 1
        if len(out) >= (1 if flush_each else TABLE_WINDOW):
            click.echo("\n".join(out))
            out.clear()
    if out:
        click.echo("\n".join(out))
    return n


#: Free-text CSV columns (what a worker or an operator wrote) and the first characters that
#: make a spreadsheet read a cell as a formula: such a cell gets a leading ' (the data
#: column keeps the event exactly).
CSV_FREE_TEXT = frozenset({"key", "summary"})
CSV_FORMULA_STARTS = frozenset("=+-@\t\r")


#: The columns of 'handoff log --csv'.
LOG_CSV_COLUMNS = ["position", "at", "run_id", "seq", "actor", "lease", "type", "key", "summary", "data", "db_role"]


def stream_csv(items: Any, *, columns: list[str] | None = None, free_text: Any = CSV_FREE_TEXT,
                flush_each: bool = False) -> int:
    """CSV with a header line: ``columns`` of each row (a log row's by default), a map or a
    list in a cell (a log row's ``data``) as compact JSON, and a ``free_text`` cell that a
    spreadsheet would run as a formula shown as text."""
    import csv
    import io
    import json

    columns = LOG_CSV_COLUMNS if columns is None else columns
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    n = 0

    def cell(c: str, v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, bool):
            return "true" if v else "false"  # as in the JSON, not Python's True
        if c == "data" or isinstance(v, (dict, list, tuple)):
            return json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=str)
        if c in free_text and isinstance(v, str) and v[:1] in CSV_FORMULA_STARTS:
            return "'" + v  # a spreadsheet would run it as a formula; shown as text instead
        return v

    for item in items:
        writer.writerow([cell(c, item.get(c)) for c in columns])
        n += 1
        if flush_each or n % TABLE_WINDOW == 0:
            click.echo(buf.getvalue(), nl=False)
            sys.stdout.flush()
            buf.seek(0)
            buf.truncate()
    click.echo(buf.getvalue(), nl=False)
    return n


#: What --format offers; --json stays the short form of --format json.
FORMATS = ("table", "json", "jsonl", "csv")
FORMAT_HELP = ("table (the default), json (one document, as --json prints), jsonl (one JSON object per line) or "
               "csv (a header line; a cell that a spreadsheet would run as a formula, beginning with = + - or @, "
               "gets a leading ').")


def chosen_format(fmt: str | None, as_json: bool) -> str:
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json is --format json; it cannot go with --format {fmt}: choose one")
    return "json" if as_json else fmt or "table"


class _AnyText:
    """Every column is free text (a listing's names, goals and reasons are all typed by someone)."""

    def __contains__(self, column: object) -> bool:
        return True


ALL_FREE_TEXT = _AnyText()


def listing(fmt: str, head: dict[str, Any], key: str, rows: Any, tail: Any, columns: list[str],
             table: Any) -> int:
    """Print a listing's rows in ``fmt``: the JSON document (``head``, the rows under ``key``,
    then ``tail()``), one row per line, CSV, or the table ``table(rows)`` prints. For jsonl and
    csv, where stdout holds rows only, the next-page hint goes to stderr."""
    if fmt == "json":
        return stream_json(head, key, rows, tail)
    if fmt == "table":
        return table(rows)
    n = stream_jsonl(rows) if fmt == "jsonl" else stream_csv(rows, columns=columns, free_text=ALL_FREE_TEXT)
    paging = tail()
    if paging.get("next"):
        click.echo(f"{paging['more']} more not shown; for the next page, repeat the command with "
                   f"--after {paging['next']} (or --limit 0 for all)", err=True)
    return n


def one_document(doc: dict[str, Any], fmt: str, text: Any, pairs: Any) -> None:
    """Print one document (a packet, a comparison) in ``fmt``: the text ``text()``, JSON as
    --json prints it, one line of JSON, or CSV of the rows ``pairs(doc)`` gives."""
    if fmt == "table":
        click.echo(printable(text()))
    elif fmt == "json":
        emit(doc, True, None)
    elif fmt == "jsonl":
        stream_jsonl([doc])
    else:
        header, rows = pairs(doc)
        stream_csv(rows, columns=header, free_text=ALL_FREE_TEXT)


def field_rows(doc: Any, prefix: str = "") -> Any:
    """A nested document as (field, value) rows, field being its dotted path: a packet in CSV."""
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            yield from field_rows(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield {"field": prefix, "value": doc}


def side_rows(doc: dict[str, Any]) -> Any:
    """A diff document as (what, a, b) rows, every {"a", "b"} pair in it under its dotted
    path (a difference in a field under the field's name): a comparison in CSV."""
    yield {"what": "run", "a": doc["run_a"], "b": doc["run_b"]}

    def pairs(part: Any, prefix: str) -> Any:
        if isinstance(part, dict):
            if "a" in part and "b" in part:
                name = f"{prefix}.{part['field']}" if "field" in part else prefix
                yield {"what": name, "a": part["a"], "b": part["b"]}
            for k, v in part.items():
                if k not in ("a", "b", "field"):
                    yield from pairs(v, f"{prefix}.{k}")
        elif isinstance(part, list):
            for v in part:
                yield from pairs(v, prefix)

    for key in ("compared", "heartbeats", "first_divergence", "after"):
        yield from pairs(doc[key], key)


def more_line(more: int, nxt: str | None, extra: str = "") -> None:
    if nxt:
        click.echo(f"... {more} more not shown; for the next page, repeat the command with "
                   f"--after {nxt}{extra} (or --limit 0 for all)")
