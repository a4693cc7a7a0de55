"""The fault tests' fixtures, reused here: started processes killed after the test, the
evidence collector, and per-worker PostgreSQL proxies (tests/faults/)."""

from tests.faults.conftest import evidence, procs  # noqa: F401 - fixtures
from tests.faults.pg.conftest import proxies  # noqa: F401 - the fixture
