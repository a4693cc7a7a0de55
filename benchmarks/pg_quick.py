"""A quick PostgreSQL append measurement, until the backend joins ``python -m benchmarks``.

    python benchmarks/pg_quick.py [EVENTS]

Creates the database handoff_bench on the local server (dropped at the end) and prints
events/s for raw psycopg single-row INSERTs (autocommit) and for PostgresStore.append,
with one writer process and with eight. synchronous_commit as the server has it (on).
"""
import sys, time, os, multiprocessing as mp
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import psycopg
from handoff.ledger import events as ev
from handoff.ledger.postgres import PostgresStore
from handoff.ledger.store import Actor
W = Actor("worker", "w")
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
URL = "postgresql://postgres@127.0.0.1:5432/handoff_bench"

def ours(run, n, q):
    with PostgresStore(URL, busy_timeout_s=60) as s:
        t = time.perf_counter()
        for i in range(n):
            s.append(run, [ev.HeartbeatRecorded()], actor=W)
        q.put(time.perf_counter() - t)

def raw(run, n, q):
    c = psycopg.connect(URL, autocommit=True)
    t = time.perf_counter()
    for i in range(n):
        c.execute("INSERT INTO rawt (run, payload) VALUES (%s, %s)", (run, b'{"type":"heartbeat_recorded"}'))
    q.put(time.perf_counter() - t)

def go(fn, procs, n):
    q = mp.Queue(); ps = [mp.Process(target=fn, args=(f"r{i}", n, q)) for i in range(procs)]
    t = time.perf_counter(); [p.start() for p in ps]; [p.join() for p in ps]
    return procs * n / (time.perf_counter() - t)

if __name__ == "__main__":
    a = psycopg.connect(ADMIN, autocommit=True)
    a.execute("DROP DATABASE IF EXISTS handoff_bench WITH (FORCE)"); a.execute("CREATE DATABASE handoff_bench")
    PostgresStore(URL).close()
    psycopg.connect(URL, autocommit=True).execute("CREATE TABLE rawt (id bigserial primary key, run text, payload bytea)")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print(f"raw single insert, 1 writer:   {go(raw, 1, n):8.0f} events/s")
    print(f"ours append,       1 writer:   {go(ours, 1, n):8.0f} events/s")
    print(f"raw single insert, 8 writers:  {go(raw, 8, n//2):8.0f} events/s")
    print(f"ours append,       8 writers:  {go(ours, 8, n//2):8.0f} events/s")
    a.execute("DROP DATABASE IF EXISTS handoff_bench WITH (FORCE)")
