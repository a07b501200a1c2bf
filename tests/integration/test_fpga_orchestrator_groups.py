"""The Orchestrator's group records when a creation fails (no FPGA-server needed for these)."""

from __future__ import annotations

import pytest

from irm_fpga.models import Group
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from services.clock import VirtualClock
from services.errors import NotFound


def test_deleting_a_group_whose_creation_failed_meanwhile_is_not_found(tmp_path):
    # DeleteGroup may wait for the lock while CreateGroup fails; the failed creation leaves no row behind.
    orch = Orchestrator(OrchestratorConfig(database=f"sqlite:///{tmp_path / 'o.db'}", servers=[], autoscaler="none"),
                        VirtualClock(0.0))
    try:
        with pytest.raises(NotFound, match="creation failed"):
            orch.delete(Group(id="fg-gone", tenant="alice", parts={}))
    finally:
        orch.db.engine.dispose()
