"""docs/events.md documents every event type and every field, so it cannot drift."""

import os
import re

import msgspec

from handoff.ledger import events as ev

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "events.md")


def test_every_event_type_has_a_section_naming_its_fields():
    text = open(DOC).read()
    sections = dict(re.findall(r"^### (\w+)\n(.*?)(?=^### |\Z)", text, flags=re.M | re.S))
    for tag, cls in ev.EVENT_TYPES.items():
        assert tag in sections, f"docs/events.md has no section for {tag}"
        for field in msgspec.inspect.type_info(cls).fields:
            assert f"`{field.name}`" in sections[tag], f"docs/events.md: {tag} does not mention {field.name}"
    assert set(sections) == set(ev.EVENT_TYPES), "docs/events.md documents events that do not exist"
