"""The CRS capacity view: generations, indexes, down managers and assumptions (cross_resource_scheduler.view)."""

from __future__ import annotations

from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2


def res(rid: str, gen: int, *, cores: float = 8, used: float = 0, rtype: str = "vm", site: str = "s1",
        rack: str = "r1", traits: tuple[str, ...] = (), props: dict[str, float] | None = None
        ) -> common_pb2.PhysicalResource:
    return common_pb2.PhysicalResource(
        id=rid, resource_type=rtype, capacity={"cores": cores}, used={"cores": used},
        properties=props or {}, traits=list(traits),
        location=common_pb2.Location(site=site, rack=rack, host=rid), generation=gen)


def keys(nodes) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(n.key for n in nodes)


# -- upsert and generations ----------------------------------------------------

def test_upsert_creates_then_updates_in_place() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h1", 1, used=2, traits=("ssd",), props={"frequency_ghz": 2.2}))
    assert n.key == "m/h1"
    assert n.free("cores") == 6 and n.traits == frozenset({"ssd"}) and n.properties == {"frequency_ghz": 2.2}
    n2 = v.upsert("m", res("h1", 2, used=5, traits=("gpu",)))
    assert n2 is n  # same location and type: updated in place
    assert n.free("cores") == 3 and n.generation == 2 and n.traits == frozenset({"gpu"})
    assert keys(v.of_type("vm")) == ["m/h1"]  # not indexed twice


def test_stale_event_is_ignored() -> None:
    v = CapacityView()
    v.upsert("m", res("h1", 5, used=4))
    before = v.version
    n = v.upsert("m", res("h1", 3, used=0))
    assert n.generation == 5 and n.used["cores"] == 4
    assert v.version == before  # nothing changed: watchers are not woken
    # an event of the same generation (e.g. a snapshot of the current state) is applied
    v.upsert("m", res("h1", 5, used=1))
    assert v.nodes["m/h1"].used["cores"] == 1


def test_version_bumps_on_every_change() -> None:
    v = CapacityView()
    v0 = v.version
    v.upsert("m", res("h1", 1))
    v.upsert("m", res("h1", 2, used=1))
    v.set_down("m", True)
    v.remove("m", "h1")
    assert v.version == v0 + 4
    v.remove("m", "nope")  # nothing removed
    assert v.version == v0 + 4


def test_same_id_under_two_managers_are_two_nodes() -> None:
    v = CapacityView()
    v.upsert("m1", res("h1", 1))
    v.upsert("m2", res("h1", 1))
    assert keys(v.of_type("vm")) == ["m1/h1", "m2/h1"]


def test_to_proto_round_trip() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h1", 4, used=3, traits=("b", "a"), props={"f": 1.0}))
    p = n.to_proto()
    assert p.id == "h1" and p.manager == "m" and p.generation == 4
    assert dict(p.capacity) == {"cores": 8} and dict(p.used) == {"cores": 3}
    assert list(p.traits) == ["a", "b"] and p.location.rack == "r1"


# -- indexes -------------------------------------------------------------------

def test_indexes_by_type_rack_and_site() -> None:
    v = CapacityView()
    v.upsert("m", res("a", 1, site="s1", rack="r1"))
    v.upsert("m", res("b", 1, site="s1", rack="r1"))
    v.upsert("m", res("c", 1, site="s1", rack="r2"))
    v.upsert("m", res("d", 1, site="s2", rack="r1"))  # same rack name, other site
    v.upsert("f", res("x", 1, rtype="fpga", site="s1", rack="r1"))
    assert keys(v.of_type("vm")) == ["m/a", "m/b", "m/c", "m/d"]
    assert keys(v.of_type("fpga")) == ["f/x"]
    assert v.of_type("nothing") == []
    assert keys(v.in_rack("vm", "s1", "r1")) == ["m/a", "m/b"]
    assert keys(v.in_rack("vm", "s2", "r1")) == ["m/d"]
    assert keys(v.in_rack("fpga", "s1", "r1")) == ["f/x"]
    assert keys(v.in_site("vm", "s1")) == ["m/a", "m/b", "m/c"]
    assert keys(v.in_site("vm", "s2")) == ["m/d"]
    assert v.resource_types() == ["fpga", "vm"]


def test_moving_a_resource_reindexes_it() -> None:
    v = CapacityView()
    v.upsert("m", res("a", 1, site="s1", rack="r1"))
    v.upsert("m", res("a", 2, site="s2", rack="r7"))
    assert v.in_rack("vm", "s1", "r1") == [] and v.in_site("vm", "s1") == []
    assert keys(v.in_rack("vm", "s2", "r7")) == ["m/a"]
    assert keys(v.of_type("vm")) == ["m/a"]
    v.upsert("m", res("a", 3, rtype="fpga", site="s2", rack="r7"))
    assert v.of_type("vm") == [] and keys(v.of_type("fpga")) == ["m/a"]
    assert v.resource_types() == ["fpga"]


def test_remove_and_drop_manager_unindex() -> None:
    v = CapacityView()
    v.upsert("m1", res("a", 1))
    v.upsert("m1", res("b", 1, rack="r2"))
    v.upsert("m2", res("c", 1))
    v.remove("m1", "a")
    assert keys(v.of_type("vm")) == ["m1/b", "m2/c"]
    assert keys(v.in_rack("vm", "s1", "r1")) == ["m2/c"]
    v.drop_manager("m1")
    assert keys(v.of_type("vm")) == ["m2/c"] and v.in_rack("vm", "s1", "r2") == []
    assert set(v.nodes) == {"m2/c"}


def test_down_managers_are_excluded_from_every_read() -> None:
    v = CapacityView()
    v.upsert("up", res("a", 1))
    v.upsert("down", res("b", 1))
    v.set_down("down", True)
    assert v.is_down("down") and not v.is_down("up")
    assert keys(v.of_type("vm")) == ["up/a"]
    assert keys(v.in_rack("vm", "s1", "r1")) == ["up/a"]
    assert keys(v.in_site("vm", "s1")) == ["up/a"]
    assert keys(v.up_nodes()) == ["up/a"]
    # a down manager's nodes are kept (it may come back), just not offered
    assert "down/b" in v.nodes
    v.set_down("down", False)
    assert keys(v.of_type("vm")) == ["down/b", "up/a"]
    assert keys(v.up_nodes()) == ["down/b", "up/a"]


def test_while_a_manager_is_down_the_up_lists_are_made_once_until_which_nodes_are_up_changes() -> None:
    v = CapacityView()
    for i in range(3):
        v.upsert("up", res(f"a{i}", 1))
    v.upsert("down", res("b", 1))
    v.upsert("crs", res("site/m/c", 1))
    v.set_down("down", True)
    first = v.of_type("vm")
    assert keys(first) == ["crs/site/m/c", "up/a0", "up/a1", "up/a2"]
    v.upsert("up", res("a0", 2, used=3))                    # usage changes: the same nodes are up
    assert v.of_type("vm") is first and v.in_rack("vm", "s1", "r1") is v.in_rack("vm", "s1", "r1")
    # Each change of which nodes are up is seen at the next read: joined, left, below down, manager back.
    v.upsert("up", res("a3", 1))
    assert keys(v.of_type("vm")) == ["crs/site/m/c", "up/a0", "up/a1", "up/a2", "up/a3"]
    v.remove("up", "a1")
    assert keys(v.in_site("vm", "s1")) == ["crs/site/m/c", "up/a0", "up/a2", "up/a3"]
    down_below = res("site/m/c", 2)
    down_below.manager_down = True
    v.upsert("crs", down_below)
    assert keys(v.in_rack("vm", "s1", "r1")) == ["up/a0", "up/a2", "up/a3"]
    v.upsert("up", res("a2", 2, rack="r2"))                 # moved: out of r1's list, in r2's
    assert keys(v.in_rack("vm", "s1", "r1")) == ["up/a0", "up/a3"] and keys(v.in_rack("vm", "s1", "r2")) == ["up/a2"]
    v.set_down("down", False)
    assert keys(v.of_type("vm")) == ["down/b", "up/a0", "up/a2", "up/a3"]
    v.upsert("crs", res("site/m/c", 3))                     # back below: nothing down, the index itself
    assert v.of_type("vm") is v._by_type["vm"]


# -- assumptions ---------------------------------------------------------------

def test_assume_reduces_free_capacity_and_accumulates() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10, used=1))
    v.assume("t1", n, {"cores": 3})
    v.assume("t2", n, {"cores": 2})
    assert n.free("cores") == 10 - 1 - 3 - 2


def test_uncommitted_assumption_survives_newer_events() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10))
    v.assume("t", n, {"cores": 4})
    v.upsert("m", res("h", 2, cores=10, used=1))  # some other change; our commit not yet confirmed
    assert n.free("cores") == 10 - 1 - 4


def test_committed_assumption_stays_until_a_newer_generation_then_goes() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10))
    v.assume("t", n, {"cores": 4})
    v.commit("t")
    assert n.free("cores") == 6  # commit alone does not drop it: the view has not seen the change
    v.upsert("m", res("h", 1, cores=10))  # same generation again (e.g. a re-sent snapshot)
    assert n.free("cores") == 6
    v.upsert("m", res("h", 2, cores=10, used=4))  # the IRM reports the VM: now counted in `used`
    assert n.free("cores") == 6  # counted once, not twice
    assert n.assumed == {}


def test_commit_after_the_event_already_arrived_settles_at_once() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10))
    v.assume("t", n, {"cores": 4})
    v.upsert("m", res("h", 2, cores=10, used=4))  # the event raced ahead of the commit
    assert n.free("cores") == 2  # still assumed: not committed yet
    v.commit("t")
    assert n.free("cores") == 6


def test_commit_with_the_managers_generation_waits_for_that_event_not_any_newer_one() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10))
    v.assume("t", n, {"cores": 4})  # placed against generation 1
    v.commit("t", {"m/h": 3})  # the IRM: our take made it generation 3
    v.upsert("m", res("h", 2, cores=10, used=1))  # someone else's change lands first
    assert n.free("cores") == 10 - 1 - 4  # still assumed: generation 2 does not include ours
    v.upsert("m", res("h", 3, cores=10, used=5))
    assert n.free("cores") == 5 and n.assumed == {}


def test_commit_with_a_generation_already_seen_settles_at_once() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10))
    v.assume("t", n, {"cores": 4})
    v.upsert("m", res("h", 2, cores=10, used=4))  # our change's event raced ahead of the reply
    v.commit("t", {"m/h": 2})
    assert n.free("cores") == 6 and n.assumed == {}


def test_forget_removes_only_that_assumption() -> None:
    v = CapacityView()
    a = v.upsert("m", res("a", 1, cores=10))
    b = v.upsert("m", res("b", 1, cores=10))
    v.assume("t1", a, {"cores": 3})
    v.assume("t1", b, {"cores": 1})
    v.assume("t2", a, {"cores": 2})
    v.forget("t1")
    assert a.free("cores") == 8 and b.free("cores") == 10
    v.forget("t1")  # idempotent
    assert a.free("cores") == 8
    v.forget("t2")
    assert a.free("cores") == 10 and a.assumed == {}


def test_commit_of_one_token_keeps_the_others() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10))
    v.assume("t1", n, {"cores": 3})
    v.assume("t2", n, {"cores": 2})
    v.commit("t1")
    v.upsert("m", res("h", 2, cores=10, used=3))
    assert n.free("cores") == 10 - 3 - 2  # t2 is still pending


def test_assumption_follows_a_resource_that_moved_rack() -> None:
    # The node object is re-created when its location changes; a pending
    # (uncommitted) assumption must still count against its capacity.
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=8, rack="r1"))
    v.assume("t", n, {"cores": 4})
    moved = v.upsert("m", res("h", 2, cores=8, rack="r2"))
    assert moved.free("cores") == 4


# -- a manager restarted on an older or fresh database: its generations went back ----------

def test_a_snapshot_replaces_the_node_even_when_its_generation_went_back() -> None:
    v = CapacityView()
    v.upsert("m", res("h1", 5, cores=4, used=4))
    before = v.version
    n = v.upsert("m", res("h1", 0, cores=4, used=0), snapshot=True)   # the (re)connected manager's state now
    assert n.generation == 0 and n.used["cores"] == 0 and n.free("cores") == 4
    assert v.version == before + 1
    # within the new stream, generations order the updates again
    v.upsert("m", res("h1", 2, cores=4, used=1))
    v.upsert("m", res("h1", 1, cores=4, used=3))          # older than what the view holds: stale
    assert n.generation == 2 and n.used["cores"] == 1


def test_committed_assumptions_of_the_old_history_go_with_a_snapshot_that_went_back() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 5, cores=8))
    v.assume("t", n, {"cores": 4})
    v.commit("t", {"m/h": 9})      # would wait for generation 9, which the restarted manager may never reach
    assert n.free("cores") == 4
    v.upsert("m", res("h", 0, cores=8), snapshot=True)
    assert n.free("cores") == 8 and n.assumed == {}


def test_a_pending_assumption_survives_a_snapshot_that_went_back_and_goes_once_committed() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 5, cores=8))
    v.assume("t", n, {"cores": 4})                         # placed before the restart, not answered yet
    v.upsert("m", res("h", 0, cores=8), snapshot=True)
    assert n.free("cores") == 4                            # still held: the delegation may yet commit
    v.commit("t", {"m/h": 1})
    # placed against the old history: from now the manager's own reports count (it refuses what does not fit)
    assert n.free("cores") == 8 and n.assumed == {}


def test_a_snapshot_that_went_back_and_moved_the_resource_replaces_it_too() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 5, cores=8, used=6, rack="r1"))
    v.assume("t", n, {"cores": 1})
    v.commit("t", {"m/h": 7})
    moved = v.upsert("m", res("h", 0, cores=8, rack="r2"), snapshot=True)
    assert moved.location.rack == "r2" and moved.generation == 0 and moved.free("cores") == 8
    assert keys(v.in_rack("vm", "s1", "r2")) == ["m/h"] and v.in_rack("vm", "s1", "r1") == []


def test_a_snapshot_at_the_same_or_a_newer_generation_settles_as_an_update_does() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 1, cores=10))
    v.assume("t", n, {"cores": 4})
    v.commit("t", {"m/h": 3})
    v.upsert("m", res("h", 2, cores=10, used=1), snapshot=True)   # a reconnect before our change: kept
    assert n.free("cores") == 10 - 1 - 4
    v.upsert("m", res("h", 3, cores=10, used=5), snapshot=True)
    assert n.free("cores") == 5 and n.assumed == {}


def test_a_resource_back_with_older_generations_after_it_left_settles_the_old_historys_commits() -> None:
    # Removed (its manager's reconnect snapshot lacked it, a CRS below passed REMOVED on, the manager was down),
    # then back from a manager restarted on a fresh database: a commit awaiting generation 9 would never settle.
    for leave in ("remove", "drop_manager"):
        for back_at, until in ((1, 9), (7, 9), (3, 0)):
            # 7: newer than the node was, older than the commit's reply said the IRM was: another history too.
            # until 0 (the reply named none): judged by the node's own generation, 5.
            v = CapacityView()
            n = v.upsert("m", res("h", 5, cores=8))
            v.assume("t", n, {"cores": 6})
            v.commit("t", {"m/h": until} if until else None)
            v.remove("m", "h") if leave == "remove" else v.drop_manager("m")
            back = v.upsert("m", res("h", back_at, cores=8))
            assert back.free("cores") == 8 and back.assumed == {}, (leave, back_at)


def test_a_resource_back_in_the_same_history_keeps_a_commit_until_its_generation_shows() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 5, cores=8))
    v.assume("t", n, {"cores": 6})
    v.commit("t", {"m/h": 9})
    v.remove("m", "h")
    back = v.upsert("m", res("h", 9, cores=8, used=0))   # an event of the same history, the commit not in it yet?
    assert back.free("cores") == 8                        # at 9 the IRM's usage includes it: settled, as ever
    v = CapacityView()
    n = v.upsert("m", res("h", 5, cores=8))
    v.assume("t", n, {"cores": 6})                        # pending (not answered yet) when it left
    v.remove("m", "h")
    back = v.upsert("m", res("h", 1, cores=8))
    assert back.free("cores") == 2                        # still held: the delegation may yet commit
    v.forget("t")
    assert back.free("cores") == 8


def test_what_is_remembered_of_a_gone_resource_goes_with_the_last_assumption_on_it() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 5, cores=8))
    v.assume("t", n, {"cores": 6})
    v.remove("m", "h")
    assert "m/h" in v._left
    v.forget("t")
    assert "m/h" not in v._left and "m/h" not in v._assumptions


def test_a_commit_answered_after_its_resource_left_counts_for_the_history_it_comes_back_in() -> None:
    v = CapacityView()
    n = v.upsert("m", res("h", 5, cores=8))
    v.assume("t", n, {"cores": 6})
    v.remove("m", "h")                 # its manager marked down, say, while the Reserve was answered
    v.commit("t", {"m/h": 9})
    back = v.upsert("m", res("h", 7, cores=8))     # below 9: another history
    assert back.free("cores") == 8 and back.assumed == {}
