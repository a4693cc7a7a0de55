"""Bridges to the tools agent builders already run, each behind an optional extra.

``otel`` (OpenTelemetry traces), ``pydantic_ai`` and ``openai_agents``. Importing this
package imports none of them: each module is imported only by code that uses it.
"""
