"""The benchmarks' smoke run: every scenario still runs (CI's guard against rot).

It asserts only that they run and report, never a speed: speed is measured in
benchmarks/ and documented in docs/performance.md.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: What a PostgreSQL scenario may say instead of running, outside CI (under CI=true an
#: unreachable server stops the benchmark run itself, and this test fails on its exit).
PG_UNAVAILABLE = {"no server", "psycopg not installed"}


def test_every_benchmark_scenario_runs_in_its_quick_size(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--quiet", "--json", "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["mode"] == "quick"
    names = [s["scenario"] for s in report["scenarios"]]
    assert "append-single" in names and len(names) >= 5, names
    assert "pg-command-single" in names and "pg-round-trips" in names, names
    in_ci = os.environ.get("CI", "").lower() == "true"
    for scenario in report["scenarios"]:
        subject = scenario["sides"][0]
        on_server = scenario["area"] == "postgres" or scenario["scenario"].startswith("pg-")
        if on_server and not in_ci and subject["status"] in PG_UNAVAILABLE:
            continue
        # A missing optional peer is fine ("peer not installed"); our own side must run.
        assert subject["status"] == "ok", (scenario["scenario"], subject["error"])
        if scenario["scenario"] == "pg-command-single" and subject["status"] == "ok":
            # Where a command's time goes (docs/performance.md): every side says its CPU
            # per event, the client's and the server's.
            sides = {s["name"]: s for s in scenario["sides"]}
            for side in (subject, sides["raw psycopg"]):
                assert side["metrics"]["client_cpu_us"][0] > 0, side
                if _server_is_here():
                    assert side["metrics"]["server_cpu_us"][0] > 0, side


def _server_is_here() -> bool:
    """Whether the benchmarks' server runs on this machine (its backends' CPU is then
    readable in /proc): the address they resolve, on loopback or a local socket."""
    import urllib.parse

    from benchmarks.postgres_server import SERVER

    host = urllib.parse.urlsplit(SERVER).hostname
    return host in (None, "", "127.0.0.1", "localhost", "::1") or host.startswith("/")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


def _bench_without_server(tmp_path, ci: str):
    env = dict(os.environ, CI=ci,
               HANDOFF_BENCH_PG=f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres")
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--quiet", "--json", "--dir", str(tmp_path),
         "--only", "pg-command-single,pg-catch-up"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
    )


def test_without_a_server_the_postgres_scenarios_say_so_and_the_run_still_succeeds(tmp_path):
    done = _bench_without_server(tmp_path, ci="")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["machine"]["postgresql"]["error"] == "no server"
    for scenario in report["scenarios"]:
        assert [s["status"] for s in scenario["sides"]][:2] == ["no server", "no server"], scenario
        assert scenario["goal_met"] is None  # not measured, never judged


def test_under_ci_an_unreachable_server_fails_the_benchmark_run(tmp_path):
    done = _bench_without_server(tmp_path, ci="true")
    assert done.returncode != 0
    assert "CI=true" in done.stderr and "unreachable" in done.stderr, done.stderr[-2000:]
    assert done.stdout == ""  # no report that could pass for a run


def test_the_report_warns_when_the_server_does_not_flush_before_it_acknowledges():
    from benchmarks.postgres_server import describe_line, durable

    base = {"server": "postgresql://x@h/db", "server_version": "15", "synchronous_commit": "on",
            "fsync": "on", "wal_sync_method": "fdatasync", "full_page_writes": "on",
            "commit_delay": "0", "wal_level": "replica", "shared_buffers": "128MB",
            "max_connections": "100"}
    assert durable(base) and "warning" not in describe_line(base)
    assert durable(dict(base, synchronous_commit="local"))  # flushed here, not waited for replicas
    for unsafe in (dict(base, synchronous_commit="off"), dict(base, fsync="off")):
        assert not durable(unsafe)
        assert "warning: this server acknowledges commits before their WAL is flushed" in describe_line(unsafe)


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_a_saved_run_prints_the_same_report_as_the_run(tmp_path):
    """docs/performance.md's table is printed from a saved run (--from), so it can be
    regenerated without measuring again: it must be the table the run itself printed, for
    throughput rows (medians and min-max) and latency rows (median and p95) alike."""
    saved = tmp_path / "run.json"
    live = _bench("--quick", "--quiet", "--markdown", "--save", str(saved), "--dir", str(tmp_path),
                  "--only", "append-single,fold-100")
    assert live.returncode == 0, live.stderr[-2000:]
    assert "| append-single |" in live.stdout and "| fold-100 |" in live.stdout, live.stdout
    again = _bench("--from", str(saved), "--markdown")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout == live.stdout
    assert _bench("--from", str(saved)).stdout != live.stdout  # without --markdown: the plain table


def test_a_saved_run_that_cannot_be_read_is_refused_with_what_to_do(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text("{not json")
    for path in (bad, tmp_path / "missing.json"):
        done = _bench("--from", str(path))
        assert done.returncode != 0 and done.stdout == ""
        assert f"cannot read the saved benchmark run {path}" in done.stderr and "--save" in done.stderr
        assert "Traceback" not in done.stderr
