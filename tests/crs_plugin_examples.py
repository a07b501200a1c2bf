"""CRS plug-ins, as a researcher would write them, for the tests of loading them by name
(tests/unit/test_crs_plugins_external.py, tests/integration/test_crs_plugins_external_grpc.py).

Named in a CRS's settings as `tests.crs_plugin_examples:AvoidHostA` (the repository's root on PYTHONPATH).
"""

from __future__ import annotations

import sys

from cross_resource_scheduler.plugins import Context, Filter, Weigher
from cross_resource_scheduler.view import Node


class AvoidHostA(Filter):
    """Keeps instances off the host whose id is "a" (e.g. one being drained)."""

    name = "avoid_a"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return node.physical_id != "a"


class PreferHostC(Weigher):
    """Scores the host whose id is "c" 1, every other 0."""

    name = "prefer_c"

    def weigh(self, node: Node, ctx: Context) -> float:
        return 1.0 if node.physical_id == "c" else 0.0


class Overeager(Weigher):
    """Scores out of 0..1: 5 for host "b", -3 for host "a", 1 for any other (clipped: 1, 0, 1)."""

    name = "overeager"

    def weigh(self, node: Node, ctx: Context) -> float:
        return {"b": 5.0, "a": -3.0}.get(node.physical_id, 1.0)


class Moody(Filter):
    """Fails by the group's name: "boom" raises, "exit" calls sys.exit, "huge" raises a long message;
    passes everything for any other group."""

    name = "moody"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        if ctx.group.name == "boom":
            raise RuntimeError("the moody filter broke")
        if ctx.group.name == "exit":
            sys.exit(3)
        if ctx.group.name == "huge":
            raise ValueError("x" * 100_000)
        return True


class Wonky(Weigher):
    """Scores NaN for group "nan", a text for group "text", 0.5 for any other."""

    name = "wonky"

    def weigh(self, node: Node, ctx: Context) -> float:
        if ctx.group.name == "nan":
            return float("nan")
        if ctx.group.name == "text":
            return "high"  # type: ignore[return-value]
        return 0.5


class NotAFilter:
    """Has a filter's methods, but is no Filter."""

    name = "not_a_filter"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return True


class Nameless(Filter):
    """Forgets to set `name`."""

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return True


class PosesAsCapacity(Filter):
    """Takes a built-in's name."""

    name = "capacity"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return True


class DoesNothing(Weigher):
    """Implements neither weigh nor scorer."""

    name = "does_nothing"


class NeedsArguments(Weigher):
    """Cannot be made with no arguments."""

    name = "needs_arguments"

    def __init__(self, table: dict) -> None:
        self.table = table

    def weigh(self, node: Node, ctx: Context) -> float:
        return self.table.get(node.physical_id, 0.0)
