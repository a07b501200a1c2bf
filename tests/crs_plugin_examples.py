"""CRS plug-ins, as a researcher would write them, for the tests of loading them by name
(tests/unit/test_crs_plugins_external.py, tests/integration/test_crs_plugins_external_grpc.py, the
test_crs_review19_plugins_* tests).

Named in a CRS's settings as `tests.crs_plugin_examples:AvoidHostA` (the repository's root on PYTHONPATH).
"""

from __future__ import annotations

import sys
import threading

from cross_resource_scheduler.plugins import Context, Filter, Weigher
from cross_resource_scheduler.view import Node


class AvoidHostA(Filter):
    """Keeps instances off the host whose id is "a" (e.g. one being drained)."""

    name = "avoid_a"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return node.physical_id != "a"


class NoBatch(Filter):
    """A site that takes no batch work: no host for a group whose name starts with "batch"."""

    name = "no_batch"

    def relevant(self, ctx: Context) -> bool:
        return ctx.group.name.startswith("batch")

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return False


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


class OwnBase(BaseException):
    """What a plug-in may define: no Exception, so gRPC's worker would not catch it."""


class Moody(Filter):
    """Fails by the group's name: "boom" raises, "exit" calls sys.exit, "huge" raises a long message, "ctrl-c"
    raises KeyboardInterrupt, "base" a BaseException of its own; passes everything for any other group."""

    name = "moody"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        if ctx.group.name == "boom":
            raise RuntimeError("the moody filter broke")
        if ctx.group.name == "exit":
            sys.exit(3)
        if ctx.group.name == "huge":
            raise ValueError("x" * 100_000)
        if ctx.group.name == "ctrl-c":
            raise KeyboardInterrupt
        if ctx.group.name == "base":
            raise OwnBase("not an Exception")
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


class LowLoad(Filter):
    """Keeps instances off hosts with more than half their cores in use, read from `node.used` (as a
    researcher writes it naturally: the never-fits proof shows it the nodes empty, so a busy cloud is
    "in use", not "never fits")."""

    name = "lowload"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        cap = node.capacity.get("cores", 0.0)
        return cap > 0 and node.used.get("cores", 0.0) <= cap / 2


class LowLoadAvail(Filter):
    """LowLoad's rule read from `node.avail` and `node.free()` instead (either must agree)."""

    name = "lowload_avail"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        cap = node.capacity.get("cores", 0.0)
        return cap > 0 and node.avail.get("cores", 0.0) >= cap / 2 and node.free("cores") >= cap / 2


class IdleFirst(Weigher):
    """Scores a host by the share of its cores not in use, read from `node.used`."""

    name = "idle_first"

    def weigh(self, node: Node, ctx: Context) -> float:
        cap = node.capacity.get("cores", 0.0)
        return 1.0 - node.used.get("cores", 0.0) / cap if cap > 0 else 0.0


class AlwaysBoom(Filter):
    """Raises for every node of every group."""

    name = "always_boom"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        raise RuntimeError("the always_boom filter broke")


class ExitsWhenMade(Filter):
    """Its constructor calls sys.exit(4) (no argument is missing)."""

    name = "exits_when_made"

    def __init__(self) -> None:
        sys.exit(4)

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return True


class BrokenWhenMade(Weigher):
    """Its constructor raises RuntimeError (a table it reads is missing, say)."""

    name = "broken_when_made"

    def __init__(self) -> None:
        raise RuntimeError("the weights table is missing")

    def weigh(self, node: Node, ctx: Context) -> float:
        return 0.5


class TypeErrorWhenMade(Filter):
    """Its constructor raises a TypeError of its own (no argument is missing)."""

    name = "type_error_when_made"

    def __init__(self) -> None:
        int([])  # type: ignore[call-overload]

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return True


class AlwaysNaN(Weigher):
    """Scores NaN for every node."""

    name = "always_nan"

    def weigh(self, node: Node, ctx: Context) -> float:
        return float("nan")


class FailsPastH999(Filter):
    """Raises for hosts h1000 and up (`harness bench crs` has them only in its 5,000-host latency view)."""

    name = "fails_past_h999"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        if node.physical_id.startswith("h") and node.physical_id[1:].isdigit() and int(node.physical_id[1:]) > 999:
            raise LookupError(f"no rule for {node.physical_id}")
        return True


class Sloppy(Filter):
    """Answers by the group's name: "none" forgets to return (None), "text" returns "no", "numpy" a numpy bool
    (False for host a), any other True."""

    name = "sloppy"

    def host_passes(self, node: Node, ctx: Context):  # type: ignore[no-untyped-def]  # what it returns varies
        if ctx.group.name == "none":
            return None
        if ctx.group.name == "text":
            return "no"
        if ctx.group.name == "numpy":
            import numpy as np
            return np.bool_(node.physical_id != "a")
        return True


class NodeOnly(Filter):
    """host_passes without the context: a signature the CRS cannot call."""

    name = "node_only"

    def host_passes(self, node: Node) -> bool:  # type: ignore[override]
        return True


class ScorerWithoutCtx(Weigher):
    name = "scorer_without_ctx"

    def scorer(self) -> float:  # type: ignore[override]
        return 0.5


ENTERED = threading.Event()     # Blocks is in host_passes
RELEASED = threading.Event()    # Blocks may return


class Blocks(Filter):
    """A plug-in that does not return (until a test sets RELEASED, or 30 s pass): as one looping forever."""

    name = "blocks"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        ENTERED.set()
        RELEASED.wait(30)
        return True


class FirstConstraint(Filter):
    """Reads the request's first constraint: raises IndexError on a request without any (a natural bug)."""

    name = "first_constraint"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return ctx.constraints[0].kind != "nothing"


class DrainAll(Filter):
    """Removes every host."""

    name = "drain_all"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return False


class FailsOnGeneratedSites(Filter):
    """Raises for hosts of sites named as the compute IRM's inventory generator names them ("site-0"...): it
    passes `harness bench crs`'s in-process trials (sites "s0", "s1") and fails every request of its run."""

    name = "fails_on_generated_sites"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        if node.location.site.startswith("site-"):
            raise LookupError(f"no rule for site {node.location.site}")
        return True
