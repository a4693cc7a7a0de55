"""Who may issue which command: the one authority policy, as a table and its check.

The facts are transitions.py's (``PERMISSIONS``, ``TRANSFERABLE``, ``COMES_WITH``), next
to the moves they guard; ``RULES`` reads them into one row per command, so a surface that
must know who may call a verb (a CLI, an MCP role, a web action) reads the same row that
``check`` enforces instead of restating it. Pure: the run's fold and the actor only.
"""

from __future__ import annotations

import msgspec

from handoff.ledger import inputs
from handoff.ledger.errors import NotAuthorized, StaleLease
from handoff.ledger.store import Actor

from . import commands as C
from . import transitions as T
from .checkpoint import Checkpoint


class Rule(msgspec.Struct, frozen=True):
    """Who may issue one command.

    ``kinds``: the actor kinds that may (``owner`` means the contract's owner by name);
    ``lease``: a worker may, holding the run's current lease and naming it; ``carried_by``:
    the owner action whose transfer ('handoff transfer') also grants this command."""

    command: str
    kinds: frozenset[str]
    lease: bool
    carried_by: str | None

    @property
    def who(self) -> str:
        """The row in words, as a refusal names it."""
        allowed = sorted(self.kinds | ({"lease"} if self.lease else set()))
        return " or ".join("a worker holding the lease" if p == "lease" else f"the {p}" for p in allowed)


def _rule(command: str, allowed: frozenset[str]) -> Rule:
    granted = T.COMES_WITH.get(command, command)
    return Rule(command=command, kinds=allowed - {"lease"}, lease="lease" in allowed,
                carried_by=granted if granted in T.TRANSFERABLE else None)


#: One row per command, by its name (commands.name_of).
RULES: dict[str, Rule] = {command: _rule(command, allowed) for command, allowed in T.PERMISSIONS.items()}


def check(cp: Checkpoint, name: str, cmd: C.Command, actor: Actor) -> None:
    """Refuse (NotAuthorized, StaleLease) unless ``actor`` may issue command ``name`` on
    ``cp``'s run. A worker's lease is checked first: a stale one proves nothing else."""
    rule = RULES[name]
    lease = getattr(cmd, "lease", None)
    if lease is not None:
        inputs.count("lease", lease, low=1)
    if actor.kind == T.WORKER and rule.lease:
        if lease is None:
            raise NotAuthorized(f"a worker must pass its lease to {name} run {cp.run_id}", field="lease")
        if cp.lease != lease:
            raise StaleLease.superseded(cp.run_id, lease, cp.lease, cp.worker, cp.max_lease)
        return
    if actor.kind in rule.kinds and actor.kind != T.OWNER:
        return
    transferred = rule.carried_by is not None and cp.may(rule.carried_by, actor.name)
    if actor.kind == T.OWNER and T.OWNER in rule.kinds:
        if name == "open" or actor.name == cp.owner or transferred:
            return
        raise NotAuthorized(
            f"{actor.name} is not the owner of run {cp.run_id} (the owner is {cp.owner}); "
            f"only the owner, an operator, or someone the owner transferred '{name}' to may do it"
        )
    if transferred:
        return
    extra = (" Review, delivery and closing belong to the owner unless it transfers them "
             "('handoff transfer')." if rule.carried_by is not None else "")
    raise NotAuthorized(f"a {actor.kind} ({actor.name}) may not {name} run {cp.run_id}; only {rule.who} may.{extra}")


def authorize(cp: Checkpoint, cmd: C.Command, actor: Actor) -> None:
    """Refuse (NotAuthorized, StaleLease) if ``actor`` may not issue ``cmd`` on ``cp``'s run:
    the same check decide makes, for a caller that must know before it acts outside (a
    send whose outcome it will have to record)."""
    check(cp, C.name_of(cmd), cmd, actor)
