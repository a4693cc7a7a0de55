"""The whole lifecycle as data: every rule that affects a transition lives in this file.

Theory of operation. A run opens in ``queued``. A worker that holds the lease moves it
through planning, executing and verifying, and submits a result; the owner reviews (if
the contract asks for review) and delivers it once to the recorded target, which ends
the run in ``delivered``. ``blocked`` and ``unknown`` are detours: a named blocker, or a
side effect whose outcome must be reconciled before anything is retried. ``no_op``,
``cancelled`` and ``failed`` end a run without delivery. Terminal states absorb: after
one, only read-only observation is accepted.

``decide`` consults these tables and nothing else, and docs/lifecycle.md's diagram is
generated from ``MOVES`` (a test fails when it is stale).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from msgspec import UNSET, UnsetType

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput

QUEUED = "queued"
PLANNING = "planning"
EXECUTING = "executing"
VERIFYING = "verifying"
BLOCKED = "blocked"
UNKNOWN = "unknown"
READY_FOR_REVIEW = "ready_for_review"
SUCCEEDED = "succeeded"
DELIVERED = "delivered"
NO_OP = "no_op"
CANCELLED = "cancelled"
FAILED = "failed"

STATES = (
    QUEUED, PLANNING, EXECUTING, VERIFYING, BLOCKED, UNKNOWN,
    READY_FOR_REVIEW, SUCCEEDED, DELIVERED, NO_OP, CANCELLED, FAILED,
)
#: How ``close`` may end a run (without delivery); with ``delivered``, the terminal states.
CLOSE_DISPOSITIONS = (NO_OP, CANCELLED, FAILED)
TERMINAL = frozenset({DELIVERED, *CLOSE_DISPOSITIONS})
#: States in which a worker is doing the work (and heartbeats and progress are expected).
WORKING = frozenset({PLANNING, EXECUTING, VERIFYING})
#: States from which ``block`` may be raised and to which ``unblock`` returns.
BLOCKABLE = frozenset({QUEUED, PLANNING, EXECUTING, VERIFYING, UNKNOWN, READY_FOR_REVIEW, SUCCEEDED})

_CLOSE = ("close",)

#: (from, to) -> the commands that may cause that move. Nothing else moves a run.
MOVES: dict[tuple[str, str], tuple[str, ...]] = {
    (QUEUED, PLANNING): ("transition",),
    (PLANNING, EXECUTING): ("transition",),
    (EXECUTING, PLANNING): ("transition",),
    (EXECUTING, VERIFYING): ("transition",),
    (VERIFYING, EXECUTING): ("transition",),
    (UNKNOWN, EXECUTING): ("transition",),
    (UNKNOWN, VERIFYING): ("transition",),
    (VERIFYING, READY_FOR_REVIEW): ("submit",),
    (VERIFYING, SUCCEEDED): ("submit",),
    (READY_FOR_REVIEW, SUCCEEDED): ("review",),
    (READY_FOR_REVIEW, EXECUTING): ("review",),
    (SUCCEEDED, DELIVERED): ("delivered",),
    # A result the sanitization gate refused: the owner sends it back for a worker to fix.
    (SUCCEEDED, VERIFYING): ("reopen",),
    # A worker that leaves (revoked, recovered from, or releasing) with a side effect
    # still unconfirmed leaves the run in unknown until someone reconciles it.
    (PLANNING, UNKNOWN): ("release", "revoke", "recover"),
    (EXECUTING, UNKNOWN): ("release", "revoke", "recover"),
    (VERIFYING, UNKNOWN): ("release", "revoke", "recover"),
}
for _s in BLOCKABLE:
    MOVES[(_s, BLOCKED)] = ("block", "recover")
    MOVES[(BLOCKED, _s)] = ("unblock",)
for _s in STATES:
    if _s not in TERMINAL:
        for _t in CLOSE_DISPOSITIONS:
            MOVES[(_s, _t)] = _CLOSE

#: Progress that counts in each state (seed 003's table). Recording one of these
#: advances progress_seq; the watchdog judges advancement by that sequence alone.
PROGRESS_KINDS: dict[str, frozenset[str]] = {
    PLANNING: frozenset({"plan_committed"}),
    EXECUTING: frozenset({"tool_outcome", "child_result", "diff_validated"}),
    VERIFYING: frozenset({"verifier_result"}),
    # In blocked and unknown, progress is a command of its own: saving a blocker with its
    # next action, and recording a reconciliation. These kinds name those events.
    BLOCKED: frozenset({"blocker_recorded"}),
    UNKNOWN: frozenset({"reconciliation_recorded"}),
}
#: Activity that may be logged in any working state but never counts as progress.
NOT_PROGRESS = frozenset(
    {"token_callback", "tool_retry", "tool_requested", "verifier_heartbeat", "waiting", "note", "worker_restart"}
)
ALL_PROGRESS_KINDS = frozenset().union(*PROGRESS_KINDS.values())
#: States whose progress a contract may extend with kinds of its own (``progress_kinds``,
#: fixed at open): the working states. Blocked and unknown have their own commands.
DECLARABLE = WORKING


def progress_kinds_in(state: str, declared: dict[str, tuple[str, ...]]) -> frozenset[str]:
    """What counts as progress in ``state`` for a run whose contract declared ``declared``:
    the table's kinds, plus the contract's own for a working state."""
    own = declared.get(state, ()) if state in DECLARABLE else ()
    return PROGRESS_KINDS.get(state, frozenset()) | frozenset(own)


def progress_command_kinds(declared: dict[str, tuple[str, ...]]) -> frozenset[str]:
    """Every kind the progress command takes in some state: the activity that never
    counts, and the working states' progress (the contract's own included). Blocked's and
    unknown's progress are commands of their own (block, effect-confirm)."""
    return NOT_PROGRESS.union(*(progress_kinds_in(s, declared) for s in WORKING))


def states_of_kind(kind: str, declared: dict[str, tuple[str, ...]]) -> list[str]:
    """The states in which ``kind`` counts as progress for such a run, in lifecycle order."""
    return [s for s in STATES if kind in progress_kinds_in(s, declared)]


#: The bounds of a contract's own progress kinds (``progress_kinds``).
MAX_DECLARED_KINDS = 32
KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def check_progress_kinds(value: object, field: str = "progress_kinds") -> ev.DeclaredKinds | UnsetType:
    """A contract's own progress kinds by working state, checked when the run opens.

    Only new names: a built-in kind keeps the state the table gives it, and activity that
    never counts (``note``, ``waiting``, ...) cannot be declared progress, so noise stays
    noise. The result lists states in lifecycle order, each state's kinds in the order
    given and once; none at all is ``UNSET``."""
    if value is UNSET or value is None:
        return UNSET
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field} must map working states to lists of kind names", field=field)
    declarable = ", ".join(s for s in STATES if s in DECLARABLE)
    out: dict[str, list[str]] = {}
    for state, kinds in value.items():
        if state not in DECLARABLE:
            raise InvalidInput(f"{field}: {str(state)[:60]!r} is not a working state; kinds may be declared "
                               f"for {declarable}", field=field)
        if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)):
            raise InvalidInput(f"{field}.{state} must be a list of kind names", field=field)
        own = out.setdefault(state, [])
        for kind in kinds:
            if not isinstance(kind, str) or not KIND_NAME.fullmatch(kind):
                raise InvalidInput(f"{field}.{state}: {repr(kind)[:80]} is not a kind name (a lowercase letter, "
                                   "then up to 63 lowercase letters, digits or _)", field=field)
            if kind in NOT_PROGRESS:
                raise InvalidInput(f"{field}.{state}: {kind} is activity that never counts as progress; it "
                                   "cannot be declared progress", field=field)
            if kind in ALL_PROGRESS_KINDS:
                where = ", ".join(s for s, ks in PROGRESS_KINDS.items() if kind in ks)
                raise InvalidInput(f"{field}.{state}: {kind} is a built-in progress kind (of {where}); declare "
                                   "a name of your own", field=field)
            if kind not in own:
                own.append(kind)
    total = sum(len(k) for k in out.values())
    if total > MAX_DECLARED_KINDS:
        raise InvalidInput(f"{field} declares {total} kinds, over the limit of {MAX_DECLARED_KINDS}", field=field)
    ordered = {s: tuple(out[s]) for s in STATES if out.get(s)}
    return ordered or UNSET


#: Event types whose arrival advances progress_seq. Heartbeats, leases, watchdog
#: observations, a side effect merely started and a delivery merely attempted do not.
ADVANCING_EVENTS = frozenset(
    {
        "state_changed", "artifact_recorded", "evidence_recorded", "blocker_raised",
        "blocker_cleared", "side_effect_confirmed", "reconciliation_recorded",
        "result_submitted", "review_decided", "delivery_confirmed", "delivery_failed",
    }
)

WORKER, OWNER, WATCHDOG, OPERATOR = "worker", "owner", "watchdog", "operator"

#: Who may move progress_seq: the people and workers doing or deciding the work. The
#: watchdog never does, whatever it records (observations, decisions, and what a decision
#: forces: a revoked lease's move to unknown, a pause's blocker and move to blocked). It
#: judges progress; if its own acts counted, the stall clock would restart at the watchdog's
#: decision instead of the work's last step, and the same stall would get a new key.
PROGRESS_ACTORS = frozenset({WORKER, OWNER, OPERATOR})
#: The commands that can end a lease (``recover`` by its revoke_lease). A move only they
#: make (into unknown, when the worker leaves a side effect unconfirmed) records that a
#: worker is gone, not that the work moved.
LEASE_ENDS = frozenset({"release", "revoke", "recover"})
LEASE_END_MOVES = frozenset(move for move, vias in MOVES.items() if set(vias) <= LEASE_ENDS)


def advances(tag: str, actor_kind: str, move: tuple[str, str] | None = None) -> bool:
    """Whether an event of type ``tag`` recorded by an actor of ``actor_kind`` advances
    progress_seq. ``move`` is a state change's (from, to). A ``progress_recorded`` event
    counts only with its own ``advances`` flag, which its caller checks as well."""
    if actor_kind not in PROGRESS_ACTORS:
        return False
    if tag == "progress_recorded":
        return True
    return tag in ADVANCING_EVENTS and not (move is not None and move in LEASE_END_MOVES)

#: Who may issue each command. "lease" means a worker holding the current lease;
#: "owner" means the contract's owner by name, or whoever it transferred the action to.
PERMISSIONS: dict[str, frozenset[str]] = {
    "open": frozenset({OWNER, OPERATOR}),
    "claim": frozenset({WORKER}),
    "heartbeat": frozenset({"lease"}),
    "transition": frozenset({"lease"}),
    "progress": frozenset({"lease"}),
    "artifact": frozenset({"lease"}),
    "evidence": frozenset({"lease", OWNER, OPERATOR}),
    "block": frozenset({"lease", OWNER, OPERATOR}),
    "unblock": frozenset({"lease", OWNER, OPERATOR}),
    "effect_start": frozenset({"lease"}),
    "effect_confirm": frozenset({"lease", OWNER, OPERATOR}),
    "submit": frozenset({"lease"}),
    "release": frozenset({"lease"}),
    "revoke": frozenset({OWNER, WATCHDOG, OPERATOR}),
    "transfer": frozenset({OWNER, OPERATOR}),
    "review": frozenset({OWNER, OPERATOR}),
    "deliver": frozenset({OWNER, OPERATOR}),
    "delivered": frozenset({OWNER, OPERATOR}),
    "delivery_failed": frozenset({OWNER, OPERATOR}),
    "delivery_unanswered": frozenset({OWNER, OPERATOR}),
    "sanitize": frozenset({OWNER, OPERATOR}),
    "close": frozenset({OWNER, OPERATOR}),
    "fork": frozenset({OWNER, OPERATOR}),
    "observe": frozenset({WATCHDOG, OPERATOR}),
    "recover": frozenset({WATCHDOG, OPERATOR}),
    "withdraw_artifact": frozenset({"lease", OWNER, OPERATOR}),
    "reopen": frozenset({OWNER, OPERATOR}),
    # A graph framework's saver: the lease holder, or without a lease the owner (one writer
    # by convention) or an operator. Erasing values is also accepted after the end.
    "save_graph_checkpoint": frozenset({"lease", OWNER, OPERATOR}),
    "save_graph_writes": frozenset({"lease", OWNER, OPERATOR}),
    "erase_values": frozenset({"lease", OWNER, OPERATOR}),
}
#: Owner actions that a transfer of authority can hand to another named actor.
TRANSFERABLE = frozenset({"review", "deliver", "delivered", "delivery_failed", "close"})
#: Commands that come with a transferred action: whoever may deliver may also check what
#: it sends and record a send that went unanswered.
COMES_WITH = {"sanitize": "deliver", "delivery_unanswered": "deliver"}
#: Commands accepted on a terminal run (read-only observation only).
READ_ONLY = frozenset({"observe"})
#: Commands accepted on a terminal run besides observation: erasing stored values (a
#: retention rule or a user's deletion request outlives the run; the log keeps the record).
AFTER_END = frozenset({"erase_values"})
#: The progress kind a graph's step counts as, when the contract declares it (a saved
#: checkpoint whose metadata says ``source: loop`` finished a step of the graph).
GRAPH_STEP = "graph_step"

#: States in which a recorded artifact may be withdrawn. Not once a result is submitted
#: (ready_for_review, succeeded): the result names its artifacts, and what it points at
#: must stay what was reviewed and delivered; a rejected review reopens the run. Not in
#: terminal states, which absorb everything but observation.
WITHDRAWABLE = frozenset({QUEUED, PLANNING, EXECUTING, VERIFYING, BLOCKED, UNKNOWN})

#: Recovery actions the watchdog may choose from; all are bounded and reversible by a person.
RECOVERY_ACTIONS = frozenset({"revoke_lease", "mark_stalled", "pause", "reconcile", "reconcile_delivery"})


def allowed_targets(state: str, via: str | None = None) -> list[str]:
    return sorted(t for (f, t), vias in MOVES.items() if f == state and (via is None or via in vias))


def can_move(state: str, to: str, via: str) -> bool:
    return via in MOVES.get((state, to), ())


def mermaid() -> str:
    """The state diagram, generated from MOVES, for docs/lifecycle.md."""
    lines = ["stateDiagram-v2", f"    [*] --> {QUEUED}: open"]
    grouped: dict[tuple[str, str], set[str]] = {}
    for (f, t), vias in sorted(MOVES.items()):
        if vias == _CLOSE:
            continue
        grouped.setdefault((f, t), set()).update(vias)
    for (f, t), vias in sorted(grouped.items()):
        lines.append(f"    {f} --> {t}: {' / '.join(sorted(vias))}")
    lines.append("    note right of queued: any non-terminal state --> no_op / cancelled / failed (close)")
    for t in sorted(TERMINAL):
        lines.append(f"    {t} --> [*]")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    # docs/lifecycle.md's diagram, from any directory: python -m handoff.reducers.transitions
    print(mermaid(), end="")
