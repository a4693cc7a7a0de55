"""The secret detector against the shapes secrets really come in, and the sanitizer
against text dressed up to slip past it (docs/delivery.md, "The sanitization gate").

Config files quote their keys: ``{"password": "..."}`` (JSON), ``{'token': '...'}``
(Python), ``\\"api_key\\": ...`` (JSON inside a string). Text that hides a key behind an
invisible character, fullwidth letters, UTF-16 without a byte-order mark or a NUL must
be read as what it says, or not pass at all.
"""

from __future__ import annotations

import codecs
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handoff.facade import Ledger
from handoff.ledger.errors import SanitizationRequired
from handoff.reducers import sanitize as sz

SECRET = "Zq7rT2vX9kLm"


def detectors(text: str) -> set[str]:
    return {f.detector for f in sz.scan([("artifact", text)])}


@pytest.mark.parametrize("text", [
    '{"password": "%s"}',
    '{"api_key": "%s"}',
    "{'token': '%s'}",
    '{"password":"%s"}',
    '"secret" : "%s"',
    '{\\"api_key\\": \\"%s\\"}',            # JSON inside a JSON string
    "password = '%s'",
    "'password' => '%s'",                    # PHP, Ruby
    "API_KEY=%s",
    "  client_secret: %s",                   # YAML
    "access_token: \"%s\"",
    "<password>%s</password>",
    "aws_secret_access_key = %s",
    '{"apiKey": "%s"}',
    '{"auth-token": "%s"}',
])
def test_common_config_shapes_are_found(text):
    assert "secret" in detectors(text % SECRET), text


@pytest.mark.parametrize("text", ['{"password": "short!"}', "{'token': 'a quoted phrase'}"])
def test_a_quoted_value_needs_no_length_of_eight(text):
    """A value someone quoted after a secret's keyword is a value, even a short one."""
    assert "secret" in detectors(text)


@pytest.mark.parametrize("text", [
    '{"max_tokens": 4096}', '{"token_env": "HANDOFF_TOKEN_ENV"}', "token budget: 3", '"tokens": ["a", "b"]',
    "the password policy: see the wiki", '{"password": ""}',
])
def test_near_misses_stay_quiet(text):
    """Broad, not blind: a count of tokens or the name of a variable is not a secret."""
    assert "secret" not in detectors(text), text


KEYWORDS = ["password", "passwd", "secret", "api_key", "apikey", "api-key", "token", "access_token",
            "client_secret", "auth_token", "private_key", "secret_key"]
SHAPES = [
    '{{"{k}": "{v}"}}', "{{'{k}': '{v}'}}", '{k} = "{v}"', "{k}={v}", "{k}: {v}", '"{k}" : \'{v}\'',
    '{{\\"{k}\\":\\"{v}\\"}}', "{k}:\n  {v}", "export {k}='{v}'", "'{k}' => '{v}'",
    '{k}:\t"{v}"', "<{k}>{v}</{k}>",
]
VALUE = st.text(st.sampled_from("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ0123456789+/_-.!#$%^&*()"),
                min_size=8, max_size=48)
CASE = st.sampled_from([str.lower, str.upper, str.title, lambda s: s])


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(KEYWORDS), case=CASE, shape=st.sampled_from(SHAPES), value=VALUE,
       before=st.text("abc xyz\n", max_size=30), after=st.text("abc xyz\n", max_size=30))
def test_a_random_secret_in_a_random_config_shape_is_always_found(key, case, shape, value, before, after):
    text = before + "\n" + shape.format(k=case(key), v=value) + "\n" + after
    found = sz.scan([("config", text)])
    assert any(f.detector == "secret" for f in found), text
    assert all(value not in repr(f) for f in found)


# --- evasions: what the text says, not how it is spelled ----------------------------------

@pytest.mark.parametrize("spelled", [
    "pass\u200bword",        # zero-width space
    "pass\u00adword",        # soft hyphen
    "pass\u2060word",        # word joiner
    "\ufeffpassword",        # a byte-order mark inside the text
    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",  # fullwidth letters
])
def test_invisible_or_compatibility_characters_do_not_hide_a_key(spelled):
    assert "secret" in detectors(f'{{"{spelled}": "{SECRET}"}}')


def test_an_invisible_character_inside_the_value_does_not_hide_it():
    assert "secret" in detectors("AKIA\u200bABCDEFGHIJKLMNOP")


@pytest.mark.parametrize("address", ["jos\u00e9@b\u00fccher.de", "user@\u4f8b\u3048.jp", "\u0438\u0432\u0430\u043d@\u043f\u0440\u0438\u043c\u0435\u0440.\u0440\u0444",
                                     "bob@xn--bcher-kva.example", "ops@m\u00fcnchen.corp.example"])
def test_an_internationalised_email_address_is_found(address):
    assert "email" in detectors(f"write to {address} for access")


def test_a_nul_inside_a_key_makes_the_text_unscannable():
    assert detectors(f"pass\x00word={SECRET}\n") == {"unscannable"}


def test_utf16_without_a_byte_order_mark_is_read_as_what_it_says():
    for codec in ("utf-16-le", "utf-16-be"):
        raw = f'config\n{{"password": "{SECRET}"}}\n'.encode(codec)
        assert "secret" in {f.detector for f in sz.scan([("artifact", raw)])}, codec
        # The bundle hands over UTF-8 decodable bytes as text: ASCII in UTF-16 is valid UTF-8.
        assert "secret" in detectors(raw.decode("utf-8")), codec


def test_utf16_padding_hides_no_utf8_secret_after_it():
    """Mostly UTF-16, so it is read as UTF-16, and a plain UTF-8 secret appended would be
    gibberish that way: it is read as its bytes without the NULs too."""
    raw = ("lorem ipsum dolor sit amet\n" * 40).encode("utf-16-le") + f"\npassword={SECRET}\n".encode()
    raw += b"\x00" * (len(raw) % 2)
    assert "secret" in {f.detector for f in sz.scan([("artifact", raw)])}


def test_utf16_with_a_byte_order_mark_is_read_too():
    raw = codecs.BOM_UTF16_LE + "token: Zq7rT2vX9kLm\n".encode("utf-16-le")
    assert "secret" in {f.detector for f in sz.scan([("artifact", raw)])}


def test_binary_data_stays_unscannable_whatever_it_holds():
    """Reading random bytes as UTF-16 would make it text no detector matches: it must not
    pass that way."""
    rnd = random.Random(7)
    for n in (2, 64, 4096):
        for _ in range(20):
            raw = bytes(rnd.randrange(256) for _ in range(n))
            raw = raw[: n // 2] + b"\x00" * 8 + raw[n // 2:]  # NULs, as binary has
            assert {f.detector for f in sz.scan([("blob", raw)])} == {"unscannable"}
    # Binary that is mostly NULs on one side, as UTF-16 text has, is still not text.
    raw = b"".join(bytes((rnd.randrange(256), 0)) for _ in range(512))
    assert {f.detector for f in sz.scan([("blob", raw)])} == {"unscannable"}


def test_clean_utf16_text_passes():
    assert sz.scan([("notes", "All checks passed.\nNothing to see.\n".encode("utf-16-le"))]) == ()


def _public_run(lg: Ledger, tmp_path, url: str, data: bytes) -> str:
    path = tmp_path / "config.json"
    path.write_bytes(data)
    run = lg.open(goal="ship the config", target=url, owner="alice", public=True)
    tok = lg.claim(run, "w1")
    for s in ("planning", "executing"):
        lg.transition(run, tok, s)
    lg.artifact(run, tok, str(path))
    lg.transition(run, tok, "verifying")
    lg.evidence(run, "tests", "pass", lease=tok)
    lg.submit(run, tok, "the config")
    return run


@pytest.mark.parametrize("data", [
    f'{{"password": "{SECRET}"}}\n'.encode(),
    f'{{"api_key": "{SECRET}"}}\n'.encode("utf-16-le"),
    f"pass\u200bword: {SECRET}\n".encode(),
    f"pass\x00word: {SECRET}\n".encode(),
], ids=["json", "utf16le", "zero-width", "nul"])
def test_such_an_artifact_never_reaches_a_public_target(tmp_path, receiver, data):
    lg = Ledger(str(tmp_path / "l.db"))
    run = _public_run(lg, tmp_path, receiver.url, data)
    doc = lg.sanitize(run, by="alice")
    assert not doc["passed"] and {f["detector"] for f in doc["findings"]} & {"secret", "unscannable"}
    before = [r.seq for r in lg.log(run)]
    with pytest.raises(SanitizationRequired, match="failed"):
        lg.deliver(run, "v1", send=True, by="alice")
    assert [r.seq for r in lg.log(run)] == before and receiver.requests == []
    lg.close()
