"""The state machine: random commands against a real ledger file and the ``Model``.

``LedgerMachine`` opens a ledger in a temporary directory, writes real artifact files
there, and issues every command both to the ledger and to the model, failing on the first
disagreement. Its built-in rules come in named groups (``RULE_GROUPS``); a subclass picks
and weights them with ``builtin_rules`` and weights its own with ``own_rule_weight``.
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    RULE_MARKER, Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, precondition, rule,
)

from handoff.facade import Ledger, measure
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.store import Actor, Recorded, lease_digest
from handoff.reducers import commands as C
from handoff.reducers import sanitize as sz
from handoff.reducers import transitions as T
from handoff.reducers.checkpoint import evolve, fold

from .model import COMPARED, Model, RunModel, model_value
from .strategies import KEYS, OPERATOR, OWNERS, PROGRESS_KINDS, STRANGER, TRANSFEREES, WATCHDOG, WORKERS, machine_secret

__all__ = ["FakeClock", "LedgerMachine", "RULE_GROUPS"]


class FakeClock:
    """A clock the ledger can call from several threads: one second later on every call."""

    def __init__(self, start_us: int = 1_700_000_000_000_000, step_us: int = 1_000_000) -> None:
        self._next = itertools.count(start_us, step_us)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return next(self._next)


#: The built-in rules by group. A subclass of LedgerMachine chooses which groups run, and
#: how often, with ``builtin_rules``; ``first_run`` and ``reviewed_run`` (which open the
#: two runs every example starts with) and the invariants always run.
RULE_GROUPS: dict[str, tuple[str, ...]] = {
    # more runs: any owner, with or without review and a result file; an owner at its cap;
    # text the ledger must refuse (a NUL, 20,000 characters, a second open of a run)
    "open": ("open_run", "crowd_the_owner", "bad_opens_and_texts"),
    # leases: claims (honest or in someone else's name), heartbeats, releases, revocations
    "lease": ("claim", "heartbeat", "release", "revoke"),
    # a worker's and a person's work on the run, with current, stale, forged or no lease
    "work": ("transition", "progress", "artifact", "withdraw_artifact", "evidence", "block", "unblock",
             "effect_start", "effect_confirm", "submit"),
    # the owner's part: review, transferring an action, delivery and its outcome
    "delivery": ("review", "transfer", "deliver", "delivered", "delivery_failed", "sanitize", "reopen"),
    # ends and new branches: close, fork
    "end": ("close", "fork"),
    # the watchdog's own records
    "watchdog": ("observe", "recover"),
    # honest progress: the next step a well-behaved worker and owner would take
    "sensible": ("take_sensible_steps", "take_more_sensible_steps"),
    # the failures the seeds ask to inject: a lease lost mid side effect, a result without
    # substance, a replaced worker that returns, two writers racing on two connections
    "faults": ("lose_lease_mid_effect", "submit_without_substance", "stale_worker_returns", "race"),
}


def _or_nothing(run_id: str | None) -> Any:
    return multiple() if run_id is None else run_id


def _weights(choice: Any, where: str) -> dict[str, int]:
    """``builtin_rules`` as group -> weight, refusing names and weights that mean nothing."""
    if isinstance(choice, str):
        raise TypeError(f"{where}.builtin_rules must be a collection of group names or a mapping "
                        f"group -> weight, not the string {choice!r}; write ({choice!r},)")
    pairs = dict(choice) if isinstance(choice, Mapping) else {name: 1 for name in choice}
    unknown = sorted(set(pairs) - set(RULE_GROUPS))
    if unknown:
        raise ValueError(f"{where}.builtin_rules names no such group: {', '.join(unknown)}; "
                         f"the groups are {', '.join(RULE_GROUPS)}")
    for name, weight in pairs.items():
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
            raise ValueError(f"{where}.builtin_rules[{name!r}] must be a whole number of 0 or more "
                             f"(0 turns the group off), not {weight!r}")
    return pairs


def _alias(name: str, copy_no: int) -> str:
    return f"{name}__x{copy_no}"


class LedgerMachine(RuleBasedStateMachine):
    """Random commands against a real ledger file and the plain-Python ``Model``.

    Every command goes through ``issue``: the model predicts it, the ledger runs it, and
    they must agree on the refusal type or on the exact events appended; a refusal must
    leave the log byte-for-byte unchanged. Invariants after every step compare the folds
    with the model and with each other. Subclass it to add your own rules.

    Choosing rules: ``builtin_rules`` names the groups of ``RULE_GROUPS`` that run (all of
    them by default), either as names or as a mapping name -> weight; ``()`` runs none, so
    only your rules (and the two initial opens) run. ``own_rule_weight`` lists each rule a
    subclass defines that many times among the rules hypothesis picks from, so it is drawn
    that many times as often as a built-in rule of weight 1.
    """

    #: Groups of built-in rules that run: names, or name -> weight (0 turns a group off).
    builtin_rules: ClassVar[Collection[str] | Mapping[str, int]] = tuple(RULE_GROUPS)
    #: How many times each rule defined in a subclass is listed (1 or more).
    own_rule_weight: ClassVar[int] = 1

    runs = Bundle("runs")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        where = cls.__qualname__
        weights = _weights(cls.builtin_rules, where)
        own_weight = cls.own_rule_weight
        if not isinstance(own_weight, int) or isinstance(own_weight, bool) or own_weight < 1:
            raise ValueError(f"{where}.own_rule_weight must be a whole number of 1 or more, not {own_weight!r}")
        # Copies made for an ancestor's weights are cleared first, then made afresh.
        for name in getattr(cls, "_weight_copies", ()):
            setattr(cls, name, None)
        copies: list[str] = []
        own = {
            name: getattr(cls, name)
            for klass in cls.__mro__[: cls.__mro__.index(LedgerMachine)]
            for name, value in vars(klass).items()
            if getattr(value, RULE_MARKER, None) is not None and "__x" not in name
            and value is not vars(LedgerMachine).get(name)
        }
        for group, names in RULE_GROUPS.items():
            for name in names:
                builtin = vars(LedgerMachine)[name]
                plain = getattr(builtin, RULE_MARKER).function  # the method, without the rule
                if getattr(cls, name) not in (builtin, plain):
                    continue  # the subclass redefined it: its own rule (or method) now
                weight = weights.get(group, 0)
                # An unchosen rule stays callable as a method, so your rules can still use it.
                setattr(cls, name, builtin if weight else plain)
                copies += [_alias(name, n) for n in range(2, weight + 1)]
                for n in range(2, weight + 1):
                    setattr(cls, _alias(name, n), builtin)
        for name, value in own.items():
            copies += [_alias(name, n) for n in range(2, own_weight + 1)]
            for n in range(2, own_weight + 1):
                setattr(cls, _alias(name, n), value)
        cls._weight_copies = tuple(copies)

    def __init__(self) -> None:
        super().__init__()
        self.workdir = tempfile.mkdtemp(prefix="handoff-machine-")
        self.files = os.path.join(os.path.realpath(self.workdir), "files")
        os.makedirs(self.files)
        self.clock = FakeClock()
        self.ledger = self.make_ledger(os.path.join(self.workdir, "ledger.db"))
        self._other: Any = None
        self.model = Model()
        #: What this run of the machine saw: accepted commands and refusals, by name.
        self.accepted: dict[str, int] = {}
        self.refusals: dict[str, int] = {}
        self._opened = 0
        self._crowded = False
        #: (run, lease) -> the secret of the token its claim got; the ledger keeps a digest only.
        self.secrets: dict[tuple[str, int], str] = {}
        self._drawn = 0
        #: Set by ``worker_for(..., "forged")``: the next worker write shows a wrong secret.
        self._forge = False

    # --- hooks ---------------------------------------------------------------------

    def make_ledger(self, path: str) -> Any:
        """The ledger under test (override to test another configuration)."""
        return Ledger(path, synchronous="NORMAL", clock=self.clock)

    @property
    def other(self) -> Any:
        """A second Ledger on the same file, for racing writers."""
        if self._other is None:
            self._other = self.make_ledger(self.ledger.store.path)
        return self._other

    def teardown(self) -> None:
        for lg in (self.ledger, self._other):
            if lg is not None:
                lg.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- the one way commands are issued ---------------------------------------------

    def log(self) -> list[Recorded]:
        """Every event in the ledger, in global order (what a refusal must leave unchanged)."""
        return list(self.ledger.store.read_all())

    def token_for(self, run_id: str, actor: Actor, cmd: C.Command) -> tuple[str | None, bool | None]:
        """The lease token a worker shows with ``cmd``, and whether it proves the current
        lease: the real one its claim got, a forged one (after ``worker_for(..., "forged")``),
        or, for a lease the machine never saw granted, one with a made-up secret."""
        lease = getattr(cmd, "lease", None)
        forge, self._forge = self._forge, False
        if actor.kind != T.WORKER or lease is None:
            return None, None
        real = self.secrets.get((run_id, lease))
        if forge or real is None:
            # A replaced worker's own old secret is as good a forgery as a made-up one.
            olds = [v for (r, n), v in self.secrets.items() if r == run_id and n != lease]
            secret = olds[-1] if forge and olds else machine_secret(-1 - lease)
            return f"{lease}.{secret}", False
        m = self.model.runs.get(run_id)
        return f"{lease}.{real}", m is not None and m.lease == lease

    def issue(
        self, run_id: str, actor: Actor, cmd: C.Command, *, key: str | None = None,
        via: Callable[[], Any] | None = None, token: Any = None,
    ) -> Any:
        """Run one command on the model and the ledger and require them to agree.

        ``via`` calls a Ledger verb instead of ``Ledger.execute`` (for example
        ``artifact``, which measures the file itself); ``cmd`` must be what it sends.
        ``token`` is ``token_for``'s answer when the caller needed the token first (for
        ``via``); otherwise a worker's command gets its token here. A claim without a
        digest gets a fresh secret's, and the machine keeps the secret if it is granted.
        Returns the ledger's Outcome, or the LedgerError it raised.
        """
        secret = None
        if isinstance(cmd, C.Claim) and not cmd.token_digest:
            self._drawn += 1
            secret = machine_secret(self._drawn)
            cmd = C.Claim(worker=cmd.worker, token_digest=lease_digest(secret))
        shown, token_ok = token if token is not None else self.token_for(run_id, actor, cmd)
        expect = self.model.predict(run_id, actor, cmd, key, token_ok)
        before = self.log()
        was_terminal = run_id in self.model.runs and self.model.runs[run_id].terminal
        try:
            out = via() if via is not None else self.ledger.execute(run_id, cmd, actor=actor, key=key, token=shown)
        except E.LedgerError as exc:
            assert self.log() == before, f"refused {C.name_of(cmd)} ({exc.type}) changed the log"
            assert expect.error is not None, (
                f"{actor} {cmd!r} on {run_id}: ledger refused with {exc.type}: {exc.message}; "
                f"the model expected {expect.tags or 'a no-op'}"
            )
            assert type(exc) is expect.error, (
                f"{actor} {cmd!r} on {run_id}: ledger refused with {exc.type} ({exc.message}); "
                f"the model expected {expect.error.__name__} ({expect.why})"
            )
            assert exc.message.strip(), "a refusal must say why"
            tally = f"{C.name_of(cmd)}:{exc.type}"
            self.refusals[tally] = self.refusals.get(tally, 0) + 1
            return exc
        assert expect.error is None, (
            f"{actor} {cmd!r} on {run_id}: ledger accepted it ({out.result.outcome}); the model "
            f"expected {expect.error.__name__}: {expect.why}"
        )
        added = self.log()[len(before):]
        got = [r.type for r in added]
        want = [] if expect.duplicate or expect.unchanged else expect.tags
        assert got == want, f"{actor} {cmd!r} on {run_id}: appended {got}, the model expected {want}"
        assert out.result.outcome == expect.outcome, (
            f"{actor} {cmd!r} on {run_id}: outcome {out.result.outcome}, the model expected {expect.outcome}")
        # The store answers with its warm (cached, incrementally evolved) state: it must
        # equal a fresh fold from the log.
        assert out.checkpoint == self.ledger.checkpoint(run_id), f"{run_id}: warm state != fresh fold"
        if was_terminal:
            assert set(got) <= {"watchdog_observed"}, f"terminal run {run_id} accepted {got}"
        self.model.commit(run_id, expect)
        if secret is not None and got == ["lease_granted"]:
            self.secrets[(run_id, self.model.runs[run_id].lease)] = secret  # type: ignore[index]
        self.accepted[C.name_of(cmd)] = self.accepted.get(C.name_of(cmd), 0) + 1
        return out

    # --- choosing actors and leases relative to the model ------------------------------

    def worker_for(self, run_id: str, lease_pick: str) -> tuple[Actor, int | None]:
        """A worker actor and the lease it shows: the current one, an old one, or none;
        ``forged`` is the current number with a wrong secret (see ``token_for``)."""
        m = self.model.runs[run_id]
        name = m.worker or WORKERS[0]
        if lease_pick == "forged":
            self._forge = True
            lease_pick = "current"
        if lease_pick == "current":
            return Actor("worker", name), m.lease if m.lease is not None else max(m.max_lease, 1)
        if lease_pick == "stale":
            old = [x for x in range(1, m.max_lease + 1) if x != m.lease]
            return Actor("worker", name), (old[-1] if old else m.max_lease + 1)
        return Actor("worker", name), None

    def actor_for(self, run_id: str, whom: str, lease_pick: str = "current") -> tuple[Actor, int | None]:
        m = self.model.runs[run_id]
        if whom == "worker":
            return self.worker_for(run_id, lease_pick)
        return {
            "owner": Actor("owner", m.owner),
            "operator": OPERATOR,
            "watchdog": WATCHDOG,
            "stranger": STRANGER,
            "transferee_worker": Actor("worker", TRANSFEREES[0]),
            "transferee_person": Actor("owner", TRANSFEREES[1]),
        }[whom], None

    # --- rules -------------------------------------------------------------------------

    @initialize(target=runs)
    def first_run(self) -> Any:
        return _or_nothing(self.new_run("alice", require_review=False, with_result_path=True, cap=2))

    @initialize(target=runs)
    def reviewed_run(self) -> Any:
        return _or_nothing(self.new_run("alice", require_review=True, with_result_path=False, cap=2))

    @rule(target=runs, owner=st.sampled_from(OWNERS), require_review=st.booleans(),
          with_result_path=st.booleans(), cap=st.sampled_from([1, 2, 10]))
    def open_run(self, owner: str, require_review: bool, with_result_path: bool, cap: int) -> Any:
        return _or_nothing(self.new_run(owner, require_review=require_review, with_result_path=with_result_path,
                                        cap=cap))

    def fresh_run_id(self, parent: str | None = None) -> str:
        """A run id no run of this machine has: ``r<n>``, or ``<parent>.f<n>`` for a fork."""
        self._opened += 1
        return f"r{self._opened}" if parent is None else f"{parent}.f{self._opened}"

    def new_run(self, owner: str = "alice", *, require_review: bool = False, with_result_path: bool = True,
                cap: int = 10) -> str | None:
        """Open a run through ``issue`` and return its id (None if the ledger refused).

        ``with_result_path`` names a result file under ``self.files`` in the contract, which
        ``submit`` then requires; ``cap`` is the owner's concurrency cap (its policy).
        A rule that adds runs to the ``runs`` bundle returns the id, or ``multiple()``
        when it is None."""
        run_id = self.fresh_run_id()
        result = os.path.join(self.files, f"{run_id}-result.txt") if with_result_path else None
        cmd = C.Open(goal="produce the report", target="chat:#ops", owner=owner, result_path=result,
                     require_review=require_review, policy=ev.Policy(owner_cap=cap))
        out = self.issue(run_id, Actor("owner", owner), cmd)
        return None if isinstance(out, E.LedgerError) else run_id

    @rule(run=runs, what=st.sampled_from(["goal\x00", "goal\x9b2J", "go\u202elag", "x" * 20_000]))
    def bad_opens_and_texts(self, run: str, what: str) -> None:
        """Reopening a run, and text with a NUL, a C1 control, a bidi override or over the
        size limit: refused, nothing written."""
        m = self.model.runs[run]
        self.issue(run, Actor("owner", m.owner or "alice"), C.Open(goal="again", target="chat:#ops", owner="alice"))
        self.issue(run, WATCHDOG, C.Observe(classification="healthy", progress_seq=0, reason=what))
        self.issue("never-opened", Actor("owner", "alice"), C.Open(goal=what, target="chat:#ops", owner="alice"))
        self.issue("never-opened", WATCHDOG, C.Observe(classification="healthy", progress_seq=0))

    @precondition(lambda self: not self._crowded)
    @rule(target=runs, cap=st.sampled_from([1, 2]))
    def crowd_the_owner(self, cap: int) -> Any:
        """Seed 004's cap: an owner's runs under lease may not exceed its cap (counted by the ledger)."""
        self._crowded = True
        opened = []
        for _ in range(cap + 1):
            run = self.new_run("bob", require_review=False, with_result_path=False, cap=cap)
            if run is None:
                break
            opened.append(run)
            self.issue(run, Actor("worker", WORKERS[len(opened) % len(WORKERS)]),
                       C.Claim(worker=WORKERS[len(opened) % len(WORKERS)]))
        return multiple(*opened)

    @rule(run=runs, worker=st.sampled_from(WORKERS), honest=st.booleans())
    def claim(self, run: str, worker: str, honest: bool) -> None:
        actor = Actor("worker", worker if honest else "w-other")
        self.issue(run, actor, C.Claim(worker=worker))

    @rule(run=runs, lease_pick=st.sampled_from(["current", "current", "stale", "forged", "none"]))
    def heartbeat(self, run: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Heartbeat(lease=lease))  # type: ignore[arg-type]

    @rule(run=runs, to=st.sampled_from(T.STATES), lease_pick=st.sampled_from(["current", "current", "stale"]))
    def transition(self, run: str, to: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Transition(lease=lease, to=to))  # type: ignore[arg-type]

    @rule(run=runs, kind=PROGRESS_KINDS, lease_pick=st.sampled_from(["current", "current", "stale", "forged"]))
    def progress(self, run: str, kind: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Progress(lease=lease, kind=kind))  # type: ignore[arg-type]

    @rule(run=runs, which=st.sampled_from(["result", "result", "notes", "empty", "missing"]),
          lease_pick=st.sampled_from(["current", "current", "stale"]))
    def artifact(self, run: str, which: str, lease_pick: str) -> None:
        self.record_artifact(run, which, lease_pick)

    def record_artifact(self, run: str, which: str = "result", lease_pick: str = "current",
                        path: str | None = None) -> Any:
        """Write a real file under ``self.files`` and have the worker record it through
        ``Ledger.artifact``, which measures it. ``which``: ``result`` (the contract's result
        file when it names one), ``empty`` (a file of 0 bytes), ``missing`` (no file), or
        any other word (a small file named after it); ``path`` overrides where it goes."""
        m = self.model.runs[run]
        if path is None:
            path = m.result_path if which == "result" and m.result_path else os.path.join(self.files, f"{run}-{which}.txt")
        if which == "missing":
            if os.path.exists(path):
                os.unlink(path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write("" if which == "empty" else f"{which} of {run}\n")
        actor, lease = self.worker_for(run, lease_pick)
        real, size, sha, exists = measure(path)
        cmd = C.RecordArtifact(lease=lease, path=real, kind=which, bytes=size, sha256=sha, exists=exists)  # type: ignore[arg-type]
        shown = self.token_for(run, actor, cmd)
        return self.issue(run, actor, cmd, token=shown,
                          via=lambda: self.ledger.artifact(run, shown[0], path, kind=which, worker=actor.name))

    @rule(run=runs, which=st.sampled_from(["recorded", "recorded", "never"]),
          whom=st.sampled_from(["worker", "worker", "owner", "operator", "stranger", "watchdog"]),
          lease_pick=st.sampled_from(["current", "current", "stale", "none"]), reason=st.sampled_from(["typo", " "]))
    def withdraw_artifact(self, run: str, which: str, whom: str, lease_pick: str, reason: str) -> None:
        """Take back a recorded artifact (or one never recorded): only where and by whom the rules allow."""
        m = self.model.runs[run]
        paths = sorted(m.artifacts) if which == "recorded" else []
        path = paths[0] if paths else os.path.join(self.files, f"{run}-never.txt")
        actor, lease = self.worker_for(run, lease_pick) if whom == "worker" else self.actor_for(run, whom)
        self.issue(run, actor, C.WithdrawArtifact(path=path, reason=reason, lease=lease))

    @rule(run=runs, kind=st.sampled_from(["tests", "lint"]), outcome=st.sampled_from(["pass", "pass", "fail", "skipped"]),
          whom=st.sampled_from(["worker", "owner", "operator", "stranger"]))
    def evidence(self, run: str, kind: str, outcome: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.RecordEvidence(kind=kind, outcome=outcome, lease=lease))  # type: ignore[arg-type]

    @rule(run=runs, whom=st.sampled_from(["worker", "owner", "operator", "watchdog"]))
    def block(self, run: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.Block(reason="needs a credential", next_action="ask the owner", lease=lease))

    @rule(run=runs, which=st.sampled_from([None, 1, 2, 3]), whom=st.sampled_from(["worker", "owner", "operator"]))
    def unblock(self, run: str, which: int | None, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.Unblock(resolution="credential provided", blocker_id=which, lease=lease))

    @rule(run=runs, key=KEYS, what=st.sampled_from(["send mail", "open PR"]),
          lease_pick=st.sampled_from(["current", "current", "stale"]))
    def effect_start(self, run: str, key: str, what: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.StartEffect(lease=lease, key=key, what=what))  # type: ignore[arg-type]

    @rule(run=runs, key=KEYS, outcome=st.sampled_from(["done", "absent"]),
          whom=st.sampled_from(["worker", "owner", "operator", "watchdog"]))
    def effect_confirm(self, run: str, key: str, outcome: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.ConfirmEffect(key=key, outcome=outcome, lease=lease))  # type: ignore[arg-type]

    @rule(run=runs, lease_pick=st.sampled_from(["current", "current", "stale"]))
    def submit(self, run: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Submit(lease=lease, summary="done"))  # type: ignore[arg-type]

    @rule(run=runs, approve=st.booleans(),
          whom=st.sampled_from(["owner", "owner", "operator", "worker", "stranger", "transferee_worker", "transferee_person"]))
    def review(self, run: str, approve: bool, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        self.issue(run, actor, C.ReviewResult(approve=approve))

    @rule(run=runs, action=st.sampled_from(sorted(T.TRANSFERABLE) + ["publish"]), to=st.sampled_from(TRANSFEREES),
          whom=st.sampled_from(["owner", "operator", "worker"]))
    def transfer(self, run: str, action: str, to: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.TransferAuthority(action=action, to=to))

    @rule(run=runs, key=KEYS, whom=st.sampled_from(["owner", "owner", "operator", "worker", "transferee_worker"]))
    def deliver(self, run: str, key: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        # The same idempotency key Ledger.deliver uses, so a retried attempt is a no-op.
        self.issue(run, actor, C.Deliver(key=key), key=f"deliver:{key}")

    @rule(run=runs, key=KEYS, receipt=st.sampled_from(["msg-1", "msg-2"]),
          whom=st.sampled_from(["owner", "owner", "operator", "worker", "transferee_person"]))
    def delivered(self, run: str, key: str, receipt: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        self.issue(run, actor, C.ConfirmDelivery(key=key, receipt=receipt))

    @rule(run=runs, key=KEYS)
    def delivery_failed(self, run: str, key: str) -> None:
        m = self.model.runs[run]
        self.issue(run, Actor("owner", m.owner), C.FailDelivery(key=key, error="target returned 503"))

    @rule(run=runs, passed=st.booleans(), whom=st.sampled_from(["owner", "operator"]))
    def sanitize(self, run: str, passed: bool, whom: str) -> None:
        """A sanitization check as a caller's scan reports it: passing, or finding a key."""
        actor, _ = self.actor_for(run, whom)
        digest = "ab" * 32
        findings = () if passed else (ev.Finding(detector="aws_access_key", item="summary", line=1),)
        self.issue(run, actor, C.Sanitize(passed=passed, bundle_sha256=digest,
                                          items=(ev.ScannedItem(name="summary", sha256=digest, bytes=4),),
                                          findings=findings, rules_sha256=sz.rules_digest(())))

    @rule(run=runs, whom=st.sampled_from(["owner", "owner", "operator", "worker", "stranger", "watchdog"]),
          reason=st.sampled_from(["the report quotes a key; remove it", ""]))
    def reopen(self, run: str, whom: str, reason: str) -> None:
        """The owner sends back a succeeded result its check refused; refused otherwise."""
        actor, _ = self.actor_for(run, whom)
        self.issue(run, actor, C.Reopen(reason=reason))

    @rule(run=runs, lease_pick=st.sampled_from(["current", "stale", "forged"]))
    def release(self, run: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Release(lease=lease, reason="done for now"))  # type: ignore[arg-type]

    @rule(run=runs, whom=st.sampled_from(["owner", "watchdog", "operator", "worker"]),
          lease_pick=st.sampled_from(["current", "none", "stale"]))
    def revoke(self, run: str, whom: str, lease_pick: str) -> None:
        """A lost lease: the watchdog, owner or an operator takes the run away."""
        actor, _ = self.actor_for(run, whom)
        _, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Revoke(reason="heartbeat timeout", lease=lease))

    @rule(target=runs, run=consumes(runs), disposition=st.sampled_from(T.CLOSE_DISPOSITIONS),
          whom=st.sampled_from(["owner", "operator", "worker", "stranger", "transferee_person"]),
          keep=st.booleans())
    def close(self, run: str, disposition: str, whom: str, keep: bool) -> Any:
        """Close a run; an ended run stays in play only sometimes, so most steps go to live runs."""
        actor, _ = self.actor_for(run, whom)
        self.issue(run, actor, C.Close(disposition=disposition, reason="no longer needed"))  # type: ignore[arg-type]
        return run if keep or not self.model.runs[run].terminal else multiple()

    @rule(target=runs, parent=runs, pick=st.integers(0, 50), beyond=st.booleans(),
          whom=st.sampled_from(["operator", "owner"]))
    def fork(self, parent: str, pick: int, beyond: bool, whom: str) -> Any:
        bounds = sorted(self.model.snapshots[parent])
        at = bounds[-1] + 3 if beyond else bounds[pick % len(bounds)]
        child = self.fresh_run_id(parent)
        actor, _ = self.actor_for(parent, whom)
        out = self.issue(child, actor, C.Fork(parent=parent, at_seq=at))
        return multiple() if isinstance(out, E.LedgerError) else child

    # A classification outside stall.CLASSIFICATIONS (a watcher's own "alive", markup) is refused.
    @rule(run=runs, classification=st.sampled_from(["healthy", "stalled", "unavailable", "alive", 'x"><a href=y>']),
          whom=st.sampled_from(["watchdog", "operator", "owner"]))
    def observe(self, run: str, classification: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        seq = self.model.runs[run].progress_seq
        self.issue(run, actor, C.Observe(classification=classification, progress_seq=seq, interval_s=30.0))

    @rule(run=runs, action=st.sampled_from(sorted(T.RECOVERY_ACTIONS)), whom=st.sampled_from(["watchdog", "worker"]))
    def recover(self, run: str, action: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        seq = self.model.runs[run].progress_seq
        self.issue(run, actor, C.Recover(action=action, classification="stalled", progress_seq=seq))

    @rule(run=runs, pair=st.sampled_from(["close/close", "delivered/close", "deliver/deliver", "delivered/delivered"]))
    def race(self, run: str, pair: str) -> None:
        """Two writers on two connections at once: of two rival commands at most one wins."""
        # First bring the run to where both rivals stand a chance: an attempt waiting for
        # its outcome, or a result ready to send.
        if pair.startswith("delivered"):
            self.drive_until(run, lambda m: m.pending_delivery is not None)
        elif pair == "deliver/deliver":
            self.drive_until(run, lambda m: m.ready and m.pending_delivery is None and m.confirmed_key is None)
        m = self.model.runs[run]
        owner, pending = Actor("owner", m.owner), m.pending_delivery or "k1"
        rivals: list[tuple[Actor, C.Command, str | None]] = {
            "close/close": [(owner, C.Close(disposition=T.NO_OP), None), (OPERATOR, C.Close(disposition=T.CANCELLED), None)],
            "delivered/close": [(owner, C.ConfirmDelivery(key=pending, receipt="msg-1"), None),
                                (owner, C.Close(disposition=T.FAILED), None)],
            "deliver/deliver": [(owner, C.Deliver(key="k2"), "deliver:k2"), (OPERATOR, C.Deliver(key="k3"), "deliver:k3")],
            "delivered/delivered": [(owner, C.ConfirmDelivery(key=pending, receipt="msg-1"), None),
                                    (OPERATOR, C.ConfirmDelivery(key=pending, receipt="msg-2"), None)],
        }[pair]
        (a1, c1, k1), (a2, c2, k2) = rivals
        before = len(self.log())
        results: list[Any] = [None, None]
        gate = threading.Barrier(2)

        def go(i: int, lg: Any, actor: Actor, cmd: C.Command, key: str | None) -> None:
            gate.wait()
            try:
                results[i] = lg.execute(run, cmd, actor=actor, key=key)
            except E.LedgerError as exc:
                results[i] = exc

        threads = [threading.Thread(target=go, args=(0, self.ledger, a1, c1, k1)),
                   threading.Thread(target=go, args=(1, self.other, a2, c2, k2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        added = self.log()[before:]

        def outcome(x: Any) -> Any:
            return type(x) if isinstance(x, E.LedgerError) else x.result.outcome

        observed = [outcome(x) for x in results]
        tally = f"race {pair}: " + " / ".join(o if isinstance(o, str) else o.__name__ for o in observed)
        self.accepted[tally] = self.accepted.get(tally, 0) + 1
        for order in ((0, 1), (1, 0)):
            trial = copy.deepcopy(self.model)
            predicted: list[Any] = [None, None]
            tags: list[str] = []
            for i in order:
                actor, cmd, key = rivals[i]
                exp = trial.predict(run, actor, cmd, key)
                if exp.error is not None:
                    predicted[i] = exp.error
                else:
                    predicted[i] = exp.outcome
                    tags += [] if exp.duplicate or exp.unchanged else exp.tags
                    trial.commit(run, exp)
            if predicted == observed and [r.type for r in added] == tags:
                self.model = trial
                break
        else:
            raise AssertionError(f"race {pair} on {run}: observed {observed} and {[r.type for r in added]}, "
                                 "which no serial order of the two commands explains")
        assert sum(o == "committed" for o in observed) <= 1, f"race {pair}: both rivals were accepted"

    @rule(run=runs, steps=st.integers(1, 20), choice=st.integers(0, 5))
    def take_sensible_steps(self, run: str, steps: int, choice: int) -> None:
        """``drive`` as a rule: a well-behaved agent and owner move the run along."""
        self.drive(run, steps, choice)

    @rule(run=runs, steps=st.integers(1, 20), choice=st.integers(0, 5))
    def take_more_sensible_steps(self, run: str, steps: int, choice: int) -> None:
        """The same again: a second rule so that whole lifecycles are common."""
        self.drive(run, steps, choice)

    def drive(self, run: str, steps: int, choice: int = 0) -> None:
        """Take up to ``steps`` sensible steps (``sensible_step``), stopping at a refusal."""
        for i in range(steps):
            if isinstance(self.sensible_step(run, choice + i), E.LedgerError):
                break

    @rule(run=runs, outcome=st.sampled_from(["done", "absent"]), by_watchdog=st.booleans())
    def lose_lease_mid_effect(self, run: str, outcome: str, by_watchdog: bool) -> None:
        """Seed 003's injection: the worker dispatched a side effect, then lost its lease.

        The run must go to unknown, refuse to move on until someone records what really
        happened, and take that reconciliation as progress.
        """
        if not self.bring_to_work(run):
            return
        m = self.model.runs[run]
        w = Actor("worker", m.worker or WORKERS[0])
        key = next(k for k in (f"e{i}" for i in itertools.count(1)) if k not in m.pending and k not in m.settled)
        self.issue(run, w, C.StartEffect(lease=m.lease, key=key, what="send the report by mail"))
        seq = self.model.runs[run].progress_seq
        if by_watchdog:
            self.issue(run, WATCHDOG, C.Recover(action="revoke_lease", classification="unavailable", progress_seq=seq))
        else:
            self.issue(run, OPERATOR, C.Revoke(reason="worker stopped answering"))
        self.issue(run, w, C.Heartbeat(lease=m.lease))  # the old worker wakes up: fenced off
        self.issue(run, OPERATOR, C.ConfirmEffect(key=key, outcome=outcome, note="checked the mailbox"))

    @rule(run=runs, which=st.sampled_from(["empty", "missing", "elsewhere"]))
    def submit_without_substance(self, run: str, which: str) -> None:
        """Seed 001's evidence rule: a result must point at files that exist and have content."""
        if not self.drive_until(run, lambda m: m.state == T.VERIFYING and m.lease is not None):
            return
        m = self.model.runs[run]
        w = Actor("worker", m.worker or WORKERS[0])
        if which == "elsewhere":
            if m.result_path is None:
                return
            for path in list(m.artifacts):  # only a file other than the contract's result
                if path == m.result_path:
                    return
            self.record_artifact(run, "notes")
        else:
            self.record_artifact(run, which)
        self.issue(run, w, C.Submit(lease=m.lease, summary="done, trust me"))

    @rule(run=runs, worker=st.sampled_from(WORKERS))
    def stale_worker_returns(self, run: str, worker: str) -> None:
        """A replaced worker resumes and writes under its old lease: nothing it sends lands."""
        if not self.bring_to_work(run):
            return
        m = self.model.runs[run]
        old = m.lease
        self.issue(run, OPERATOR, C.Revoke(reason="replaced", lease=old))
        self.issue(run, Actor("worker", worker), C.Claim(worker=worker))
        w = Actor("worker", m.worker or WORKERS[0])
        self.issue(run, w, C.Progress(lease=old, kind="tool_outcome"))
        self.issue(run, w, C.Transition(lease=old, to=T.VERIFYING))

    def drive_until(self, run: str, done: Callable[[RunModel], bool], steps: int = 25) -> bool:
        """Take sensible steps until ``done(model of the run)`` holds; False if it never does."""
        for i in range(steps):
            m = self.model.runs[run]
            if done(m):
                return True
            if m.terminal or isinstance(self.sensible_step(run, i), E.LedgerError):
                return False
        return done(self.model.runs[run])

    def bring_to_work(self, run: str) -> bool:
        """A few sensible steps until a worker holds the run in a working state, if it can."""
        for i in range(6):
            m = self.model.runs[run]
            if m.lease is not None and m.state in T.WORKING:
                return True
            if m.terminal or m.state not in (T.QUEUED, T.UNKNOWN, T.BLOCKED, T.PLANNING):
                return False
            if isinstance(self.sensible_step(run, i), E.LedgerError):
                return False
        return False

    def sensible_step(self, run: str, choice: int) -> Any:
        """One command that an honest worker, owner or watchdog would issue next."""
        m = self.model.runs[run]
        owner = Actor("owner", m.owner)
        w = Actor("worker", m.worker or WORKERS[choice % len(WORKERS)])
        lease = m.lease
        if m.terminal:
            return self.issue(run, WATCHDOG, C.Observe(classification="silent", progress_seq=m.progress_seq))
        if m.state == T.BLOCKED:
            return self.issue(run, owner, C.Unblock(resolution="resolved"))
        if m.state == T.UNKNOWN and m.pending:
            return self.issue(run, OPERATOR, C.ConfirmEffect(key=sorted(m.pending)[0], outcome="done", note="checked"))
        if m.state == T.READY_FOR_REVIEW:
            return self.issue(run, owner, C.ReviewResult(approve=choice % 4 != 0))
        if m.state == T.SUCCEEDED:
            if not m.evidence_ok:
                return self.issue(run, owner, C.RecordEvidence(kind="tests", outcome="pass"))
            if m.pending_delivery is not None:
                key = m.pending_delivery
                if choice % 5 == 0:
                    return self.issue(run, owner, C.FailDelivery(key=key, error="503"))
                return self.issue(run, owner, C.ConfirmDelivery(key=key, receipt=f"receipt-{key}"))
            key = next(k for k in ("k1", "k2", "k3", "k4", "k5", "k6") if k not in m.attempts)
            return self.issue(run, owner, C.Deliver(key=key), key=f"deliver:{key}")
        if lease is None:
            return self.issue(run, w, C.Claim(worker=w.name))
        if m.state == T.QUEUED:
            return self.issue(run, w, C.Transition(lease=lease, to=T.PLANNING))
        if m.state == T.UNKNOWN:
            return self.issue(run, w, C.Transition(lease=lease, to=T.EXECUTING))
        if m.state == T.PLANNING:
            if choice % 2:
                return self.issue(run, w, C.Progress(lease=lease, kind="plan_committed"))
            return self.issue(run, w, C.Transition(lease=lease, to=T.EXECUTING))
        if m.state == T.EXECUTING:
            if m.pending and choice % 3 != 2:
                return self.issue(run, w, C.ConfirmEffect(key=sorted(m.pending)[0], outcome="done", lease=lease))
            bad = sorted(p for p, ok in m.artifacts.items() if not ok)
            if bad and choice % 2 and bad[0] != m.result_path:
                # Recorded by mistake: take it back rather than make the file.
                return self.issue(run, w, C.WithdrawArtifact(path=bad[0], reason="recorded by mistake", lease=lease))
            if bad:
                return self.record_artifact(run, "fixed", path=bad[0])
            if not m.artifacts or (m.result_path and m.result_path not in m.artifacts):
                return self.record_artifact(run, "result")
            if choice % 3 == 1 and len(m.settled) + len(m.pending) < 3:
                key = f"k{len(m.settled) + len(m.pending) + 1}"
                return self.issue(run, w, C.StartEffect(lease=lease, key=key, what="send mail"))
            if not m.evidence_ok:
                return self.issue(run, w, C.RecordEvidence(kind="tests", outcome="pass", lease=lease))
            return self.issue(run, w, C.Transition(lease=lease, to=T.VERIFYING))
        if m.state == T.VERIFYING:
            if choice % 3 == 0:
                return self.issue(run, w, C.Progress(lease=lease, kind="verifier_result"))
            return self.issue(run, w, C.Submit(lease=lease, summary="report written"))
        return self.issue(run, w, C.Heartbeat(lease=lease))

    # --- invariants ----------------------------------------------------------------------

    def history(self, run_id: str) -> list[Recorded]:
        """What a fold of ``run_id`` reads: a fork's parent prefix, then its own events."""
        return list(self.ledger.store.history(run_id))

    @invariant()
    def store_equals_model(self) -> None:
        for run_id, m in self.model.runs.items():
            cp = self.ledger.checkpoint(run_id)
            for name, read in COMPARED.items():
                assert read(cp) == model_value(m, name), (
                    f"{run_id}.{name}: the fold says {read(cp)!r}, the model {model_value(m, name)!r}"
                )
            own = [r for r in self.ledger.store.read_run(run_id) if r.type == "delivery_confirmed"]
            assert len(own) == m.confirmations <= 1, f"{run_id} has {len(own)} confirmed deliveries"

    @invariant()
    def terminal_states_absorb(self) -> None:
        for run_id, m in self.model.runs.items():
            if m.ended_as is not None:
                assert self.ledger.checkpoint(run_id).state == m.ended_as

    @invariant()
    def prefixes_equal_as_of(self) -> None:
        """Fold of a prefix == the checkpoint as of that seq == the model's snapshot there."""
        for run_id, snaps in self.model.snapshots.items():
            hist = self.history(run_id)
            bounds = sorted(snaps)
            for k in {bounds[0], bounds[len(bounds) // 2], bounds[-1]}:
                as_of = self.ledger.checkpoint(run_id, at_seq=k)
                prefix = [r for r in hist if r.run_id != run_id or r.seq <= k]
                assert fold(prefix, run_id) == as_of == fold(hist, run_id, until_seq=k)
                for name, read in COMPARED.items():
                    assert read(as_of) == model_value(snaps[k], name), f"{run_id}@{k}.{name}"

    @invariant()
    def fold_composes(self) -> None:
        """fold(a + b) == evolve from fold(a) over b, at a few split points."""
        for run_id in self.model.runs:
            hist = self.history(run_id)
            whole = fold(hist, run_id)
            for cut in {0, len(hist) // 3, (2 * len(hist)) // 3, len(hist)}:
                cp = fold(hist[:cut], run_id)
                for rec in hist[cut:]:
                    cp = evolve(cp, rec)
                assert cp == whole, f"{run_id}: folding in two parts at {cut} differs"

    @invariant()
    def log_verifies(self) -> None:
        assert self.ledger.verify() == []



