"""Bridges between the ledger and the frameworks agents run in.

Each integration is a module of its own, imported only by whoever uses it: the SDK it
speaks to is an optional extra (``pip install 'handoff-ledger[mcp]'`` and the like), so
this package imports nothing at all.
"""
