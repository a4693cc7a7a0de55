"""The ``handoff`` command (placeholder until the CLI lands)."""


def main() -> None:  # pragma: no cover
    raise SystemExit("handoff: the command line is not built yet")
