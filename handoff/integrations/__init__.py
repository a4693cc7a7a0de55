"""Bridges between the ledger and the frameworks agents run in, each behind an optional extra.

``mcp_server`` (an MCP server), ``otel`` (OpenTelemetry traces), ``pydantic_ai`` and
``openai_agents``. Each is a module of its own, imported only by code that uses it; the SDK
it speaks to is an optional extra (``pip install '.[mcp]'`` in the checkout and the like), so
importing this package imports none of them.
"""
