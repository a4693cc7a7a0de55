"""The sanitization detectors and the gate a public delivery must pass. Pure: no I/O.

Reading the files is the shell's job (handoff/delivery/bundle.py); this module only
judges text handed to it, so the same judgement runs live, in tests and in an import.
A finding names the detector, the part and the line, never the matched text: what a
detector matches is exactly what must not be copied anywhere, the log included.
"""

from __future__ import annotations

import base64
import bisect
import codecs
import functools
import hashlib
import hmac
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput, SanitizationRequired

from .delivery import Delivery

#: Bumped whenever a built-in detector changes, so a check's ``rules_sha256`` says which
#: detectors it ran.
DETECTORS_VERSION = "4"

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

#: The built-in detectors, by the name findings carry, each a few expressions. Each is
#: deliberately broad: a false alarm costs a look, a miss publishes a secret. Every
#: expression starts with a literal or a small set of characters, with any look-behind
#: after it: the regex engine then skips ahead to candidates instead of trying every
#: position (ten times faster on ordinary text).
class _Anchored:
    """A match found from a rare anchor, then extended left over the characters a match
    may start with (``left``), at least one of them: a host name from its ``.internal``,
    an e-mail address from its ``@domain``. With ``keywords``, the text left of the
    anchor (spaces skipped) must instead end with one of them, which starts the match:
    ``password = ...``. The regex engine alone would try every position of the text."""

    def __init__(self, anchor: str, left: str = "", *, keywords: tuple[str, ...] = (), right: str = "",
                 flags: int = 0, letters: bool = False) -> None:
        self.anchor = re.compile(anchor, flags)
        self.left = frozenset(left)
        #: Any letter or digit of any script may start the match too (an IDN address).
        self.letters = letters
        self.keywords = keywords
        self.ends = frozenset(k[-2:] for k in keywords)  # two letters: one would pass every "https:"
        #: The anchor matches a bounded prefix; an accepted match then extends over this
        #: class (one pass), so anchors that are rejected never read far ahead: no anchor
        #: costs more than its own few characters, whatever the text (an attacker's file).
        self.right = re.compile(right) if right else None

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        last = pos = 0
        while (m := self.anchor.search(text, pos)) is not None:
            pos = m.start() + 1  # a rejected anchor may hide another inside it: look again there
            start = m.start()
            if self.keywords:
                i = start
                while i > last and text[i - 1] in _BETWEEN:
                    i -= 1
                word = None
                if i - 2 >= last and text[i - 2:i].lower() in self.ends:  # a cheap test first: anchors abound
                    word = next((k for k in self.keywords if text[max(last, i - len(k)):i].lower() == k), None)
                if word is None:
                    continue
                start = i - len(word)
            else:
                while start > last and (text[start - 1] in self.left or self.letters and text[start - 1].isalnum()):
                    start -= 1
                if start == m.start():
                    continue
            end = m.end()
            if self.right is not None:
                end = self.right.match(text, end).end()
            last = pos = end
            yield start, end


class _Checked:
    """A regular expression whose matches also pass ``check`` (a test the pattern alone
    cannot make: what a base64 value decodes to)."""

    def __init__(self, pattern: str, check: Callable[[re.Match[str]], bool]) -> None:
        self.rx = re.compile(pattern)
        self.check = check

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        return (m.span() for m in self.rx.finditer(text) if self.check(m))


def _basic_credentials(m: re.Match[str]) -> bool:
    """Does group 1 decode (padding forgiven) to printable ``user:password``?"""
    value = m.group(1).rstrip("=")
    if len(value) % 4 == 1:
        return False
    try:
        plain = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return False
    return ":" in plain and plain.isprintable()


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
#: Words that name a secret when a value is assigned to them: matched at the end of the
#: key, in any case, so ``client_secret``, ``AWS_SECRET_ACCESS_KEY`` and ``apiKey`` count.
SECRET_KEYWORDS = ("password", "passwd", "passphrase", "secret", "apikey", "api_key", "api-key", "token",
                   "access_key", "accesskey", "access-key", "secret_key", "secretkey", "secret-key",
                   "private_key", "privatekey", "private-key", "secret access key", "credential", "credentials")
#: What may stand between a key and its ``:`` or ``=``: spaces and the key's closing quote,
#: escaped or not (``"password": ``, ``\\"token\\": ``, ``'api_key' => ``).
_BETWEEN = frozenset(" \t\"'`\\")
DETECTORS: dict[str, tuple[re.Pattern[str] | _Anchored | _Checked, ...]] = {
    # A key or token in a known format: the fixed-prefix formats of gitleaks' default rules,
    # in the project's own expressions. A prefix that begins a token must not follow a
    # letter or digit (``task_test_...`` is a word, ``idem_sk_live_...`` a key).
    "secret": tuple(re.compile(p) for p in (
        # AWS access key ids (long-term, temporary, STS, context), and the secret access key
        # that follows one on its line (a credentials CSV, ``aws configure`` output).
        r"A(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{16}"
        r"(?:[^\n]{0,60}?(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=]))?",
        # An AWS secret access key after a name that starts with aws (aws_secret, AWS-KEY ...):
        # 40 base64 characters or more, not the rest of a URL (``aws s3 cp s3://...``).
        # Its quotes may be escaped, once or more (JSON inside JSON: ``\\\"``).
        r"(?i:a)(?<![A-Za-z0-9][aA])(?i:ws)[\w.-]{0,30}[\s\"'`:=>,|\\]{1,16}(?!//)[A-Za-z0-9/+=]{40,}",
        # The secret access key in the next cell of a table's row (``--output table``).
        r"[sS](?i:ecret)[ _-]?(?i:access)[ _-]?(?i:key)[ \t]{0,20}\|[ \t|]{0,20}[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
        r"s(?<![A-Za-z0-9]s)k_(?:live|test)_[0-9A-Za-z]{10,}",   # Stripe secret keys
        r"r(?<![A-Za-z0-9]r)k_(?:live|test)_[0-9A-Za-z]{10,}",   # Stripe restricted keys
        r"gh[pousr]_[A-Za-z0-9]{30,}", r"github_pat_[A-Za-z0-9_]{30,}",  # GitHub
        # GitLab: personal, deploy, feed, runner, CI job, mail, agent, OAuth, trigger, SCIM
        # and feature-flag tokens, runner registration tokens, session cookies.
        r"gl(?:pat|dt|ft|rt|cbt|imt|agent|oas|ptt|soat|ffct)-[0-9A-Za-z_-]{20,}(?:\.[0-9a-z]{9})?",
        r"GR1348941[0-9A-Za-z_-]{20,}", r"_gitlab_session=[0-9a-z]{32}",
        # Slack: bot, user, legacy, configuration and app tokens, and webhook addresses.
        r"xox[abposre]-[A-Za-z0-9-]{10,}", r"xoxe\.xox[bp]-\d-[A-Za-z0-9]{20,}", r"xapp-\d-[A-Za-z0-9-]{10,}",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_-]{20,}",
        # OpenAI (sk-, sk-proj-, sk-svcacct-, sk-admin-) and Anthropic (sk-ant-...) keys.
        r"s(?<![A-Za-z0-9]s)k-[A-Za-z0-9_-]{20,}",
        r"AIza[0-9A-Za-z_-]{35}",                                 # Google API key
        r"npm_[A-Za-z0-9]{36}",                                   # npm access token
        r"pypi-AgE[A-Za-z0-9_-]{50,}",                            # PyPI upload token (pypi.org, test.pypi.org)
        # A private key: its header, and the key itself up to its END line, so that
        # redacting it removes the key, not only the line that announces it (its lines
        # may end in an escaped \n, escaped once or more, as in JSON inside JSON).
        r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:(?:\r?\n|\\+[nr])[A-Za-z-]{1,40}: [^\n\\]{0,200})*"  # its headers (Proc-Type: ...), each on a line
        r"(?:[A-Za-z0-9+/=\s]|\\+[nr])*(?:-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----)?",
        r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
        r"[Bb][Ee][Aa][Rr][Ee][Rr]\s+[A-Za-z0-9._~+/=-]{16,}",     # an Authorization value
        # Any other Authorization header's value: a scheme (Token, ApiKey ...) or none, then
        # a credential of 16 characters or more. Its quotes may be escaped, once or more.
        r"(?i:a)(?<!\w[aA])(?i:uthorization)\\*[\"'`]?\s*[:=]\s*\\*[\"'`]?(?:[A-Za-z][A-Za-z0-9-]*\s+)?"
        r"[A-Za-z0-9._~+/=:-]{16,}",
    )) + (
        # Basic credentials: base64 that decodes to printable text holding the ``:`` between
        # the user and the password, so ``Basic information`` is a phrase, not a credential.
        _Checked(r"(?i:b)(?<![A-Za-z][bB])(?i:asic)\s+([A-Za-z0-9+/]{2,}={0,2})(?![A-Za-z0-9+/=])", _basic_credentials),
        # A URL that carries a password: scheme://user:password@host. The password may hold
        # a "/" unless what comes before the first one reads as a port (``host:8080/@me``
        # is a path), and the user holds no brackets (``[::1]:5173/@vite`` is a host).
        _Anchored(r"://[^\s/:@\"'<>`\[\]]{0,256}:(?!\d{0,5}/)[^\s@\"'<>`]{1,256}@", _ALNUM + "+.-"),
        # The same URL percent-encoded, as a query string carries one (``next=postgres%3A%2F%2F
        # admin%3Apw%40db``): ``%3A`` between user and password, ``%40`` before the host.
        _Anchored(r"%3A%2F%2F(?:[^\s%/:@\"'<>`&]|%(?!3A|40)[0-9A-F]{2}){0,256}%3A(?!\d{0,5}%2F)"
                  r"(?:[^\s%/:@\"'<>`&]|%(?!40)[0-9A-F]{2}){1,256}%40", _ALNUM + "+.-", flags=re.I),
        # password = "...", {"api_key": "..."}, {'token': '...'}, <secret>...</secret>: a value
        # after a secret's keyword, quoted (any length from 4, spaces and all) or bare (8 on).
        # Quotes may be escaped, once or more (``\\\"token\\\": \\\"...\\\"``: JSON inside JSON).
        _Anchored(r"[:=>][=>]?\s*(?:\\*[\"'`][^\"'`\\\n]{4}|[^\s\"'`\\<]{8})", keywords=SECRET_KEYWORDS,
                  # the rest of a quoted value (its quote and four characters behind), or of a bare one
                  right=r"(?<=[\"'`][^\"'`\\\n]{4})[^\"'`\\\n]*|[^\s\"'`\\<]*"),
    ),
    # A home directory, in any of its spellings.
    "home_dir": tuple(re.compile(p) for p in (
        r"~(?<![\w.]~)/[^\s]*", r"/home/[^/\s]+", r"/Users/[^/\s]+", r"/root(?:/|\b)",
        r"[A-Za-z]:\\Users\\[^\\\s]+",
    )),
    # Any other absolute local path of two parts or more (a URL's path is preceded by its
    # host, so it does not match).
    "local_path": tuple(re.compile(p) for p in (
        r"/(?<![\w:/.~-]/)[A-Za-z0-9._@+-]+(?:/[A-Za-z0-9._@+-]+)+",
        r"[A-Za-z](?<![\w][A-Za-z]):\\[^\s\"']+",
    )),
    # A private, loopback or link-local address (IPv4 and IPv6).
    "private_address": tuple(re.compile(p) for p in (
        rf"1(?<![\w.]1)(?:0\.{_OCTET}|27\.{_OCTET}|92\.168|69\.254|72\.(?:1[6-9]|2\d|3[01]))\.{_OCTET}\.{_OCTET}(?!\w)",
        r"(?i:f)(?<![\w:].)(?i:[cd][0-9a-f]{2}|e80):[0-9a-fA-F:]*(?![\w])",
        r":(?<![\w:]:):1\b",
    )),
    # A host name that only means something inside one network.
    "host_name": (
        _Anchored(r"\.(?:localdomain|local|internal|intranet|corp|lan|home\.arpa)\b", _ALNUM + "-.", flags=re.I),
        re.compile(r"localhost\b", re.I),
    ),
    # Internationalised too: letters of any script, an IDN's punycode top-level domain.
    "email": (_Anchored(r"@[\w-]+(?:\.[\w-]+)*\.(?:[^\W\d_]{2,}|xn--[\w-]+)\b", _ALNUM + "._%+-", letters=True),),
}

MAX_PATTERNS = 50
MAX_PATTERN_LEN = 500


def check_patterns(patterns: object) -> tuple[str, ...]:
    """The owner's own patterns, each a regular expression that compiles; refused otherwise."""
    if not isinstance(patterns, (tuple, list)):
        raise InvalidInput("sanitize_patterns must be a list of regular expressions", field="sanitize_patterns")
    if len(patterns) > MAX_PATTERNS:
        raise InvalidInput(f"sanitize_patterns has {len(patterns)} patterns, over the limit of {MAX_PATTERNS}",
                           field="sanitize_patterns")
    out = []
    for i, p in enumerate(patterns):
        if not isinstance(p, str) or not p or len(p) > MAX_PATTERN_LEN:
            raise InvalidInput(f"sanitize_patterns[{i}] must be a regular expression of 1 to {MAX_PATTERN_LEN} "
                               "characters", field="sanitize_patterns")
        try:
            compiled = re.compile(p)
        except re.error as exc:
            raise InvalidInput(f"sanitize_patterns[{i}] is not a valid regular expression: {exc}",
                               field="sanitize_patterns") from None
        if compiled.search(""):
            raise InvalidInput(f"sanitize_patterns[{i}] matches empty text, so it would flag everything; "
                               "make it match something", field="sanitize_patterns")
        out.append(p)
    return tuple(out)


def rules_digest(patterns: Iterable[str]) -> str:
    """What a check's ``rules_sha256`` must be: the built-in detectors' version and the
    contract's own patterns."""
    h = hashlib.sha256(f"detectors:{DETECTORS_VERSION}\n".encode())
    for p in patterns:
        h.update(p.encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()


def _detectors(patterns: Iterable[str]) -> list[tuple[str, tuple[re.Pattern[str] | _Anchored | _Checked, ...]]]:
    return [*DETECTORS.items(), *((f"pattern[{i}]", (re.compile(p),)) for i, p in enumerate(patterns))]


def _spans(rx: re.Pattern[str] | _Anchored | _Checked, text: str) -> Iterator[tuple[int, int]]:
    if isinstance(rx, (_Anchored, _Checked)):
        return rx.spans(text)
    return (m.span() for m in rx.finditer(text))


_NEWLINE = re.compile("\n")

#: The detector name of a part that could not be scanned (not text, or text holding NULs
#: that is not UTF-16): failing closed.
UNSCANNABLE = "unscannable"
#: The detector name of the one finding that stands for the findings past those a check
#: records (handoff/facade.py, ``sanitize``).
MORE = "more"

#: Control characters no text holds (whitespace aside): a UTF-16 reading that has them is
#: not text but binary read two bytes at a time.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")


@functools.cache
def _format_chars() -> re.Pattern[str]:
    """Every Unicode format character (category Cf: zero-width spaces and joiners, the soft
    hyphen, byte-order marks, bidi controls): invisible, so they can split a key without
    changing how it reads. Built on first use, not at import (a walk over every code point)."""
    ranges: list[list[int]] = []
    for c in range(sys.maxunicode + 1):
        if unicodedata.category(chr(c)) == "Cf":
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    # As ranges: a class of single astral characters makes the engine ten times slower.
    return re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges) + "]")


def _utf16(raw: bytes) -> str | None:
    """``raw`` read as UTF-16 when it looks like it, else None: NULs fill at least a quarter
    of one byte position (the high byte of Latin text) and few of the other, it decodes
    strictly, and the result holds no control characters (binary data read as UTF-16
    does). A byte-order mark is dropped first. UTF-16 without NULs (CJK text alone) stays
    unscannable: nothing tells it from binary."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and not raw.startswith(codecs.BOM_UTF32_LE):
        raw = raw[2:]
    even, odd = raw[0::2].count(0), raw[1::2].count(0)
    high, low = max(even, odd), min(even, odd)
    if len(raw) % 2 or high * 4 < len(raw) // 2 or low * 8 > high:
        return None
    codec = "utf-16-le" if odd > even else "utf-16-be"
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError:
        return None
    return None if _CONTROL.search(text) else text


def readings(text: str | bytes | None) -> tuple[str, ...]:
    """The texts the detectors judge of one part: none when it cannot be read (a finding
    ``unscannable``), usually one.

    A detector matches spelling, so a part is first read as what it says: Unicode format
    characters removed, then NFKC (fullwidth and other compatibility letters become plain
    ones), so ``pass<zero-width space>word`` and ``ｐａｓｓｗｏｒｄ`` read ``password``.
    Bytes are UTF-8, or UTF-16 where they look like it (a byte-order mark, or the NULs of
    UTF-16 text without one); anything else is unscannable. Text holding a NUL (which no
    detector can see across) is unscannable unless it reads as UTF-16, and then it is read
    both ways, as UTF-16 and as its bytes without the NULs, so UTF-16 in one place hides
    no UTF-8 in another."""
    if text is None:
        return ()
    if isinstance(text, str):
        if "\x00" not in text:
            return (_plain(text),)
        text = text.encode("utf-8", "surrogatepass")
    if b"\x00" not in text and not text.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return (_plain(text.decode("utf-8")),)
        except UnicodeDecodeError:
            return ()
    wide = _utf16(text)
    if wide is None:
        return ()
    out = [_plain(wide)]
    narrow = _plain(text.replace(b"\x00", b"").decode("utf-8", "replace"))
    if narrow != out[0]:
        out.append(narrow)
    return () if any("\x00" in t for t in out) else tuple(out)


def _plain(text: str) -> str:
    if text.isascii():  # nothing to normalise: the common case stays as fast as it was
        return text
    return unicodedata.normalize("NFKC", _format_chars().sub("", text))


def scan(parts: Iterable[tuple[str, str | bytes | None]], patterns: Iterable[str] = ()) -> tuple[ev.Finding, ...]:
    """Every finding in ``parts`` ((name, text) pairs; text as str, as the bytes of a
    file, or None for a part that is not text), one per detector and line, in order of
    part, line and detector. A part that cannot be read as text is a finding of its own:
    what cannot be scanned cannot pass. Each part is judged as ``readings`` reads it.

    Each detector runs over a whole part at once (the regex engine's loop, not Python's),
    and a match is placed on the line where it starts; a match may run across a line end.
    """
    detectors = _detectors(patterns)
    found: list[ev.Finding] = []
    for name, text in parts:
        texts = readings(text)
        if not texts:
            found.append(ev.Finding(UNSCANNABLE, name, 0))
            continue
        hits: dict[tuple[int, int], int] = {}
        for reading in texts:
            ends = [m.start() for m in _NEWLINE.finditer(reading)]
            seen: dict[tuple[int, int], int] = {}
            for order, (_det, rxs) in enumerate(detectors):
                for rx in rxs:
                    for start, _end in _spans(rx, reading):
                        line = bisect.bisect_left(ends, start) + 1
                        seen[(line, order)] = seen.get((line, order), 0) + 1
            for where, n in seen.items():  # two readings of one part: count a match once
                hits[where] = max(hits.get(where, 0), n)
        for (line, order), n in sorted(hits.items()):
            found.append(ev.Finding(detectors[order][0], name, line, n))
    return tuple(found)


def describe(findings: Iterable[ev.Finding], limit: int = 5) -> str:
    fs = list(findings)
    shown = "; ".join(
        f"{f.detector} in {f.item}" + (f" line {f.line}" if f.line else "") + (f" (x{f.count})" if f.count > 1 else "")
        for f in fs[:limit]
    )
    return shown + (f"; and {len(fs) - limit} more" if len(fs) > limit else "")


def gate(d: Delivery, *, run_id: str, key: str, bundle_sha256: str,
         artifacts: Iterable[tuple[str, str]]) -> None:
    """Refuse (``SanitizationRequired``) a delivery to a public target unless the latest
    check passed, under the contract's rules, after the last change to what is sent, over
    exactly the bundle about to go (``bundle_sha256``, measured by the shell) and the
    recorded artifacts' digests (``artifacts``: (name, sha256) as the log holds them);
    and unless the key, which the adapter adds, is clean too. Not public: no gate."""
    if not d.public:
        return
    what = f"run {run_id} delivers to a public target ({d.target})"
    c = d.check
    if c is None:
        raise SanitizationRequired(
            f"{what} and no sanitization check is recorded; run 'handoff sanitize {run_id} --by OWNER' "
            "(Ledger.sanitize) and fix what it finds before delivering")
    if not c.passed:
        raise SanitizationRequired(
            f"{what} and its last sanitization check (seq {c.seq}) failed: {describe(c.findings)}. Remove "
            "those from the result, record it again, and check again; a submitted result goes back to a "
            f"worker first ('handoff reopen {run_id} --by OWNER --reason ...')")
    if c.seq < d.changed_seq:
        raise SanitizationRequired(
            f"{what} and what it sends changed at seq {d.changed_seq}, after the last sanitization check "
            f"(seq {c.seq}); check again")
    if c.rules_sha256 != rules_digest(d.patterns):
        raise SanitizationRequired(f"{what} and its last check did not run the contract's rules; check again")
    scanned = {(i.name, i.sha256) for i in c.items}
    missing = [name for name, sha in artifacts if (name, sha) not in scanned]
    if missing:
        raise SanitizationRequired(
            f"{what} and the last sanitization check did not read {', '.join(missing[:3])} as recorded; "
            "check again")
    if not bundle_sha256 or bundle_sha256 != c.bundle_sha256:
        raise SanitizationRequired(
            f"{what} and what would be sent now (sha256 {bundle_sha256[:12] or 'not measured'}) is not what the "
            f"check passed (sha256 {c.bundle_sha256[:12]}): something changed after the check; check again")
    hits = scan([("delivery key", key)], d.patterns)
    if hits:
        raise SanitizationRequired(
            f"{what} and the delivery key, which the target receives, matches a detector "
            f"({describe(hits)}); choose a plain key")


def salted(salt: bytes, value: str, kind: str = "h") -> str:
    """A stable stand-in for ``value``: the same salt and value give the same text, and
    without the salt it cannot be reversed or guessed by trying values."""
    mac = hmac.new(salt, kind.encode() + b"\0" + value.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return f"[{kind}~{mac.hexdigest()[:16]}]"  # no ":" or "=": it must not look like "secret: ..."


def redact(text: str, salt: bytes, patterns: Iterable[str] = ()) -> str:
    """``text`` with every detector match replaced by its salted stand-in: what a worker's
    stop text (an exception, the end of a child's stderr) becomes before it is recorded
    (handoff.lease.bounded_text). Text that cannot be scanned (``readings``) is replaced
    whole; other text is judged, and returned, as it reads (format characters removed, NFKC)."""
    texts = readings(text)
    if len(texts) != 1:
        return salted(salt, text, UNSCANNABLE)
    text = texts[0]
    for det, rxs in _detectors(patterns):
        for rx in rxs:
            out, at = [], 0
            for start, end in _spans(rx, text):
                if start < end:  # a user's pattern may match empty text inside a longer one
                    out += [text[at:start], salted(salt, text[start:end], det)]
                    at = end
            text = "".join(out) + text[at:]
    return text
