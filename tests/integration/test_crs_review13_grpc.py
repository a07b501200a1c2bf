"""The CRS after its thirteenth review, over loopback gRPC in this process: a WatchCapacity filtered by
resource type still ends its snapshot (a client waiting for KIND_SNAPSHOT_END hung forever)."""

from __future__ import annotations

import grpc

from harness.v1 import irm_pb2
from tests.conftest import eventually
from tests.integration.test_crs_review12_grpc import Cloud, FakeIrm, K, cloud  # noqa: F401 (the fixture)


def test_a_watch_filtered_by_resource_type_ends_its_snapshot(cloud: Cloud) -> None:  # noqa: F811
    cloud.join(FakeIrm("A", {"a1": 10, "a2": 10}))
    eventually(lambda: cloud.resources() == ["A/a1", "A/a2"], what="A's hosts in the view")
    for wanted, ids in (("gadget", ["a1", "a2"]), ("vm", [])):
        call = cloud.stub.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="t", resource_type=wanted), timeout=10)
        seen = []
        try:
            for ev in call:
                if ev.kind == K.KIND_SNAPSHOT_END:
                    break
                seen.append((ev.resource.resource_type, ev.resource.id))
            else:
                raise AssertionError("the stream ended without KIND_SNAPSHOT_END")
        except grpc.RpcError as e:
            raise AssertionError(f"no KIND_SNAPSHOT_END for resource_type {wanted!r}: {e.code().name}") from None
        finally:
            call.cancel()
        assert sorted(seen) == [(wanted, i) for i in ids]
