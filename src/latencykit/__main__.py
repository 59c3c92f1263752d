"""The ``latencykit`` command: ``latencykit lab`` runs the latency lab."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``latencykit`` command."""
    from .lab import cli

    parser = argparse.ArgumentParser(prog="latencykit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cli.build_parser(
        commands.add_parser("lab", help="run the latency lab (offline, against a fake provider)")
    )
    args = parser.parse_args(argv)
    return cli.run_from_args(args)


if __name__ == "__main__":
    raise SystemExit(main())
