"""Secrets in the formats that have a fixed shape (the fixed-prefix rules of gitleaks'
default set, in the project's own expressions): each is found by the sanitizer's scan,
removed by ``redact`` (what the lease block's exception scrub and the integrations'
tool-argument scrub use), and refused by the public delivery gate, with nothing sent.
A clean control of near misses (hashes, UUIDs, prefixes alone, ordinary words) must
pass, so the gate stays usable.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from handoff.facade import Ledger
from handoff.ledger.errors import SanitizationRequired
from handoff.reducers import sanitize as sz
from tests.support import Handoff

from .conftest import outbox, ready_run

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def chars(alphabet: str, n: int, m: int | None = None) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=n, max_size=n if m is None else m)


def _join(*parts: st.SearchStrategy[str] | str) -> st.SearchStrategy[str]:
    return st.tuples(*(p if not isinstance(p, str) else st.just(p) for p in parts)).map("".join)


def _basic(header: bool) -> st.SearchStrategy[tuple[str, str]]:
    """(text, the secret part): base64 of user:password."""
    user = chars(ALNUM + "._-@", 0, 20)
    password = chars(ALNUM + "!#$%&*+-./:;<=>?@[]^_{|}~", 1, 30)
    b64 = st.tuples(user, password).map(lambda up: base64.b64encode(f"{up[0]}:{up[1]}".encode()).decode())
    scheme = st.sampled_from(["Basic", "basic", "BASIC"])
    if header:
        return st.tuples(st.sampled_from(["Authorization: ", "authorization=", '"Authorization": "']), scheme,
                         b64).map(lambda t: (f"{t[0]}{t[1]} {t[2]}", t[2]))
    return st.tuples(scheme, b64).map(lambda t: (f"{t[0]} {t[1]}", t[1]))


def _whole(s: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str, str]]:
    return s.map(lambda x: (x, x))


def _dumps(value: object, times: int) -> str:
    """``value`` as JSON, then that JSON as a JSON string ``times`` times over."""
    text = json.dumps(value)
    for _ in range(times):
        text = json.dumps(text)
    return text


_AWS_ID = _join(st.sampled_from(["AKIA", "ASIA", "ABIA", "ACCA"]), chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16))
_AWS_SECRET = chars(B64, 40)

#: Each shape: a strategy of (the text holding the secret, what must not survive redact).
SHAPES: dict[str, st.SearchStrategy[tuple[str, str]]] = {
    "stripe": _whole(_join(st.sampled_from(["sk_live_", "sk_test_", "rk_live_", "rk_test_"]), chars(ALNUM, 24, 99))),
    "aws-access-key-id": _whole(_AWS_ID),
    "aws-id-then-secret": st.tuples(_AWS_ID, st.sampled_from([" ", ",", "\t", ":", " | "]), _AWS_SECRET).map(
        lambda t: (t[0] + t[1] + t[2], t[2])),
    "aws-secret-after-name": st.tuples(
        st.sampled_from(["aws_secret_access_key", "AWS_SECRET", "aws-secret-key", "awsSecretKey", "AWS_KEY", "aws"]),
        st.sampled_from([" = ", ": ", "=", '": "', " ", "\t"]), _AWS_SECRET).map(lambda t: (t[0] + t[1] + t[2], t[2])),
    "github": _whole(st.one_of(_join(st.sampled_from(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]), chars(ALNUM, 36)),
                               _join("github_pat_", chars(ALNUM + "_", 82)))),
    "gitlab": _whole(st.one_of(
        _join(st.sampled_from(["glpat-", "gldt-", "glft-", "glrt-", "glsoat-", "glffct-"]), chars(ALNUM + "_-", 20)),
        _join("glptt-", chars("0123456789abcdef", 40)), _join("GR1348941", chars(ALNUM + "_-", 20)))),
    "slack": _whole(st.one_of(
        _join(st.sampled_from(["xoxb-", "xoxp-"]), chars("0123456789", 10, 13), "-", chars("0123456789", 10, 13), "-",
              chars(ALNUM, 24, 32)),
        _join("xapp-1-A", chars("0123456789", 10), "-", chars("0123456789", 13), "-", chars("0123456789abcdef", 64)),
        _join("https://hooks.slack.com/services/T", chars(ALNUM, 10), "/B", chars(ALNUM, 10), "/", chars(ALNUM, 24)))),
    "google-api-key": _whole(_join("AIza", chars(ALNUM + "_-", 35))),
    "npm": _whole(_join("npm_", chars(ALNUM, 36))),
    "pypi": _whole(_join("pypi-AgEIcHlwaS5vcmc", chars(ALNUM + "_-", 50, 120))),
    "openai": _whole(st.one_of(
        _join("sk-", chars(ALNUM, 20), "T3BlbkFJ", chars(ALNUM, 20)),
        _join(st.sampled_from(["sk-proj-", "sk-svcacct-", "sk-admin-"]), chars(ALNUM + "_-", 58), "T3BlbkFJ",
              chars(ALNUM + "_-", 58)))),
    "anthropic": _whole(_join(st.sampled_from(["sk-ant-api03-", "sk-ant-admin01-"]), chars(ALNUM + "_-", 93), "AA")),
    "private-key": st.tuples(st.sampled_from(["", "RSA ", "EC ", "OPENSSH ", "DSA ", "ENCRYPTED "]),
                             st.lists(chars(B64, 64), min_size=1, max_size=6), chars(B64, 4, 40)).map(
        lambda t: (f"-----BEGIN {t[0]}PRIVATE KEY-----\n" + "\n".join(t[1]) + f"\n{t[2]}==\n"
                   f"-----END {t[0]}PRIVATE KEY-----", "\n".join(t[1]))),
    "jwt": _whole(_join("eyJ", chars(ALNUM + "_-", 10, 40), ".eyJ", chars(ALNUM + "_-", 10, 80), ".",
                        chars(ALNUM + "_-", 10, 60))),
    "basic-header": _basic(header=True),
    "basic-bare": _basic(header=False),
    "bearer-header": st.tuples(st.sampled_from(["Authorization: Bearer ", "authorization: bearer ", "Bearer "]),
                               chars(ALNUM + "._~+/-", 20, 60)).map(lambda t: (t[0] + t[1], t[1])),
    # A header inside JSON inside JSON (a tool's argument that is itself JSON): the quotes
    # between the name and the value are escaped once or twice more.
    "authorization-in-json": st.tuples(
        st.sampled_from(["Authorization", "authorization", "Proxy-Authorization"]),
        st.sampled_from(["Token ", "ApiKey ", "", "Bearer "]), _join(chars("0123456789", 1), chars(ALNUM + "._~+/-", 19, 60)),
        st.integers(0, 3)).map(lambda t: (_dumps({t[0]: t[1] + t[2]}, t[3]), t[2])),
    # A value after a secret's keyword, and an AWS secret after its name, in JSON escaped again.
    "keyword-in-json": st.tuples(
        st.sampled_from(["api_key", "password", "client_secret", "token"]),
        _join(chars("0123456789", 1), chars(ALNUM + "_-.!", 7, 40)),
        st.integers(1, 3)).map(lambda t: (_dumps({t[0]: t[1]}, t[2]), t[1])),
    "aws-secret-in-json": st.tuples(
        st.sampled_from(["aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"]), _AWS_SECRET,
        st.integers(1, 3)).map(lambda t: (_dumps({t[0]: t[1]}, t[2]), t[1])),
    # ``aws iam create-access-key --output table``: the name in a cell, the key in the next.
    "aws-secret-in-a-table": st.tuples(
        st.sampled_from(["||  SecretAccessKey |  ", "| SecretAccessKey | ", "|secret_access_key|"]),
        _AWS_SECRET, st.sampled_from(["  ||", " |", "|"])).map(lambda t: (t[0] + t[1] + t[2], t[1])),
    # A private key (with an encrypted key's headers or none) as JSON, escaped again: its
    # line ends are ``\\n``, ``\\\\n`` ...
    "private-key-in-json": st.tuples(
        st.sampled_from(["", "RSA ", "OPENSSH "]),
        st.sampled_from(["", "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,8A3F09C2D1E4B5A6\n\n"]),
        st.lists(chars(B64, 64), min_size=1, max_size=4), st.integers(1, 3)).map(
        lambda t: (_dumps(f"-----BEGIN {t[0]}PRIVATE KEY-----\n{t[1]}" + "\n".join(t[2])
                          + f"\n-----END {t[0]}PRIVATE KEY-----", t[3]), t[2][0])),
    # A password holding "/" (a port is digits: ``host:8080/@me`` is a path, not a password).
    "url-password-with-slash": st.tuples(
        st.sampled_from(["postgres", "postgresql", "mysql", "https"]), chars("abcdefghijklmnopqrstuvwxyz", 1, 12),
        chars(ALNUM + "!$*+", 1, 10), chars(ALNUM + "/!$*+", 0, 10), chars(ALNUM + "!$*+", 1, 10)).filter(
        lambda t: not t[2].isdigit()).map(lambda t: (f"{t[0]}://{t[1]}:{t[2]}/{t[3]}{t[4]}@db.example.com/app",
                                                     f"{t[2]}/{t[3]}{t[4]}")),
    # A DSN percent-encoded in a query string.
    "url-password-encoded": st.tuples(
        st.sampled_from(["postgres", "redis", "https"]), chars("abcdefghijklmnopqrstuvwxyz", 1, 12),
        _join(chars("abcdefghijklmnopqrstuvwxyz", 1), chars("0123456789", 1), chars(ALNUM + "!*", 4, 20)), st.sampled_from(["%3A", "%3a"]),
        st.sampled_from(["", "%2F", "%2f", "%25"])).map(
        lambda t: (f"https://app.example.com/login?next={t[0]}{t[3]}%2F%2F{t[1]}{t[3]}{t[2]}{t[4]}%40db.example.com"
                   "%2Fapp", t[2])),
    "url-with-password": st.tuples(st.sampled_from(["https", "http", "postgresql", "redis", "amqp", "ftp"]),
                                   chars("abcdefghijklmnopqrstuvwxyz0123456789._-", 1, 16),
                                   chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!$&*+,;=%~", 8, 30),
                                   st.sampled_from(["db.example.com", "203.0.113.7", "host",
                                                    "[2001:db8::1]:5432"])).map(
        lambda t: (f"{t[0]}://{t[1]}:{t[2]}@{t[3]}/x", t[2])),
}

#: Text around a secret: lowercase words and punctuation that no secret detector can take
#: for a secret of its own (no ':', '=', '>' after a keyword, no digit, no capital).
AROUND = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz .,;!?()\n"), max_size=60)
SEPARATOR = st.sampled_from([" ", "\n", "\t", "(", '"', "'", ",", ";", "[", "{"])
SALT = b"0123456789abcdef"


@pytest.mark.parametrize("shape", sorted(SHAPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data(), before=AROUND, after=AROUND, left=SEPARATOR, right=SEPARATOR)
def test_each_shape_in_any_text_is_found_and_redacted(shape, data, before, after, left, right):
    text, secret = data.draw(SHAPES[shape], label="secret")
    whole = before + left + text + right + after
    # The words around may spell the secret's own letters by chance (a bearer token of
    # lowercase letters); what is redacted is the secret, not every copy of its text.
    assume(secret not in whole.replace(text, "", 1))
    line = whole[:whole.index(text)].count("\n") + 1
    found = sz.scan([("result", whole)])
    assert ("secret", line) in {(f.detector, f.line) for f in found}, whole
    assert all(secret not in repr(f) for f in found)
    assert secret not in sz.redact(whole, SALT), whole


@settings(max_examples=200, deadline=None)
@given(before=AROUND, after=AROUND, left=SEPARATOR, right=SEPARATOR)
def test_the_surrounding_text_alone_finds_no_secret(before, after, left, right):
    """The property above is not vacuous: without the secret, its text finds nothing."""
    assert "secret" not in {f.detector for f in sz.scan([("result", before + left + right + after)])}


#: Near misses: text the gate must pass, or it would refuse every ordinary report.
CLEAN = """\
Release notes for the payments service.
Docs: keys start with sk_test_ or sk_live_; never paste one here (sk_live_XXXX is a placeholder).
The task_test_suite_for_payments_and_refunds ran green; see risk-assessment-and-mitigation-plan-q3.
Publishable keys are public by design: pk_live_ and pk_test_ prefixes.
Commit 9fceb02d0ae598e95dc970b74767f19372d61af8, sha256 3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b.
Build 4f1c2a90-5d3e-4b7a-9c21-0e8f6d3b2a11 (a UUID) and the blob dGhpcyBpcyBhIHRlc3Qgb2YgYSBsb25nIHN0cmluZw.
Basic information: basic usage, Basic auth is documented; the bearer of this note is the on-call.
Authorization: see the section below. The Authorization header is required.
aws s3 cp s3://reports-bucket/quarterly/2024/q3/summary-final-version.csv ./out.csv
AWS region us-east-1; AKIA alone is a prefix, as are ghp_, glpat-, xoxb-, npm_, AIza and eyJ.
npm_config_cache and npm_package_json are npm's variables; pypi-token is a word.
Connect to postgresql://db.example.com:5432/app or https://github.com/org/repo with your own account.
-----BEGIN PUBLIC KEY----- and -----BEGIN CERTIFICATE----- blocks are public.
Paths may hold a colon and an at sign: https://host/a:b@c, http://example.com:3000/users/@me,
http://[2001:db8::5]:5173/@vite/client, and https://medium.com:443/@user/post.
Encoded addresses in a query: /login?next=https%3A%2F%2Fexample.com%2Fhome or
/login?next=https%3A%2F%2Fexample.com%3A8443%2F%40me and /go?to=mailto%3Ateam%40example.com.
The "Authorization" header, \\"Authorization\\": \\"see below\\", and {\\"token\\": 3}.
SecretAccessKey | (shown once) | AccessKeyId | Status: the columns of the table.
max_tokens: 4096, token budget: 3, the password policy lives in the wiki.
"""


def test_the_clean_control_passes():
    assert sz.scan([("result", CLEAN)]) == ()
    assert sz.redact(CLEAN, SALT) == CLEAN


# --- end to end: a public file:// run holding each shape never leaves ------------------------------

_KEY_BODY = "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu"
#: One fixed example of each shape: (the text, what must not be sent or recorded).
_EXAMPLES: dict[str, tuple[str, str]] = {
    "stripe": ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    "aws-access-key-id": ("AKIAQ3EGRBGEXKMZT7NW", "AKIAQ3EGRBGEXKMZT7NW"),
    "aws-id-then-secret": ("AKIAQ3EGRBGEXKMZT7NW,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",
                           "kT3vQ9mZ/pL2xR8wN5cB1yH7jF4dG6sA0eU+iO3q"),
    "aws-secret-after-name": ("aws-secret-key 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",
                              "kT3vQ9mZ/pL2xR8wN5cB1yH7jF4dG6sA0eU+iO3q"),
    "github": ("ghp_" + "R4nd0mT0k3nV4lu3AbCdEfGhIjKlMnOpQrSt", "ghp_" + "R4nd0mT0k3nV4lu3AbCdEfGhIjKlMnOpQrSt"),
    "gitlab": ("glpat-Xy7Kq2Lm9Np4Rs6Tv8Wz", "glpat-Xy7Kq2Lm9Np4Rs6Tv8Wz"),
    "slack": ("xoxb-2636542736-2364535789652-GkwFDQoHqzXDVsC6GzqYUypD",
              "xoxb-2636542736-2364535789652-GkwFDQoHqzXDVsC6GzqYUypD"),
    "google-api-key": ("AIzaSyB7xQ2mK9pL4nR6tV8wZ1cE3gH5jN0sD2f", "AIzaSyB7xQ2mK9pL4nR6tV8wZ1cE3gH5jN0sD2f"),
    "npm": ("npm_Q2mK9pL4nR6tV8wZ1cE3gH5jN0sD2fA7bC9Z", "npm_Q2mK9pL4nR6tV8wZ1cE3gH5jN0sD2fA7bC9Z"),
    "pypi": ("pypi-AgEIcHlwaS5vcmc" + "Q2mK9pL4nR6tV8wZ1cE3gH5jN0sD2fA7bC9" * 2,
             "pypi-AgEIcHlwaS5vcmc" + "Q2mK9pL4nR6tV8wZ1cE3gH5jN0sD2fA7bC9" * 2),
    "openai": ("sk-proj-" + "Q2mK9pL4nR6tV8wZ1c" * 3 + "T3BlbkFJ" + "Q2mK9pL4nR6tV8wZ1c" * 3,
               "sk-proj-" + "Q2mK9pL4nR6tV8wZ1c" * 3 + "T3BlbkFJ" + "Q2mK9pL4nR6tV8wZ1c" * 3),
    "anthropic": ("sk-ant-api03-" + "Q2mK9pL4nR6t-V8wZ1_" * 4 + "cE3gH5jN0sD2fA7xy" + "AA",
                  "sk-ant-api03-" + "Q2mK9pL4nR6t-V8wZ1_" * 4 + "cE3gH5jN0sD2fA7xy" + "AA"),
    "private-key": ("-----BEGIN RSA PRIVATE KEY-----\n" + _KEY_BODY + "\n-----END RSA PRIVATE KEY-----", _KEY_BODY),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ3b3JrZXIifQ.c2lnbmF0dXJlLXZhbHVl",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ3b3JrZXIifQ.c2lnbmF0dXJlLXZhbHVl"),
    "basic-header": ("Authorization: Basic ZGVwbG95OmIzc3QtcGFzc3dvcmQ=", "ZGVwbG95OmIzc3QtcGFzc3dvcmQ="),
    "basic-bare": ("basic ZGVwbG95OmIzc3QtcGFzc3dvcmQ=", "ZGVwbG95OmIzc3QtcGFzc3dvcmQ="),
    "bearer-header": ("Authorization: Bearer Q2mK9pL4nR6tV8wZ1cE3", "Q2mK9pL4nR6tV8wZ1cE3"),
    "url-with-password": ("https://deploy:Q2MK9PL4NR6T@203.0.113.7/hook", "Q2MK9PL4NR6T"),
    # The security review's reproductions (issue 39, findings 4 and 5).
    "authorization-in-json": (json.dumps({"Authorization": "Token 9f8e7d6c5b4a39281706f5e4d3c2b1a0"}),
                              "9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
    "keyword-in-json": (_dumps({"api_key": "Q2mK9pL4nR6tV8wZ"}, 1), "Q2mK9pL4nR6tV8wZ"),
    "aws-secret-in-json": (_dumps({"aws_secret_access_key": "kT3vQ9mZ/pL2xR8wN5cB1yH7jF4dG6sA0eU+iO3q"}, 1),
                           "kT3vQ9mZ/pL2xR8wN5cB1yH7jF4dG6sA0eU+iO3q"),
    "aws-secret-in-a-table": ("||  SecretAccessKey |  kT3vQ9mZ/pL2xR8wN5cB1yH7jF4dG6sA0eU+iO3q  ||",
                              "kT3vQ9mZ/pL2xR8wN5cB1yH7jF4dG6sA0eU+iO3q"),
    "private-key-in-json": (json.dumps(json.dumps("-----BEGIN RSA PRIVATE KEY-----\n" + _KEY_BODY
                                                  + "\n-----END RSA PRIVATE KEY-----")), _KEY_BODY),
    "url-password-with-slash": ("postgres://admin:abc/def@db", "abc/def"),
    "url-password-encoded": ("https://app.example.com/login?next=postgres%3A%2F%2Fadmin%3APw8x2Kq%40db%2Fapp",
                             "Pw8x2Kq"),
}


def test_every_shape_has_a_fixed_example():
    assert set(_EXAMPLES) == set(SHAPES)


def test_a_public_file_run_holding_any_shape_is_refused_and_sends_nothing(backend, tmp_path):
    box = outbox(tmp_path)
    with Ledger(backend.address()) as lg:
        for n, shape in enumerate(sorted(_EXAMPLES)):
            text, secret = _EXAMPLES[shape]
            # An owner per run: one owner may have ten active runs at a time.
            run = ready_run(lg, tmp_path, f"file://{box}", content=f"# Result\n\nDeployed.\n{text}\n",
                            public=True, owner=f"owner{n}")
            doc = lg.sanitize(run, by=f"owner{n}")
            assert not doc["passed"], shape
            assert ("secret", "artifact report.md", 4) in {(f["detector"], f["item"], f["line"])
                                                           for f in doc["findings"]}, (shape, doc["findings"])
            assert secret not in json.dumps(doc)
            before = [(r.seq, r.type) for r in lg.log(run)]
            with pytest.raises(SanitizationRequired, match="failed"):
                lg.deliver(run, "v1", send=True, by=f"owner{n}")
            assert [(r.seq, r.type) for r in lg.log(run)] == before, shape
            assert list(box.iterdir()) == [], shape


def test_the_three_shapes_of_the_report_through_the_cli(tmp_path):
    """The issue's reproduction: a Stripe live key, an AWS secret access key after its key
    id, and Basic credentials in one public result: sanitize exits 1, deliver --send is
    refused and the outbox stays empty."""
    h = Handoff(str(tmp_path / "ledger.db"))
    box = outbox(tmp_path)
    art = tmp_path / "report.md"
    art.write_text("stripe: sk_live_4eC39HqLyjWDarjtT1zdp7dc\n"
                   "AKIAQ3EGRBGEXKMZT7NW,kT3vQ9mZ/pL2xR8wN5cB1yH7jF4dG6sA0eU+iO3q\n"
                   "curl -H 'Authorization: Basic ZGVwbG95OmIzc3QtcGFzc3dvcmQ=' https://example.com\n")
    run = h("open", "--goal", "g", "--target", f"file://{box}", "--owner", "alice", "--public").stdout.strip()
    lease = h("claim", run, "--worker", "w1").stdout.strip()
    for s in ("planning", "executing"):
        h("transition", run, "--lease", lease, "--to", s)
    h("artifact", run, "--lease", lease, str(art))
    h("transition", run, "--lease", lease, "--to", "verifying")
    h("evidence", run, "--kind", "tests", "--outcome", "pass", "--lease", lease)
    h("submit", run, "--lease", lease, "--summary", "done")
    doc = h.json("sanitize", run, "--by", "alice", code=1)
    assert doc["passed"] is False
    assert {(f["detector"], f["line"]) for f in doc["findings"]} >= {("secret", 1), ("secret", 2), ("secret", 3)}
    before = h.json("log", run)
    refused = h("deliver", run, "--by", "alice", "--delivery-key", "v1", "--send", "--json", code=1)
    assert json.loads(refused.stderr or refused.stdout)["error"]["type"] == "SanitizationRequired"
    assert h.json("log", run) == before and list(box.iterdir()) == []


def test_the_lease_blocks_scrub_removes_each_shape(tmp_path):
    """A worker's exception text holding any shape is recorded without it (the lease
    block's scrub, handoff.lease.bounded_text)."""
    from handoff.lease import bounded_text

    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice")
        for shape, (text, secret) in sorted(_EXAMPLES.items()):
            out = bounded_text(f"RuntimeError: deploy failed with {text} (retrying)", lg, run)
            assert secret not in out and "RuntimeError: deploy failed with" in out, shape


# --- hostile text: the scan stays linear ----------------------------------------------------------

#: Text built to make the detectors of escaped quotes, escaped line ends, URL passwords and
#: table cells try again and again: n repeats of a near miss.
HOSTILE = {
    "escaped-quotes": lambda n: 'Authorization\\\\\\"' * n + "api_key" + "\\" * n + ":" + "\\" * n,
    "escaped-line-ends": lambda n: "-----BEGIN PRIVATE KEY-----" + "\\" * n + "x" + "\\\\n" * n,
    "url-passwords": lambda n: "a://b:" * n + "x://u:p/" * n + "a%3A%2F%2Fb%3A" * n,
    "table-cells": lambda n: "SecretAccessKey | " * n + "aws_key\\\\\\ " * n,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_text_is_scanned_in_linear_time(kind):
    """Eight times the text takes about eight times as long, not sixty-four: each size's
    best of seven runs, scan and redact, the two sizes taking turns so a burst of load on a
    busy machine falls on both (a quadratic scan fails by far)."""
    import time

    texts = {n: HOSTILE[kind](n) for n in (2_000, 16_000)}
    best = {n: float("inf") for n in texts}
    for _ in range(7):
        for n, text in texts.items():
            t0 = time.perf_counter()
            sz.scan([("t", text)])
            sz.redact(text, SALT)
            best[n] = min(best[n], time.perf_counter() - t0)
    small, large = best[2_000], best[16_000]
    assert large < 24 * max(small, 1e-4), (kind, small, large)
