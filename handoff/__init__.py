"""handoff-ledger's Python API: ``from handoff import Ledger``."""

from ledger.errors import *  # noqa: F401,F403
from ledger.store import Actor

from .api import Ledger, Outcome, import_into, measure

__all__ = ["Ledger", "Outcome", "Actor", "measure", "import_into"]
