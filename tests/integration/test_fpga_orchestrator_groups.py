"""The Orchestrator's group records when a creation fails (no FPGA-server needed for these)."""

from __future__ import annotations

import pytest

from harness.v1 import fpga_pb2
from irm_fpga.models import Client, Group
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from services.client import all_pages
from services.clock import VirtualClock
from services.errors import InvalidArgument, NotFound


def test_deleting_a_group_whose_creation_failed_meanwhile_is_not_found(tmp_path):
    # DeleteGroup may wait for the lock while CreateGroup fails; the failed creation leaves no row behind.
    orch = Orchestrator(OrchestratorConfig(database=f"sqlite:///{tmp_path / 'o.db'}", servers=[], autoscaler="none"),
                        VirtualClock(0.0))
    try:
        with pytest.raises(NotFound, match="creation failed"):
            orch.delete(Group(id="fg-gone", tenant="alice", parts={}))
    finally:
        orch.db.engine.dispose()


def test_list_groups_pages_a_tenants_live_groups_oldest_first_with_their_clients(db_url):
    orch = Orchestrator(OrchestratorConfig(database=db_url, servers=[], autoscaler="none"), VirtualClock(0.0))
    try:
        with orch.db.write() as s:
            # Two groups made at one instant: the id breaks the tie, so neither is skipped nor repeated.
            for i, (tenant, at, deleted) in enumerate([("alice", 3.0, False), ("alice", 1.0, False),
                                                       ("bob", 2.0, False), ("alice", 2.0, True),
                                                       ("alice", 1.0, False), ("alice", 5.0, False)]):
                s.add(Group(id=f"fg-{i}", tenant=tenant, request_id=f"r{i}", design="sleep", size=1, min_size=1,
                            max_size=1, parts={"s1": 1}, created_at=at, deleted=deleted))
            s.add(Client(id="c-b", group_id="fg-0", tenant="alice", token="t", state="attached"))
            s.add(Client(id="c-a", group_id="fg-0", tenant="alice", token="t", state="attached"))
            s.add(Client(id="c-x", group_id="fg-1", tenant="alice", token="t", state="detached"))
        want = ["fg-1", "fg-4", "fg-0", "fg-5"]        # alice's, not deleted, by (created_at, id)
        first = orch.ListGroups(fpga_pb2.ListGroupsRequest(tenant="alice", page_size=2), None)
        assert [g.id for g in first.groups] == want[:2] and first.next_page_token
        second = orch.ListGroups(fpga_pb2.ListGroupsRequest(tenant="alice", page_size=2,
                                                            page_token=first.next_page_token), None)
        assert [g.id for g in second.groups] == want[2:] and second.next_page_token == ""
        whole = all_pages(lambda r, timeout: orch.ListGroups(r, None),
                          fpga_pb2.ListGroupsRequest(tenant="alice", page_size=1), "groups")
        assert [g.id for g in whole.groups] == want
        by_id = {g.id: g for g in whole.groups}
        assert list(by_id["fg-0"].clients) == ["c-a", "c-b"] and list(by_id["fg-1"].clients) == []
        assert [g.id for g in orch.ListGroups(fpga_pb2.ListGroupsRequest(tenant="bob"), None).groups] == ["fg-2"]
        for bad, field in [({"page_token": "forged"}, "page_token"), ({"page_size": -1}, "page_size")]:
            with pytest.raises(InvalidArgument, match=field):
                orch.ListGroups(fpga_pb2.ListGroupsRequest(tenant="alice", **bad), None)
    finally:
        orch.db.engine.dispose()
