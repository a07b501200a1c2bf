"""ComputeStore against a real (temporary) SQLite database (irm_compute.store)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from irm_compute import inventory as inv
from irm_compute.cost import CostModel
from irm_compute.models import Host, Reservation, Vm
from irm_compute.service import MIGRATIONS
from irm_compute.shapes import VmGroup
from irm_compute.store import ComputeStore, ReserveCall
from services.clock import VirtualClock
from services.db import Database
from services.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, ResourceExhausted

TIMEOUT = 60.0


def host(hid: str, cores: int = 8, memory_gb: float = 16, freq: float = 2.2, traits: tuple[str, ...] = (),
         rack: str = "rack-1") -> dict:
    return {"id": hid, "cores": cores, "memory_gb": memory_gb, "frequency_ghz": freq, "traits": list(traits),
            "rack": rack}


def g(name: str = "g", count: int = 1, cores: int = 1, memory_gb: float = 1, *, freq: tuple[float, float] = (0.0,
      float("inf")), required: tuple[str, ...] = (), forbidden: tuple[str, ...] = (),
      placement: tuple[str, ...] = ()) -> VmGroup:
    return VmGroup(name, count, cores, int(memory_gb * 1024), freq[0], freq[1], frozenset(required),
                   frozenset(forbidden), placement)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    d = Database(f"sqlite:///{tmp_path / 'compute.db'}")
    d.migrate(MIGRATIONS, "alembic_version_compute")
    yield d
    d.dispose()


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(1000.0)


def make_store(db: Database, clock: VirtualClock, hosts: list[dict]) -> ComputeStore:
    store = ComputeStore(db, CostModel(), clock)
    store.sync_inventory(inv.from_dict({"hosts": hosts}))
    return store


def used(store: ComputeStore) -> dict[str, tuple[int, int]]:
    with store.db.read() as s:
        return {h.id: (h.used_cores, h.used_memory_mb) for h in s.scalars(select(Host))}


def counts(store: ComputeStore) -> tuple[int, int]:
    with store.db.read() as s:
        return s.scalar(select(func.count()).select_from(Reservation)), s.scalar(select(func.count()).select_from(Vm))


def active_sums(store: ComputeStore) -> dict[str, tuple[int, int]]:
    with store.db.read() as s:
        out = {h.id: (0, 0) for h in s.scalars(select(Host))}
        for vm in s.scalars(select(Vm).where(Vm.state == "active")):
            c, m = out[vm.host_id]
            out[vm.host_id] = (c + vm.cores, m + vm.memory_mb)
        return out


# -- inventory -------------------------------------------------------------------

def test_sync_inventory_adds_updates_and_disables(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a"), host("b")])
    assert [h.id for h in store.hosts()] == ["a", "b"]
    gens = {h.id: h.generation for h in store.hosts()}
    # unchanged: no generation bump
    store.sync_inventory(inv.from_dict({"hosts": [host("a"), host("b")]}))
    assert {h.id: h.generation for h in store.hosts()} == gens
    # a changed, b left, c new
    store.sync_inventory(inv.from_dict({"hosts": [host("a", cores=16), host("c")]}))
    assert [h.id for h in store.hosts()] == ["a", "c"]
    by_id = {h.id: h for h in store.hosts_by_id(["a", "b", "c"])}
    assert by_id["a"].cores == 16 and by_id["a"].generation == gens["a"] + 1
    assert by_id["b"].enabled is False and by_id["b"].generation == gens["b"] + 1
    # b comes back
    store.sync_inventory(inv.from_dict({"hosts": [host("a", cores=16), host("b"), host("c")]}))
    assert [h.id for h in store.hosts()] == ["a", "b", "c"]


def test_disabled_hosts_take_no_new_vms(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=64), host("b", cores=2)])
    store.sync_inventory(inv.from_dict({"hosts": [host("b", cores=2)]}))
    out = store.reserve("t", "r1", [g(cores=2)])
    assert [vm.host_id for vm in out.reservation.vms] == ["b"]
    with pytest.raises(ResourceExhausted):
        store.reserve("t", "r2", [g(cores=2)])
    with pytest.raises(NotFound):
        store.reserve("t", "r3", [g(placement=("a",))])


# -- reserve / release -------------------------------------------------------------

def test_reserve_takes_capacity_and_prices_with_the_cost_model(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=8, memory_gb=16, freq=3.0)])
    out = store.reserve("t", "r1", [g("web", 2, cores=2, memory_gb=4)], notes=["hello"])
    res = out.reservation
    assert out.created
    # the change reports each touched host once, with its usage after the change
    assert [(u.host_id, u.used_cores, u.used_memory_mb) for u in out.touched] == [("a", 4, 8192)]
    assert res.state == "active" and res.tenant == "t" and res.request_id == "r1" and res.created_at == 1000.0
    assert res.notes == ["hello"] and res.groups == [{"name": "web", "count": 2}]
    assert [(vm.ordinal, vm.group, vm.host_id, vm.cores, vm.memory_mb) for vm in res.vms] == [
        (0, "web", "a", 2, 4096), (1, "web", "a", 2, 4096)]
    each = CostModel().price_per_minute(2, 4, 3.0)
    assert each == pytest.approx(0.0396 * 2 * 3.0 / 2.2 + 0.0186 * 4 + 0.0417)
    assert all(vm.price_per_minute == pytest.approx(each) for vm in res.vms)
    assert res.price_per_minute == pytest.approx(2 * each)
    assert used(store) == {"a": (4, 8192)}
    assert store.overbooking() == []


def test_reserve_is_idempotent_on_the_request_id(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a"), host("b")])
    first = store.reserve("t", "same", [g(count=3, cores=2)])
    before = used(store)
    again = store.reserve("t", "same", [g(count=3, cores=2)])
    assert not again.created and again.touched == []
    assert again.reservation.id == first.reservation.id
    assert [vm.id for vm in again.reservation.vms] == [vm.id for vm in first.reservation.vms]
    assert used(store) == before
    assert counts(store) == (1, 3)
    # the same request id of another tenant is another reservation
    other = store.reserve("u", "same", [g()])
    assert other.created and other.reservation.id != first.reservation.id


def test_concurrent_retries_of_one_request_reserve_once(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=64, memory_gb=128)])
    ids: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def go() -> None:
        try:
            barrier.wait(TIMEOUT)
            out = store.reserve("t", "dup", [g(count=2, cores=1)])
            with lock:
                ids.append(out.reservation.id)
        except BaseException as e:  # noqa: BLE001
            with lock:
                failures.append(e)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert failures == []
    assert len(ids) == 8 and len(set(ids)) == 1
    assert counts(store) == (1, 2)
    assert used(store) == {"a": (2, 2048)}


def test_release_returns_capacity_and_is_idempotent(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a"), host("b")])
    res = store.reserve("t", "r", [g(count=2, cores=4)]).reservation
    clock.advance(60)
    out = store.release("t", res.id)
    assert out.created
    assert sorted((u.host_id, u.used_cores) for u in out.touched) == sorted({(vm.host_id, 0) for vm in res.vms})
    assert out.reservation.state == "released" and out.reservation.released_at == 1060.0
    assert all(vm.state == "released" for vm in out.reservation.vms)
    assert used(store) == {"a": (0, 0), "b": (0, 0)}
    again = store.release("t", res.id)
    assert not again.created and again.touched == []
    assert used(store) == {"a": (0, 0), "b": (0, 0)}
    assert store.overbooking() == []


def test_release_checks_existence_and_owner(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a")])
    res = store.reserve("t", "r", [g()]).reservation
    with pytest.raises(NotFound):
        store.release("t", "res-nope")
    with pytest.raises(PermissionDenied):
        store.release("mallory", res.id)
    assert used(store) == {"a": (1, 1024)}


def test_unpinned_placement_packs_the_fullest_host(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a"), host("b"), host("c")])
    store.reserve("t", "seed", [g(cores=3, placement=("b",))])
    out = store.reserve("t", "next", [g(count=2, cores=2)])
    assert [vm.host_id for vm in out.reservation.vms] == ["b", "b"]


def test_unpinned_placement_respects_frequency_and_traits(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("slow", freq=2.0, traits=("ssd",)), host("fast", freq=3.2),
                                   host("fast-ssd", freq=3.2, traits=("ssd", "gpu"))])
    out = store.reserve("t", "r1", [g(freq=(3.0, 3.5), forbidden=("gpu",))])
    assert [vm.host_id for vm in out.reservation.vms] == ["fast"]
    assert out.reservation.vms[0].frequency_ghz == 3.2
    out = store.reserve("t", "r2", [g(required=("ssd",), freq=(1.0, 2.5))])
    assert [vm.host_id for vm in out.reservation.vms] == ["slow"]
    with pytest.raises(FailedPrecondition, match="frequency and traits"):
        store.reserve("t", "r3", [g(required=("fpga",))])


def test_touched_usage_matches_the_database(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4), host("b", cores=4)])
    out = store.reserve("t", "r", [g("x", 2, cores=2, placement=("a", "b")), g("y", 1, cores=1, placement=("a",))])
    with db.read() as s:
        rows = {h.id: (h.used_cores, h.used_memory_mb, h.generation) for h in s.scalars(select(Host))}
    assert {u.host_id: (u.used_cores, u.used_memory_mb, u.generation) for u in out.touched} == rows
    assert rows["a"][:2] == (3, 2048) and rows["b"][:2] == (2, 1024)


def test_unpinned_placement_finds_a_matching_host_behind_many_fuller_ones(db: Database,
                                                                          clock: VirtualClock) -> None:
    # 210 hosts without the trait are fuller than the one host with it: placement
    # must still find the matching host, not report every matching host as too full.
    plain = [host(f"p{i:03d}", cores=8) for i in range(210)]
    store = make_store(db, clock, [*plain, host("z-ssd", cores=8, traits=("ssd",))])
    ids = tuple(h["id"] for h in plain)
    store.reserve("t", "fill", [g("fill", len(ids), cores=1, placement=ids)])
    out = store.reserve("t", "want-ssd", [g(required=("ssd",))])
    assert [vm.host_id for vm in out.reservation.vms] == ["z-ssd"]


def test_pinned_placement_errors(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4), host("b", freq=2.0)])
    with pytest.raises(NotFound, match="'zz'"):
        store.reserve("t", "r1", [g(placement=("zz",))])
    with pytest.raises(FailedPrecondition, match="does not match"):
        store.reserve("t", "r2", [g(placement=("b",), freq=(3.0, 4.0))])
    store.reserve("t", "r3", [g(cores=3, placement=("a",))])
    with pytest.raises(ResourceExhausted, match="no room"):
        store.reserve("t", "r4", [g(cores=2, placement=("a",))])
    assert counts(store) == (1, 1)


def test_shape_that_never_fits_is_a_failed_precondition(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=8, memory_gb=16)])
    with pytest.raises(FailedPrecondition, match="can ever hold"):
        store.reserve("t", "r", [g(cores=16)])
    with pytest.raises(FailedPrecondition, match="can ever hold"):
        store.reserve("t", "r", [g(cores=1, memory_gb=32)])
    store.reserve("t", "fill", [g(cores=8)])
    with pytest.raises(ResourceExhausted, match="too full"):
        store.reserve("t", "r2", [g(cores=1)])


# -- all-or-nothing ----------------------------------------------------------------

def test_multi_group_reserve_is_all_or_nothing_when_capacity_runs_out(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4), host("b", cores=4)])
    # the first group fits (3 cores on each host); the second then has no room, although on empty hosts it
    # would (full now, not never: RESOURCE_EXHAUSTED)
    with pytest.raises(ResourceExhausted):
        store.reserve("t", "r", [g("first", 2, cores=3), g("second", 1, cores=2)])
    assert counts(store) == (0, 0)
    assert used(store) == {"a": (0, 0), "b": (0, 0)}
    assert store.overbooking() == []
    # nothing half-done blocks a retry of the same request id with a shape that fits
    ok = store.reserve("t", "r", [g("first", 2, cores=2), g("second", 2, cores=2)])
    assert ok.created and len(ok.reservation.vms) == 4
    assert used(store) == {"a": (4, 2048), "b": (4, 2048)}


def test_multi_group_reserve_is_all_or_nothing_when_a_group_never_fits(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4), host("b", cores=4)])
    with pytest.raises(FailedPrecondition):
        store.reserve("t", "r", [g("ok", 2, cores=1), g("huge", 1, cores=32)])
    with pytest.raises(NotFound):
        store.reserve("t", "r", [g("ok", 2, cores=1), g("pinned", 1, placement=("nowhere",))])
    assert counts(store) == (0, 0)
    assert used(store) == {"a": (0, 0), "b": (0, 0)}


# -- queries -----------------------------------------------------------------------

def test_get_by_id_and_by_request_id(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a")])
    res = store.reserve("t", "req-1", [g()]).reservation
    assert store.get("t", reservation_id=res.id).id == res.id
    assert store.get("t", request_id="req-1").id == res.id
    with pytest.raises(NotFound):
        store.get("t", reservation_id="res-missing")
    with pytest.raises(NotFound):
        store.get("t", request_id="other")
    with pytest.raises(PermissionDenied):
        store.get("mallory", reservation_id=res.id)
    with pytest.raises(NotFound):  # another tenant's request id is simply not found
        store.get("mallory", request_id="req-1")
    vm = store.vm(res.vms[0].id)
    assert vm.reservation.id == res.id
    with pytest.raises(NotFound):
        store.vm("vm-missing")


def test_list_pages_through_active_reservations(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=64, memory_gb=64)])
    made = [store.reserve("t", f"r{i}", [g()]).reservation.id for i in range(7)]
    store.reserve("u", "other-tenant", [g()])
    store.release("t", made[3])
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        rows, token = store.list("t", include_released=False, page_size=2, page_token=token)
        seen += [r.id for r in rows]
        pages += 1
        assert len(rows) <= 2
        if not token:
            break
    assert sorted(seen) == sorted(set(made) - {made[3]}) and len(seen) == 6
    assert pages == 3
    all_rows, token = store.list("t", include_released=True, page_size=0, page_token="")
    assert sorted(r.id for r in all_rows) == sorted(made) and token == ""
    with pytest.raises(InvalidArgument):
        store.list("t", include_released=True, page_size=2, page_token="!!!not-base64")


# -- concurrency: the no-overbooking invariant -------------------------------------------

def test_concurrent_reserves_and_releases_never_overbook(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("h1", cores=4, memory_gb=4), host("h2", cores=4, memory_gb=4),
                                   host("h3", cores=6, memory_gb=8)])
    names = ["h1", "h2", "h3"]
    threads_n, ops = 8, 50
    stats = {"reserved": 0, "exhausted": 0, "released": 0}
    unexpected: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads_n)

    def worker(w: int) -> None:
        rnd = random.Random(w)
        mine: list[str] = []
        try:
            barrier.wait(TIMEOUT)
            for op in range(ops):
                if mine and rnd.random() < 0.4:
                    out = store.release(f"t{w}", mine.pop(rnd.randrange(len(mine))))
                    assert out.created
                    with lock:
                        stats["released"] += 1
                    continue
                n = rnd.randint(1, 2)
                # half the time pinned to hosts chosen elsewhere (as the CRS does), which
                # may be full by now: only the conditional take protects them
                pins = tuple(rnd.choice(names) for _ in range(n)) if rnd.random() < 0.5 else ()
                groups = [g("a", n, cores=rnd.randint(1, 2), memory_gb=rnd.choice([0.5, 1]), placement=pins)]
                if rnd.random() < 0.3:
                    groups.append(g("b", 1, cores=rnd.randint(1, 3), memory_gb=1))
                try:
                    out = store.reserve(f"t{w}", f"w{w}-op{op}", groups)
                except ResourceExhausted:
                    with lock:
                        stats["exhausted"] += 1
                    continue
                mine.append(out.reservation.id)
                with lock:
                    stats["reserved"] += 1
        except BaseException as e:  # noqa: BLE001
            with lock:
                unexpected.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    assert unexpected == []
    assert stats["reserved"] > 0 and stats["released"] > 0
    assert stats["exhausted"] > 0  # the hosts really were contended
    assert store.overbooking() == []
    sums = active_sums(store)
    assert used(store) == sums
    with store.db.read() as s:
        for h in s.scalars(select(Host)):
            assert 0 <= h.used_cores <= h.cores and 0 <= h.used_memory_mb <= h.memory_mb
        active = s.scalar(select(func.count()).select_from(Reservation).where(Reservation.state == "active"))
    assert active == stats["reserved"] - stats["released"]


def test_overbooking_detects_a_broken_counter(db: Database, clock: VirtualClock) -> None:
    # The invariant checker itself must be able to fail.
    store = make_store(db, clock, [host("a", cores=4)])
    store.reserve("t", "r", [g(cores=2)])
    with db.write() as s:
        s.get(Host, "a").used_cores = 1
    problems = store.overbooking()
    assert len(problems) == 1 and "counters say 1 cores" in problems[0]
    with db.write() as s:
        h = s.get(Host, "a")
        h.used_cores, h.cores = 2, 1
    assert any("active VMs hold 2/1 cores" in p for p in store.overbooking())


# -- several reservations in one commit (ReserveBatch) ----------------------------

def test_reserve_many_gives_each_request_its_own_outcome(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4), host("b", cores=4)])
    first = store.reserve("t", "seen", [g(cores=1, placement=("a",))])
    out = store.reserve_many([
        ReserveCall("t", "ok", [g(count=2, cores=2, placement=("a", "b"))], ["note"]),
        ReserveCall("t", "too-big", [g(cores=3, placement=("a",))], []),  # a has 4 - 1 - 2 = 1 core left
        ReserveCall("t", "seen", [g(cores=1, placement=("a",))], []),  # a retry: the first result, nothing new
        ReserveCall("u", "ok", [g(cores=1, placement=("b",))], []),  # same request id, another tenant: its own
    ])
    ok, too_big, seen, other = out
    assert not isinstance(ok, Exception) and ok.created and ok.reservation.notes == ["note"]
    assert [vm.host_id for vm in ok.reservation.vms] == ["a", "b"]
    assert {u.host_id: u.used_cores for u in ok.touched} == {"a": 3, "b": 2}
    assert isinstance(too_big, ResourceExhausted)
    assert not isinstance(seen, Exception) and not seen.created and seen.reservation.id == first.reservation.id
    assert not isinstance(other, Exception) and other.created and other.reservation.tenant == "u"
    # the refused request took nothing; the others hold exactly what they asked
    assert used(store) == {"a": (3, 2 * 1024), "b": (3, 2 * 1024)} == active_sums(store)
    assert counts(store) == (3, 4)


def test_reserve_many_records_the_generation_each_take_reached(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=8)])
    before = {h.id: h.generation for h in store.hosts()}["a"]
    [one, two] = store.reserve_many([ReserveCall("t", "r1", [g(count=2, placement=("a", "a"))], []),
                                            ReserveCall("t", "r2", [g(placement=("a",))], [])])
    assert not isinstance(one, Exception) and not isinstance(two, Exception)
    # two takes on a for r1, then one for r2: the usage each reports is the host's right after it
    assert [(u.host_id, u.used_cores, u.generation) for u in one.touched] == [("a", 2, before + 2)]
    assert [(u.host_id, u.used_cores, u.generation) for u in two.touched] == [("a", 3, before + 3)]


def test_a_retry_returns_its_reservation_even_when_its_hosts_have_filled_up(db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4)])
    first = store.reserve("t", "r", [g(cores=3, placement=("a",))])
    # a retry's takes would fail now (a has 1 core left); it must still get its reservation back
    again = store.reserve("t", "r", [g(cores=3, placement=("a",))])
    assert not again.created and again.reservation.id == first.reservation.id
    [batched] = store.reserve_many([ReserveCall("t", "r", [g(cores=3, placement=("a",))], [])])
    assert not isinstance(batched, Exception) and batched.reservation.id == first.reservation.id
    with pytest.raises(ResourceExhausted):  # a new request is refused as before
        store.reserve("t", "other", [g(cores=3, placement=("a",))])
    assert used(store) == {"a": (3, 1024)}


# -- the price cap and the request's content, checked before anything is recorded --------

def generation(store: ComputeStore, hid: str) -> int:
    return {h.id: h.generation for h in store.hosts()}[hid]


def test_a_price_over_the_cap_records_nothing_and_leaves_the_request_id_unused(db: Database,
                                                                                clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4)])
    price = CostModel().price_per_minute(1, 1, 2.2)
    before = generation(store, "a")
    with pytest.raises(FailedPrecondition, match="exceeds max_price_per_minute.*nothing was reserved"):
        store.reserve("t", "k", [g()], max_price=price / 2)
    [batched] = store.reserve_many([ReserveCall("t", "k", [g()], max_price=price / 2)])
    assert isinstance(batched, FailedPrecondition)
    # the takes rolled back with the refusal: no row, no usage, not even a generation bump
    assert counts(store) == (0, 0) and used(store) == {"a": (0, 0)} and generation(store, "a") == before
    # so the id is still free: the retry with a higher cap is a new, active reservation
    again = store.reserve("t", "k", [g()], max_price=price)      # at the cap exactly: passes
    assert again.created and again.reservation.state == "active"
    assert again.reservation.price_per_minute == pytest.approx(price)


def test_a_replay_of_the_same_request_gets_its_reservation_and_a_different_one_is_refused(
        db: Database, clock: VirtualClock) -> None:
    store = make_store(db, clock, [host("a", cores=4)])
    first = store.reserve("t", "k", [g(cores=3)], request_hash="h1")
    assert first.reservation.request_hash == "h1"
    same = store.reserve("t", "k", [g(cores=3)], request_hash="h1")   # its takes fail now: still a replay
    assert not same.created and same.reservation.id == first.reservation.id
    # another request under the id: refused on request_id, whether its takes would fit (1 core) or not (3)
    for cores in (1, 3):
        with pytest.raises(InvalidArgument) as e:
            store.reserve("t", "k", [g(cores=cores)], request_hash="h2")
        assert [(v.field, v.description) for v in e.value.violations] == [
            ("request_id", "request_id reused with a different request; use a new request_id")]
    [batched] = store.reserve_many([ReserveCall("t", "k", [g(cores=1)], request_hash="h2")])
    assert isinstance(batched, InvalidArgument) and batched.violations[0].field == "request_id"
    assert counts(store) == (1, 1) and used(store) == {"a": (3, 1024)}
    # the same id under another tenant is that tenant's own
    assert store.reserve("u", "k", [g(cores=1)], request_hash="h2").created


def test_a_row_without_a_hash_replays_unchecked(db: Database, clock: VirtualClock) -> None:
    # Rows from before the hash was kept (the migration leaves them ""), or a caller that sends none.
    store = make_store(db, clock, [host("a", cores=4)])
    first = store.reserve("t", "old", [g()])
    assert first.reservation.request_hash == ""
    assert store.reserve("t", "old", [g(cores=2)], request_hash="h").reservation.id == first.reservation.id
    hashed = store.reserve("t", "new", [g()], request_hash="h")
    assert store.reserve("t", "new", [g(cores=2)]).reservation.id == hashed.reservation.id
