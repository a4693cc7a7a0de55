"""The counting proxy behind the pg-round-trips benchmark counts what a client waits for.

Round trips are a count, not a speed, so they are tested: known client behaviour
through a real proxy to the real server, counted exactly. (benchmarks/ is the repository's
harness package, importable from the repository root where the tests run.)
"""

from __future__ import annotations

import pytest

from tests.pg import fresh_url

psycopg = pytest.importorskip("psycopg")

from benchmarks.postgres_proxy import CountingProxy, _Parser  # noqa: E402


@pytest.fixture
def proxied():
    url = fresh_url()
    proxy = CountingProxy(url)
    conn = psycopg.connect(proxy.url(url), autocommit=True, prepare_threshold=None)
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
    try:
        yield proxy, conn
    finally:
        conn.close()
        proxy.close()


def test_one_statement_that_waits_for_its_answer_is_one_round_trip(proxied):
    proxy, conn = proxied
    proxy.mark()
    for i in range(10):
        conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
    assert proxy.since_mark() == (10, 10)


def test_a_transaction_sent_statement_by_statement_costs_one_round_trip_each(proxied):
    proxy, conn = proxied
    proxy.mark()
    with conn.transaction():  # BEGIN, INSERT, COMMIT: three waits
        conn.execute("INSERT INTO t VALUES (1, 'x')")
    assert proxy.since_mark() == (3, 3)


def test_a_pipeline_answered_once_is_one_round_trip(proxied):
    proxy, conn = proxied
    proxy.mark()
    with conn.pipeline():
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (%s, 'x')", (1,))
        conn.execute("INSERT INTO t VALUES (%s, 'y')", (2,))
        conn.execute("COMMIT")
    turns, ready = proxy.since_mark()
    assert turns == 1
    assert ready == 1
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 2


def test_the_proxy_refuses_encryption_so_a_preferring_client_talks_in_the_clear():
    url = fresh_url()
    proxy = CountingProxy(url)
    try:
        sep = "&" if "?" in url else "?"
        with psycopg.connect(proxy.url(url) + f"{sep}sslmode=prefer", autocommit=True) as conn:
            assert conn.info.pgconn.ssl_in_use is False
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        proxy.close()


def test_the_parser_counts_ready_for_query_across_chunk_boundaries():
    tag = b"INSERT 0 1\x00"
    msg = b"C" + (4 + len(tag)).to_bytes(4, "big") + tag + b"Z" + (5).to_bytes(4, "big") + b"I"
    stream = msg * 3
    for size in (1, 2, 3, 7, len(stream)):
        p = _Parser()
        for i in range(0, len(stream), size):
            p.feed(stream[i : i + size])
        assert p.ready == 3, size
        assert p.header == b"" and p.skip == 0
