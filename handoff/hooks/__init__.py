"""Coding agents on the ledger with no code: their lifecycle hooks, recorded as runs.

Claude Code, Codex, OpenHands and Goose run a command with a JSON payload on stdin at
session start, around each tool call, on a permission prompt, at the end of a turn and at
the session's end. ``handoff hook <harness>`` (or the lean ``python -m handoff.hooks
<harness>``, which the installed settings use) is that command: one session is one run
(docs/coding-agents.md has the mapping).

The package is split by what a hook process pays for. ``payloads`` (each harness's payload
read into one shape), ``spool`` (the state directory, the journal and the 0600 state file)
and ``entry`` (the hook process itself) import the standard library only: a hook appends
the payload to the journal and exits. ``replay`` writes the journal to the ledger (it is
the part that imports the ledger); ``settings`` installs and removes the hooks.
"""
