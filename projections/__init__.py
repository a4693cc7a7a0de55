"""Materialized views folded from the log: kept inline, rebuildable, checkable."""

from .engine import PROJECTIONS, Projection, Projector

__all__ = ["PROJECTIONS", "Projection", "Projector"]
