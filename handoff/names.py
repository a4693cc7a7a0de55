"""The names an actor, a run and a lease are given: who is acting (``operator_name``,
``login_name``), a new run's id (``new_run_id``, ``keyed_id``), the lease token a worker
passed (``lease_token``) and which recorded actors a filter means (``actor_filter``).

The checks of the values themselves are handoff/ledger/inputs.py's.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

from handoff.ledger.errors import InvalidInput
from handoff.ledger.store import LeaseToken


def actor_filter(actors: tuple[str, ...] | list[str]) -> Callable[[str], bool]:
    """Whether a recorded actor (``kind:name``) is one of ``actors``: each given as
    ``kind:name``, or as a name alone (any kind). No actors: every actor matches."""
    exact = {a for a in actors if ":" in a}
    names = {a for a in actors if ":" not in a}
    if not actors:
        return lambda actor: True
    return lambda actor: actor in exact or actor.partition(":")[2] in names


def lease_token(value: object, field: str = "lease") -> LeaseToken:
    """The lease token a worker passed, or InvalidInput (a bare lease number is not one)."""
    return LeaseToken.parse(value, field)


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
