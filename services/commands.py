"""CLI verbs beyond `serve`: filled in as the suite grows."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    return None
