"""The table of operations: every verb a run takes, once, and what each surface offers of it.

A row says what a verb is called, which command it issues (its authority row is
``reducers.authority.RULES[command]``: who may call it), whether it needs a lease, its
parameters with their types and ONE description each, what it returns, and which surfaces
offer it: the ``Ledger`` facade and ``AsyncLedger``, the lease handles (``Lease``,
``AsyncLease``), the CLI and the MCP server's roles.

The surfaces are built from these rows or checked against them:

- ``Ledger``'s table verbs, the lease handles' verbs and ``AsyncLedger``'s calls are
  generated Python (``python -m handoff.operations --write`` rewrites the regions marked
  ``generated from handoff/operations.py`` in handoff/verbs.py, handoff/lease.py and
  handoff/aio.py), so a reader and a type checker see plain methods;
  tests/test_operations.py proves the generated code is current.
- The CLI's commands for table verbs are built from the rows at import (handoff/clitable.py),
  their help from the descriptions here.
- The MCP server's tools take their descriptions from here, and the roles that offer a
  tool from ``mcp``; tests/test_operations.py fails when a surface lacks a verb or a
  parameter a row lists, or has one no row lists.

Adding a verb: its rule (reducers: the command, its handler, its row in
``transitions.PERMISSIONS``), its row here, its test; then ``--write``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

from handoff.reducers.transitions import CLOSE_DISPOSITIONS, TRANSFERABLE

#: How a verb names who acts. ``worker``: a lease token proves it (``lease`` required);
#: ``lease_or_person``: the lease's worker when a token is given, else the person ``by``
#: names (or ``actor``); ``owner``: the person ``by`` names, as the owner (or an operator
#: with ``as_operator``); ``person``: the run's owner when ``by`` names it, else an operator;
#: ``watchdog``: the watcher ``watcher`` names; ``custom``: the verb's own code says.
Caller = Literal["worker", "lease_or_person", "owner", "person", "watchdog", "custom"]
#: The roles an MCP server may be started with (handoff/integrations/mcp_server.py).
MCP_ROLES = ("auditor", "owner", "operator", "worker")

REQUIRED = "<required>"


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a verb, as every surface spells it.

    ``name`` is the Python keyword and, with dashes, the CLI option (``cli`` overrides it, or
    ``"argument"`` for a positional CLI argument, or ``""`` when the CLI does not take it);
    ``annotation`` and ``default`` are Python source text; ``positional``: before the ``*``
    in Python; ``field``: the command's field it fills (``""``: none, it names the actor or
    the key of the write); ``choices``: the values it takes."""

    name: str
    annotation: str
    help: str
    default: str = REQUIRED
    positional: bool = False
    field: str | None = None
    cli: str | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    @property
    def required(self) -> bool:
        return self.default == REQUIRED

    @property
    def command_field(self) -> str:
        return self.name if self.field is None else self.field

    @property
    def option(self) -> str:
        """How the CLI spells it: ``--name-with-dashes``, ``argument`` or ``""`` (not there)."""
        return ("--" + self.name.replace("_", "-")) if self.cli is None else self.cli


@dataclasses.dataclass(frozen=True)
class Operation:
    """One verb.

    ``command``: the tag of the command it issues (``reducers.commands``), whose authority
    row is ``RULES[command]``; ``caller``: how the actor is named (``Caller``); ``struct``:
    the command's class in ``reducers.commands``; ``built``: the Python method, the lease
    handle's method and the CLI command are generated from this row (else hand-written in
    handoff/ and checked against it); ``lease_verb``: the name the lease handles offer it
    under (None: not offered); ``cli``: the CLI command (None: not offered); ``said``: what
    the CLI prints after it, a format string over ``out`` (the Outcome) and the parameters;
    ``mcp``: the MCP roles that offer it as a tool; ``returns``: the Python return type;
    ``issues``: other commands the verb may issue (a send records its outcome);
    ``cli_built``: the CLI command is built from the row (else hand-written in cli.py and
    checked); ``cli_extra``: options the CLI command has beyond the row's parameters;
    ``cli_doc``: a renderer in handoff/render.py whose fields the CLI's ``--json`` adds
    (given the checkpoint after the write); ``reads``: for a verb that writes nothing (``command`` is ""), the pure function in
    reducers/ (``module.function``) that answers it from the run's checkpoint."""

    name: str
    command: str
    struct: str
    caller: Caller
    summary: str
    params: tuple[Param, ...]
    details: str = ""
    example: str = ""
    returns: str = "Outcome"
    built: bool = True
    lease_verb: str | None = None
    cli: str | None = None
    said: str = "recorded"
    mcp: tuple[str, ...] = ()
    issues: tuple[str, ...] = ()
    cli_built: bool = True
    #: What the CLI prints instead of the generic "nothing to add" when the write was
    #: accepted and wrote no event (outcome ``unchanged``), a format string as ``said``.
    said_unchanged: str = ""
    cli_extra: tuple[str, ...] = ()
    reads: str = ""
    cli_doc: str = ""

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no parameter {name!r}")

    @property
    def doc(self) -> str:
        return self.summary + (f"\n\n{self.details}" if self.details else "")


# --- the parameters every verb spells the same way -------------------------------------

RUN_ID = Param("run_id", "str", "The run's id, as open printed it.", positional=True, field="", cli="argument",
               metavar="RUN")
LEASE = Param("lease", "str", "Your lease token, exactly as claim printed it (LEASE.SECRET); the lease number "
              "alone is refused.", positional=True, field="")
LEASE_OPTIONAL = Param("lease", "str | None", "Act as the worker holding this lease, given as the token claim "
                       "printed; without it you act as a person (by).", default="None", field="")
WORKER = Param("worker", "str | None", "The worker name the write is logged under (default: $HANDOFF_WORKER, "
               "else the name the lease was granted to).", default="None", field="", cli="")
BY = Param("by", "str | None", "Who acts without a lease (default: $HANDOFF_ACTOR, else your login name).",
           default="None", field="")
BY_OWNER = Param("by", "str", "The owner's name (or the operator's, with as_operator; or the name the owner "
                 "transferred this action to).", field="")
BY_DELIVERY = Param("by", "str | None", "The owner's name, or the name the owner transferred delivery to "
                    "(default: the run's owner).", default="None", field="")
ACTOR = Param("actor", "Actor | None", "The actor the write is logged as, when neither the lease nor by says "
              "it (an integration's own actor).", default="None", field="", cli="")
AS_OPERATOR = Param("as_operator", "bool", "Act as an operator rather than the owner.", default="False",
                    field="")
WATCHER = Param("watcher", "str", "The watchdog's name.", field="")
KEY = Param("key", "str | None", "Idempotency key: repeating the same command with it writes nothing new; "
            "the same key with other fields is refused.", default="None", field="")
ATTRS = Param("attrs", "Mapping[str, Any] | None", "A few facts about the step (model, tokens, cost, tool, "
              "trace and span ids) as name: text, number or bool.", default="None", cli="--attr")
EFFECT_KEY = Param("effect_key", "str", "The side effect's own key, unique within the run.", positional=True,
                   field="key")
DELIVERY_KEY = Param("delivery_key", "str", "The delivery's key: retrying the same key sends nothing twice.",
                     positional=True, field="key")


def _p(name: str, annotation: str, help: str, **kw: object) -> Param:
    return Param(name, annotation, help, **kw)  # type: ignore[arg-type]


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "heartbeat", "heartbeat", "Heartbeat", "worker",
        "Say the lease holder is alive. Heartbeats are liveness, never progress.",
        (RUN_ID, LEASE, ATTRS, WORKER),
        details="Most beats write no event: the run's liveness, kept beside the log, moves (outcome "
                "unchanged). The log records a beat that ends a silence longer than half the heartbeat "
                "timeout, carries other attrs than the last, or is the first in 15 minutes. "
                "It takes no key: a heartbeat changes no authority, and a repeated one only says again "
                "that the holder is alive, which is what a retry means.",
        example="handoff heartbeat $RUN --lease $LEASE",
        built=False, lease_verb="heartbeat", cli="heartbeat", said="heartbeat recorded",
        said_unchanged="heartbeat kept beside the log (no event written; last event seq {out.result.last_seq}; "
                       "state {out.checkpoint.state})",
        cli_doc="beat_doc", mcp=("worker",)),
    Operation(
        "transition", "transition", "Transition", "worker",
        "Move the run through its lifecycle (queued -> planning -> executing -> verifying).",
        (RUN_ID, LEASE,
         _p("to", "str", "The state to move to: planning, executing or verifying (see docs/lifecycle.md).",
            positional=True, metavar="STATE"),
         _p("reason", "str", "Why.", default='""'), KEY, WORKER),
        example="handoff transition $RUN --lease $LEASE --to executing",
        lease_verb="transition", cli="transition", said="moved to {out.checkpoint.state}", mcp=("worker",)),
    Operation(
        "progress", "progress", "Progress", "worker",
        "Record a step. Only the state's progress kinds advance progress_seq.",
        (RUN_ID, LEASE,
         _p("kind", "str", "The step's kind: plan_committed, tool_outcome, child_result, diff_validated, verifier_result, or a "
            "kind the contract declared (progress_kinds at open); or a non-progress kind such as note, "
            "tool_retry, waiting.", positional=True),
         _p("detail", "str", "What happened.", default='""', positional=True), ATTRS, KEY, WORKER),
        details="With a key, a retried report writes nothing new.",
        example='handoff progress $RUN --lease $LEASE --kind tool_outcome --detail "tests pass" --key step-7',
        lease_verb="progress", cli="progress", said="{kind} recorded, progress_seq {out.checkpoint.progress_seq}",
        mcp=("worker",)),
    Operation(
        "artifact", "artifact", "RecordArtifact", "worker",
        "Measure a file (regular files only, at most max_bytes) and record it as an artifact.",
        (RUN_ID, LEASE,
         _p("path", "str", "The file to record; measured (size, sha256) by the ledger, never taken on "
            "the worker's word.", positional=True, field="", cli="argument", metavar="PATH"),
         _p("kind", "str", "What the file is (result, log, diff...).", default='"result"'),
         _p("root", "str | None", "The directory the file must lie under.", default="None", field=""),
         _p("max_bytes", "int | str | None", "The largest file measured (a size such as 64M).",
            default="None", field="", metavar="SIZE"),
         ATTRS, KEY, WORKER),
        built=False, lease_verb="artifact", cli="artifact", cli_built=False, mcp=("worker",)),
    Operation(
        "withdraw_artifact", "withdraw_artifact", "WithdrawArtifact", "lease_or_person",
        "Take back a recorded artifact so it no longer counts for submit; the file is not touched.",
        (RUN_ID,
         _p("path", "str", "The artifact's path as recorded (else resolved as artifact resolved it).",
            positional=True, cli="argument", metavar="PATH"),
         _p("reason", "str", "Why it no longer counts (mistyped path, replaced by another file...).",
            positional=True),
         LEASE_OPTIONAL, BY, ACTOR, KEY, WORKER),
        built=False, cli="artifact-withdraw", cli_built=False, mcp=("worker",)),
    Operation(
        "evidence", "evidence", "RecordEvidence", "lease_or_person",
        "Record a check that was run and how it came out. Delivery needs a pass and no fail.",
        (RUN_ID,
         _p("kind", "str", "What was checked (tests, lint, review...).", positional=True),
         _p("outcome", "str", "How it came out.", positional=True, choices=("pass", "fail", "skipped")),
         _p("detail", "str", "What the check saw.", default='""', positional=True),
         ATTRS, LEASE_OPTIONAL, BY, ACTOR, KEY),
        example='handoff evidence $RUN --lease $LEASE --kind tests --outcome pass --detail "42 passed"',
        lease_verb="evidence", cli="evidence", said="evidence {kind}: {outcome}",
        mcp=("worker",)),
    Operation(
        "block", "block", "Block", "lease_or_person",
        "Record a named blocker and the next action; the run waits in 'blocked'.",
        (RUN_ID,
         _p("reason", "str", "What the run cannot go on without.", positional=True),
         _p("next_action", "str", "What must happen to unblock it, and by whom.", positional=True),
         LEASE_OPTIONAL, BY, ACTOR, KEY),
        details="A blocked run is not a stall: the watchdog leaves it alone.",
        example='handoff block $RUN --reason "needs prod credentials" --next-action "alice grants read access"',
        lease_verb="block", cli="block", said="blocker #{out.checkpoint.blockers_raised} raised",
        mcp=("worker",)),
    Operation(
        "unblock", "unblock", "Unblock", "lease_or_person",
        "Clear blockers; the run returns to the state it was blocked from.",
        (RUN_ID,
         _p("resolution", "str", "How the blocker went away.", positional=True),
         _p("blocker_id", "int | None", "Clear only this blocker id (default: all).", default="None",
            cli="--blocker"),
         LEASE_OPTIONAL, BY, ACTOR, KEY),
        example='handoff unblock $RUN --resolution "read access granted"',
        lease_verb="unblock", cli="unblock", said="{out.checkpoint.blockers:?blocker cleared|unblocked}",
        mcp=("worker", "owner", "operator")),
    Operation(
        "effect_start", "effect_start", "StartEffect", "worker",
        "Record that an external side effect is about to start, before starting it.",
        (RUN_ID, LEASE, EFFECT_KEY,
         _p("what", "str", "What is about to happen outside (e.g. 'POST /deploy v42').", positional=True),
         ATTRS, WORKER),
        details="Until its outcome is confirmed, a lost worker leaves the run 'unknown' and the watchdog "
                "asks for reconciliation instead of a blind retry.",
        example='handoff effect-start $RUN --lease $LEASE --effect-key deploy-v42 --what "deploy v42 to staging"',
        cli="effect-start", said="side effect {effect_key} started", mcp=("worker",)),
    Operation(
        "effect_confirm", "effect_confirm", "ConfirmEffect", "lease_or_person",
        "Record a side effect's outcome: done, or absent (it did not happen).",
        (RUN_ID, EFFECT_KEY,
         _p("outcome", "str", "How it came out: done (it happened) or absent (it did not).", positional=True,
            choices=("done", "absent")),
         _p("note", "str", "How you know (for a reconciliation).", default='""'),
         ATTRS, LEASE_OPTIONAL, BY, ACTOR),
        details="A reconciliation after a lost worker: look at the world, then say what happened.",
        example="handoff effect-confirm $RUN --effect-key deploy-v42 --outcome done --note 'v42 is live'",
        lease_verb="confirm", cli="effect-confirm", said="side effect {effect_key}: {outcome}",
        mcp=("worker", "owner", "operator")),
    Operation(
        "submit", "submit", "Submit", "worker",
        "Submit the result: the run moves to review (or succeeds when the contract needs none).",
        (RUN_ID, LEASE, _p("summary", "str", "What was done, in a sentence or two.", default='""',
                           positional=True), KEY, WORKER),
        example='handoff submit $RUN --lease $LEASE --summary "fix merged on the branch"',
        lease_verb="submit", cli="submit", said="result submitted; now {out.checkpoint.state}", mcp=("worker",)),
    Operation(
        "release", "release", "Release", "worker",
        "Give the lease back: the run stays where it is, claimable by the next worker.",
        (RUN_ID, LEASE, _p("reason", "str", "Why.", default='""', positional=True), KEY, WORKER),
        example="handoff release $RUN --lease $LEASE --reason 'out of budget'",
        cli="release", said="lease {out.checkpoint.max_lease} released", mcp=("worker",)),
    Operation(
        "review", "review", "ReviewResult", "owner",
        "Approve or reject a submitted result.",
        (RUN_ID,
         _p("approve", "bool", "Approve (true) or reject (false); a rejection sends the run back to "
            "executing.", positional=True, cli="--approve/--reject"),
         _p("notes", "str", "What the reviewer saw.", default='""', positional=True), BY_OWNER, KEY),
        example='handoff review $RUN --by alice --approve --notes "numbers check out"',
        cli="review", said="{approve:?approved|rejected}", mcp=("owner",)),
    Operation(
        "transfer", "transfer", "TransferAuthority", "owner",
        "Hand one of the owner's actions (review, deliver, delivered, delivery_failed, close) to another name.",
        (RUN_ID,
         _p("action", "str", "The owner action handed on.", positional=True,
            choices=tuple(sorted(TRANSFERABLE))),
         _p("to", "str", "The name that may take it from now on.", positional=True),
         BY_OWNER, KEY),
        example="handoff transfer $RUN --action review --to bob --by alice",
        cli="transfer", said="{to} may now {action}", mcp=("owner",)),
    Operation(
        "revoke", "revoke", "Revoke", "person",
        "Take the lease away; the holder's next write is refused.",
        (RUN_ID, _p("reason", "str", "Why.", positional=True),
         _p("lease_number", "int | None", "Revoke only this lease (its number): a revoke aimed at it cannot "
            "take a newer one.", default="None", field="lease", metavar="N"),
         BY, ACTOR, KEY),
        details="Logged as the run's owner when by names it, else as an operator.",
        example="handoff revoke $RUN --reason 'worker is gone' --lease-number 3",
        cli="revoke", said="lease {out.checkpoint.max_lease} revoked", mcp=("owner", "operator")),
    Operation(
        "close_run", "close", "Close", "owner",
        "End a run that will not succeed: no_op, cancelled or failed.",
        (RUN_ID,
         _p("disposition", "str", "How the run ends.", positional=True, choices=CLOSE_DISPOSITIONS),
         _p("reason", "str", "Why.", default='""', positional=True), BY_OWNER, AS_OPERATOR, KEY),
        example="handoff close $RUN --disposition cancelled --reason 'superseded' --by alice",
        cli="close", said="closed as {disposition}", mcp=("owner", "operator")),
    Operation(
        "reopen", "reopen", "Reopen", "owner",
        "Send a succeeded run whose latest sanitization check failed back to verifying.",
        (RUN_ID, _p("reason", "str", "Why.", positional=True), BY_OWNER, AS_OPERATOR, KEY),
        details="The gate refuses such a result for delivery, and after submit nobody else can change it; "
                "this is the owner's way forward: a worker then withdraws what the check found, records "
                "the result again and submits it, and the new result is checked again.",
        example="handoff reopen $RUN --reason 'remove the leaked log' --by alice",
        cli="reopen", said="reopened; now {out.checkpoint.state}", mcp=("owner", "operator")),
    Operation(
        "deliver", "deliver", "Deliver", "owner",
        "Record a delivery attempt (and with send, send the result through the target's adapter).",
        (RUN_ID, DELIVERY_KEY,
         _p("send", "bool", "Send through the target's adapter instead of recording an attempt only.",
            default="False", field=""),
         _p("timeout_s", "float | None", "How long one send may take.", default="None", field="", cli="--timeout"),
         _p("retries", "int | None", "How many times a send that failed to connect is tried again.",
            default="None", field=""),
         _p("env", "Any", "The environment a bearer token is read from (default: os.environ).",
            default="None", field="", cli=""),
         BY_OWNER),
        returns="Any", built=False, cli="deliver", cli_built=False, mcp=("owner",)),
    Operation(
        "delivered", "delivered", "ConfirmDelivery", "owner",
        "Record that a delivery arrived, with its receipt.",
        (RUN_ID, DELIVERY_KEY, _p("receipt", "str", "What proves it arrived (a message id, a URL...).",
                                  positional=True), BY_DELIVERY),
        example="handoff delivered $RUN --delivery-key d1 --receipt 'PR #42 merged'",
        cli="delivered", said="delivery {delivery_key} confirmed", cli_doc="delivery_doc", mcp=("owner",)),
    Operation(
        "delivery_failed", "delivery_failed", "FailDelivery", "owner",
        "Record that a delivery failed; a new attempt takes a new key.",
        (RUN_ID, DELIVERY_KEY, _p("error", "str", "What went wrong.", positional=True), BY_DELIVERY),
        example="handoff delivery-failed $RUN --delivery-key d1 --error 'HTTP 502'",
        cli="delivery-failed", said="delivery {delivery_key} marked failed", cli_doc="delivery_doc", mcp=("owner",)),
    Operation(
        "observe", "observe", "Observe", "watchdog",
        "Record a watchdog's observation of a run (its classification and the progress it saw).",
        (RUN_ID, _p("classification", "str", "What the watchdog judged (alive, stalled...).", positional=True),
         _p("progress_seq", "int", "The progress_seq the judgement saw.", positional=True),
         WATCHER, _p("reason", "str", "Why.", default='""'),
         _p("interval_s", "float", "How often the watchdog looks (seconds).", default="0.0"), KEY),
        said="observed"),
    Operation(
        "recover", "recover", "Recover", "watchdog",
        "Record a watchdog's recovery action on a run, with the judgement behind it.",
        (RUN_ID, _p("action", "str", "The recovery action (revoke_lease, mark_stalled, pause, reconcile, "
                    "reconcile_delivery).", positional=True),
         _p("classification", "str", "What the watchdog judged.", positional=True),
         _p("progress_seq", "int", "The progress_seq the judgement saw.", positional=True),
         WATCHER, _p("reason", "str", "Why.", default='""'),
         _p("lease_number", "int | None", "The lease the judgement was about: a revocation aimed at it "
            "cannot take a newer one.", default="None", field="lease"), KEY),
        said="recovered"),
    Operation(
        "effect_outcome", "", "", "custom",
        "What the ledger knows of a side effect's key: settled (and how), pending, or none.",
        (RUN_ID, Param("effect_key", "str", "The side effect's own key, unique within the run.",
                       positional=True, field="")),
        details="A resumed step asks before it starts a side effect again: settled means skip it, "
                "pending means look at the world and confirm first, none means start it.",
        returns="dict[str, Any]", reads="effects.effect_outcome", lease_verb="effect_outcome"),
)

# --- verbs whose Python method is hand-written (they measure, send, draw or derive
# something first) and checked against their rows -----------------------------------------

OWNER_OPEN = Param("owner", "str", "Who owns the run: reviews, delivers, closes.")
CUSTOM: tuple[Operation, ...] = (
    Operation(
        "open", "open", "Open", "custom", "Write a run's contract; returns the run's id.",
        (Param("goal", "str", "What the run must achieve."),
         Param("target", "str", "Where the result is delivered (e.g. chat:#ops)."),
         OWNER_OPEN,
         Param("origin", "str", "Where the request came from.", default='""'),
         Param("run_id", "str | None", "Choose the run id (default: run-<time>-<random>; with a key, one "
               "derived from the key and the owner, so a retried open finds the run it made).",
               default="None", field=""),
         Param("result_path", "str | None", "The result file the run must produce (submit checks it was "
               "recorded).", default="None", cli="--result"),
         Param("stop_rules", "tuple[str, ...]", "Rules for when to stop.", default="()", cli="--stop-rule"),
         Param("require_review", "bool", "The owner must approve the result before delivery.", default="False"),
         Param("heartbeat_timeout_s", "float", "Seconds without a heartbeat before the worker is unavailable.",
               default="POLICY.heartbeat_timeout_s", field="", cli="--heartbeat-timeout"),
         Param("progress_timeout_s", "float", "Seconds without progress (heartbeats alone) before the run is "
               "stalled.", default="POLICY.progress_timeout_s", field="", cli="--progress-timeout"),
         Param("retry_budget", "int", "Stalled windows the watchdog tolerates before it pauses the run.",
               default="POLICY.retry_budget", field=""),
         Param("delivery_timeout_s", "float", "Seconds a delivery attempt may go without an outcome before it "
               "is ambiguous.", default="POLICY.delivery_timeout_s", field="", cli="--delivery-timeout"),
         Param("owner_cap", "int", "Most runs of this owner that may hold a lease at once.",
               default="POLICY.owner_cap", field=""),
         KEY, ACTOR,
         Param("public", "bool", "The target is visible to others: delivery is refused unless a "
               "sanitization check passed over exactly what is sent.", default="False"),
         Param("sanitize_patterns", "tuple[str, ...]", "Regular expressions of your own that must not reach "
               "the target, checked with the built-in detectors.", default="()", cli="--sanitize-pattern"),
         Param("send", "ev.SendPolicy | None", "How the ledger sends to an adapter target (timeout, retries, "
               "reference only, the token's variable).", default="None", cli=""),
         Param("progress_kinds", "Mapping[str, Any] | None", "Progress kinds of this run's own, by working "
               "state (executing: [llm_step]); fixed at open.", default="None", cli="--progress-kind")),
        returns="str", built=False, cli="open", cli_built=False, mcp=("owner",),
        cli_extra=("--contract", "--send-timeout", "--send-retries", "--send-reference", "--token-env")),
    Operation(
        "open_contract", "open", "Open", "custom",
        "Open a run from a contract given as JSON text, bytes, a dict or a HandoffContract.",
        (Param("contract", "Any", "The contract (handoff contract-schema prints its JSON Schema).",
               positional=True, field=""), KEY),
        returns="str", built=False),
    Operation(
        "claim", "claim", "Claim", "custom",
        "Take the run's lease and return its token (LEASE.SECRET), shown this once.",
        (RUN_ID, Param("worker", "str", "Your worker name.", positional=True, field=""), KEY),
        returns="LeaseToken", built=False, cli="claim", cli_built=False, mcp=("worker",)),
    Operation(
        "claim_outcome", "claim", "Claim", "custom", "claim, with the write it made.",
        (RUN_ID, Param("worker", "str", "Your worker name.", positional=True, field=""), KEY),
        returns="Claimed", built=False),
    Operation(
        "sanitize", "sanitize", "Sanitize", "custom",
        "Run the secret detectors over exactly what a delivery would send now, and record the check.",
        (RUN_ID, BY_OWNER),
        returns="dict[str, Any]", built=False, cli="sanitize", cli_built=False, mcp=("owner",)),
    Operation(
        "send_delivery", "deliver", "Deliver", "custom",
        "Send the result through the target's adapter and record the attempt, then the outcome.",
        (RUN_ID, DELIVERY_KEY, BY_OWNER,
         Param("timeout_s", "float | None", "How long one send may take.", default="None", field=""),
         Param("retries", "int | None", "How many times a send of unknown outcome is tried again.",
               default="None", field=""),
         Param("env", "Any", "The environment a bearer token is read from (default: os.environ).",
               default="None", field="", cli=""),
         Param("sleep", "Callable[[float], None]", "How to wait between tries.", default="time.sleep",
               field="", cli="")),
        returns="Sent", built=False, issues=("delivered", "delivery_failed", "delivery_unanswered")),
    Operation(
        "fork", "fork", "Fork", "custom",
        "Start a child run continuing this one as it stood at at_seq; returns the child's id.",
        (RUN_ID, Param("at_seq", "int", "The parent's seq to continue from.", positional=True, cli="--at"),
         Param("new_run_id", "str | None", "The new run's id.", default="None", field="", cli="--run-id"),
         BY, KEY, ACTOR),
        returns="str", built=False, cli="fork", cli_built=False, mcp=("owner", "operator")),
    Operation(
        "save_graph_checkpoint", "save_graph_checkpoint", "SaveGraphCheckpoint", "custom",
        "Save a graph framework's checkpoint (LangGraph's put), its values stored beside the log.",
        (RUN_ID, Param("thread_id", "str", "The graph thread."), Param("checkpoint_id", "str", "The graph checkpoint's id."),
         Param("checkpoint", "Mapping[str, Any]", "The graph checkpoint, its values by digest."),
         Param("metadata", "Mapping[str, Any]", "The graph checkpoint's metadata."),
         Param("values", "Mapping[str, str]", "Each channel's value digest."),
         Param("new_values", "Iterable[bytes]", "The values not stored yet.", default="()", field=""),
         Param("namespace", "str", "The graph namespace.", default='""'),
         Param("parent_id", "str", "The parent graph checkpoint's id.", default='""'),
         LEASE_OPTIONAL, ACTOR,
         Param("extends", "Mapping[str, str] | None", "Values stored as a tail of an earlier value.",
               default="None"),
         Param("bases", "Mapping[str, str] | None", "The stored values the tails continue.", default="None",
               field="")),
        built=False),
    Operation(
        "save_graph_writes", "save_graph_writes", "SaveGraphWrites", "custom",
        "Save a graph task's pending writes against a saved graph checkpoint (LangGraph's put_writes).",
        (RUN_ID, Param("thread_id", "str", "The graph thread."), Param("checkpoint_id", "str", "The graph checkpoint's id."),
         Param("task_id", "str", "The task."), Param("writes", "Iterable[tuple[int, str, bytes]]", "The writes."),
         Param("namespace", "str", "The graph namespace.", default='""'),
         Param("task_path", "str", "The task's path.", default='""'), LEASE_OPTIONAL, ACTOR),
        built=False),
    Operation(
        "erase_values", "erase_values", "EraseValues", "custom",
        "Erase values kept beside the log (and the graph checkpoints that name them); the events stay.",
        (RUN_ID, Param("reason", "str", "Why (a retention rule, a deletion request)."),
         Param("values", "Iterable[str]", "The digests to erase.", default="()"),
         Param("checkpoints", "Iterable[tuple[str, str]]", "Graph checkpoints (namespace, id) that go with them.",
               default="()"),
         Param("everything", "bool", "Everything saved so far.", default="False"),
         LEASE_OPTIONAL, ACTOR,
         Param("end_lease", "int | None", "End this lease in the same write (the owner or an operator erasing "
               "a leased thread).", default="None", field="")),
        built=False, issues=("revoke",)),
)

OPERATIONS = OPERATIONS + CUSTOM
BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}


def operation(name: str) -> Operation:
    return BY_NAME[name]


def help_of(name: str, param: str) -> str:
    """A parameter's one description, for a surface that states it (a CLI option, an MCP field)."""
    return BY_NAME[name].param(param).help


def lease_verbs() -> Iterator[Operation]:
    return (op for op in OPERATIONS if op.lease_verb is not None)
