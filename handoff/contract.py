"""The handoff contract as other programs hand it in: JSON checked field by field.

pydantic is used here, at the edge, because an agent written in another language needs
two things msgspec's fast path does not give it: an error that names every bad field
in words, and a JSON Schema it can validate against before it ever calls us
(``handoff contract-schema``). Imported only when a contract file is used.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from handoff.ledger.errors import InvalidInput
from handoff.ledger.events import Policy as _StoredPolicy
from handoff.ledger.events import SendPolicy as _StoredSend
from handoff.ledger.inputs import CONTROL_RE
from handoff.ledger.store import DEFAULT_MAX_PAYLOAD
from handoff.reducers.transitions import MAX_DECLARED_KINDS, check_progress_kinds

#: The largest contract file read: a contract becomes one event, whose payload is at most
#: the store's limit, and a file may spell each of its characters as a six-byte \\u
#: escape. Anything longer cannot be a contract the ledger accepts, so reading stops there
#: instead of taking memory for as long as the input lasts (``--contract /dev/zero``).
MAX_FILE_BYTES = 6 * DEFAULT_MAX_PAYLOAD

_NAME = dict(min_length=1, max_length=200)
_DEFAULT = _StoredPolicy()  # the defaults' one home: the stored event's own
_SEND = _StoredSend()


def _printable(value: str) -> str:
    # The store's one rule (inputs.CONTROL_CHARS), said before decide would say it, so a
    # contract's every bad field is named at once.
    m = CONTROL_RE.search(value)
    if m is not None:
        raise ValueError(f"must not contain control characters or bidirectional text controls "
                         f"(U+{ord(m.group()):04X} at character {m.start()})")
    return value


def _finite_seconds(value: float) -> float:
    # Every duration of a contract (the watchdog's limits, a send's timing) is a real
    # number of seconds: infinity or NaN would never expire, or never compare.
    if not math.isfinite(value):
        raise ValueError("must be a finite number of seconds")
    return value


class Policy(BaseModel):
    """Limits the watchdog applies to the run."""

    model_config = ConfigDict(extra="forbid")

    heartbeat_timeout_s: float = Field(_DEFAULT.heartbeat_timeout_s, gt=0, le=1e7, description="Seconds without a heartbeat before the worker is unavailable.")
    progress_timeout_s: float = Field(_DEFAULT.progress_timeout_s, gt=0, le=1e7, description="Seconds without progress before the run is stalled.")
    retry_budget: int = Field(_DEFAULT.retry_budget, ge=0, le=1000, description="Stalled windows tolerated before the run is paused.")
    delivery_timeout_s: float = Field(_DEFAULT.delivery_timeout_s, gt=0, le=1e7, description="Seconds a delivery attempt may lack an outcome before it is ambiguous.")
    owner_cap: int = Field(_DEFAULT.owner_cap, ge=1, le=100_000, description="Most runs of this owner that may hold a lease at once.")

    _finite = field_validator("heartbeat_timeout_s", "progress_timeout_s", "delivery_timeout_s")(
        classmethod(lambda cls, v: _finite_seconds(v))
    )


class Send(BaseModel):
    """How the ledger sends the result to an adapter target (docs/delivery.md)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(_SEND.timeout_s, gt=0, le=1e7, description="Seconds one send may take before its outcome is unknown.")
    retries: int = Field(_SEND.retries, ge=0, le=20, description="Further tries of a send whose outcome is unknown, only to a target that honours keys.")
    backoff_s: float = Field(_SEND.backoff_s, ge=0, le=3600, description="Seconds before the first retry; doubled before each next one.")
    max_bytes: int = Field(_SEND.max_bytes, ge=1, le=2**40, description="Most bytes of artifacts one delivery sends.")
    inline: bool = Field(_SEND.inline, description="Send artifacts' content; false sends their metadata and sha256 only.")
    token_env: str = Field(_SEND.token_env, pattern=r"^([A-Za-z_][A-Za-z0-9_]{0,127})?$", description="Environment variable holding a bearer token for a webhook, named HANDOFF_TOKEN_... (no other variable is sent); the token itself is never stored.")

    _finite = field_validator("timeout_s", "backoff_s")(classmethod(lambda cls, v: _finite_seconds(v)))


class HandoffContract(BaseModel):
    """What must be written down before work detaches into a worker."""

    model_config = ConfigDict(extra="forbid", title="handoff-ledger contract")

    goal: str = Field(min_length=1, max_length=16_384, description="What the run must achieve, in words a person reads.")
    target: str = Field(**_NAME, description="Where the result must be seen, e.g. chat:#ops.")
    owner: str = Field(**_NAME, description="Who reviews, delivers and closes the run.")
    origin: str = Field("", max_length=200, description="Where the request came from.")
    run_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._:-]{1,128}$", description="Chosen run id; generated when absent.")
    result_path: str | None = Field(None, min_length=1, max_length=4096, description="The result file the run must produce.")
    stop_rules: list[str] = Field(default_factory=list, max_length=100, description="When the worker must stop.")
    require_review: bool = Field(False, description="The owner must approve the result before delivery.")
    policy: Policy = Field(default_factory=Policy)
    public: bool = Field(False, description="The target is visible to others: delivery needs a passing sanitization check over what is sent.")
    sanitize_patterns: list[str] = Field(default_factory=list, max_length=50, description="The owner's own regular expressions, checked with the built-in detectors.")
    send: Send = Field(default_factory=Send)
    progress_kinds: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Kinds of the run's own that count as progress, by working state (planning, executing, "
        f"verifying), e.g. {{\"executing\": [\"llm_step\"]}}; new names only, at most {MAX_DECLARED_KINDS} in all. "
        "Fixed when the run opens.")

    _printable_fields = field_validator("goal", "target", "owner", "origin", "result_path")(
        classmethod(lambda cls, v: v if v is None else _printable(v))
    )

    @field_validator("progress_kinds")
    @classmethod
    def _kinds(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        try:
            check_progress_kinds(v)  # the rule's one home; the ledger checks it again at open
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        return v

    @field_validator("stop_rules")
    @classmethod
    def _rules(cls, v: list[str]) -> list[str]:
        return [_printable(r) for r in v]


def read(stream: Any, name: str = "the contract") -> bytes:
    """A contract file's bytes, at most ``MAX_FILE_BYTES``; InvalidInput past that."""
    data = stream.read(MAX_FILE_BYTES + 1)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if len(data) > MAX_FILE_BYTES:
        raise InvalidInput(
            f"{name} is longer than {MAX_FILE_BYTES:,} bytes, more than any contract the ledger accepts "
            "(a contract is one JSON object of a few fields; see 'handoff contract-schema'). Check that "
            "--contract names the contract file; nothing was written",
            field="contract",
        )
    return data


def load(data: bytes | str | dict[str, Any]) -> HandoffContract:
    """Parse and validate a contract; every problem becomes one InvalidInput naming its field."""
    try:
        if isinstance(data, dict):
            return HandoffContract.model_validate(data)
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidInput(f"the contract is not valid UTF-8 (byte {exc.start})", field="contract") from None
        if not isinstance(data, str):
            raise InvalidInput(f"the contract must be JSON text, bytes or a dict, got {type(data).__name__}",
                               field="contract")
        try:
            raw = json.loads(data, parse_constant=_no_constants)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"the contract is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                               field="contract") from None
        except RecursionError:
            raise InvalidInput("the contract is nested too deeply to read; a contract is a flat object",
                               field="contract") from None
        except ValueError as exc:  # an integer of more than 4,300 digits
            reason = str(exc).split(";")[0]
            raise InvalidInput(f"the contract cannot be read: {reason}", field="contract") from None
        if not isinstance(raw, dict):
            raise InvalidInput("the contract must be a JSON object", field="contract")
        return HandoffContract.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "contract"
            problems.append(f"{where}: {err['msg']}")
        first = ".".join(str(p) for p in exc.errors()[0]["loc"]) or "contract"
        raise InvalidInput("the contract is invalid: " + "; ".join(problems), field=first) from None
    except RecursionError:  # a dict handed in directly, nested beyond Python's stack
        raise InvalidInput("the contract is nested too deeply to read; a contract is a flat object",
                           field="contract") from None


def _no_constants(name: str) -> Any:
    raise InvalidInput(f"the contract contains {name}, which is not a number JSON allows", field="contract")


def schema() -> dict[str, Any]:
    """The JSON Schema of the contract, for validators in other languages."""
    return HandoffContract.model_json_schema()
