"""``python -m handoff.hooks HARNESS``: the hook command the installed settings run
(handoff/hooks/entry.py). Lean on purpose: the standard library and this package only."""

import sys

from handoff.hooks.entry import main

if __name__ == "__main__":
    sys.exit(main())
