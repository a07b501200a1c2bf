"""Review 19: a read that learned a reservation's addresses from its manager writes them back only over the
allocation it read. A read of an earlier registration, answered after a read of a later one wrote the newer
addresses, put the older ones back (the next reads showed them while the manager was not asked again). The race is
made to happen in one thread: the later read's write lands while the earlier read waits on the manager. In-process
CRS; the manager is stood in for."""

from __future__ import annotations

from sqlalchemy import update

from cross_resource_scheduler.models import Reservation
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs, _Whereabouts
from harness.v1 import irm_pb2
from services.clock import VirtualClock
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_review18_addresses import OLD, _addresses, _get, _recorded

START = 1000.0
NEWER = "127.0.0.1:3333"


def _stored(crs: Crs, res_id: str) -> list[str]:
    return _addresses(crs._to_proto(crs._get("t", res_id)))


def test_a_read_answered_late_does_not_write_older_addresses_over_newer_ones(tmp_path) -> None:
    crs = make_crs(tmp_path, VirtualClock(START))
    try:
        # m registered (a manager not registered is not asked: its parts were given up with it).
        crs.registry.managers["m"] = ManagerState("m", "127.0.0.1:9", ["vm"], START)
        res_id = _recorded(crs, 0, START - 100)          # reserved before m registered: a read asks m
        assert _stored(crs, res_id) == [OLD]

        def ask_where(manager: str, w: _Whereabouts, tenant: str, parts: set[str], context,  # noqa: ANN001
                      relay: bool = False) -> str:
            # Meanwhile m registered again and another read learned (and wrote) where the VM is now.
            row = crs._get("t", res_id)
            newer = irm_pb2.Reservation.FromString(row.allocation)
            newer.groups[0].resources[0].address = NEWER
            crs.db.transact(lambda s: s.execute(update(Reservation).where(Reservation.id == res_id).values(
                allocation=newer.SerializeToString())))
            # This read's answer, of the registration before: the VM where it was then.
            w.address["vm-irm-0"] = "127.0.0.1:2222"
            w.parts.update(parts)
            return ""

        crs.addresses.ask_where = ask_where  # type: ignore[method-assign]
        assert _addresses(_get(crs, res_id)) == ["127.0.0.1:2222"]   # what its manager told this read
        assert _stored(crs, res_id) == [NEWER]                       # the later read's addresses stand
    finally:
        crs.db.dispose()
