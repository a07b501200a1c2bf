"""Review 25 (an operator's kill -9 of a CRS): a manager that registered while the restarted CRS was starting (it
serves before `start()` has put the managers its database knows back in its registry) was then taken for one
remembered from before: its last heartbeat set to -inf, it was marked down until its next heartbeat."""

from __future__ import annotations

import math

from cross_resource_scheduler.models import Manager
from services.clock import VirtualClock
from tests.unit.test_crs_reserve import make_crs


def test_a_manager_registered_during_start_stays_up_and_one_only_remembered_is_down_until_it_heartbeats(tmp_path):
    crs = make_crs(tmp_path, VirtualClock(1000.0))
    try:
        crs.db.transact(lambda s: s.add_all([
            Manager(name="live", address="127.0.0.1:9", resource_types=["vm"], registered_at=1.0),
            Manager(name="gone", address="127.0.0.1:8", resource_types=["vm"], registered_at=1.0)]))
        crs.registry.register("live", "127.0.0.1:9", ["vm"])      # its RegisterManager, before start() ran
        crs.start()
        assert crs.registry.get("live").last_heartbeat == 1000.0 and crs.registry.get("live").up
        assert crs.registry.get("gone").last_heartbeat == -math.inf
    finally:
        crs.stop()
