"""Virtual FPGAs across processes: FPGA-servers, the Orchestrator, the CRS, the client library."""

from __future__ import annotations

import math
from concurrent.futures import wait

import grpc
import numpy as np
import pytest
from scipy.stats import norm

from harness.v1 import common_pb2, fpga_pb2, fpga_pb2_grpc, irm_pb2, irm_pb2_grpc
from irm_fpga.client import TaskFailed, VirtualFpga
from services.errors import field_violations
from services.tls import plain_channel
from tests.conftest import eventually

FAST = {"reconfig_mean_s": 0.05, "reconfig_std_s": 0.0}


def bs_call(s, k, r, v, t):
    d1 = (np.log(s / k) + (r + v * v / 2) * t) / (v * np.sqrt(t))
    return s * norm.cdf(d1) - k * np.exp(-r * t) * norm.cdf(d1 - v * np.sqrt(t))


@pytest.fixture
def fpga(suite):
    # fpga-0 takes InjectFault (a fault drill's setting); fpga-1 refuses it, as a production server does.
    servers = [suite.start("fpga-server", name=f"fpga-{i}", devices=4, fault_injection=i == 0, **FAST)
               for i in range(2)]
    orch = suite.start("fpga", servers=",".join(s.address for s in servers))
    stub = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch.address))
    return {"servers": servers, "orch": orch, "stub": stub, "suite": suite}


def create(stub, tenant="alice", design="black_scholes", size=2, **kw) -> fpga_pb2.FpgaGroup:
    return stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant=tenant, request_id=f"{tenant}-{design}-{size}-{kw}",
                                                        design=design, size=size, **kw))


def test_designs_compute_right_results_through_a_group(fpga):
    stub, addr = fpga["stub"], fpga["orch"].address
    bs = create(stub, design="black_scholes", size=2)
    with VirtualFpga.attach(addr, "alice", bs.id) as f:
        spots = np.linspace(80, 120, 40)
        outs = f.map([{"spot": s, "strike": 100.0, "rate": 0.02, "volatility": 0.25, "maturity": 0.5}
                      for s in spots])
    got = np.array([o.value["price"][0] for o in outs])
    np.testing.assert_allclose(got, bs_call(spots, 100.0, 0.02, 0.25, 0.5), rtol=1e-9)
    assert {o.device for o in outs} == {0, 1} or len({(o.server, o.device) for o in outs}) == 2
    assert all(o.device_time_s > 0 for o in outs)

    fft = create(stub, design="fft", size=1)
    with VirtualFpga.attach(addr, "alice", fft.id) as f:
        x = np.random.default_rng(1).standard_normal(1024)
        out = f.submit({"signal": x}).result()
    np.testing.assert_allclose(out.value["spectrum"], np.fft.fft(x), atol=1e-9)

    ma = create(stub, design="moving_average", size=1)
    with VirtualFpga.attach(addr, "alice", ma.id) as f:
        out = f.submit({"signal": np.arange(10.0), "window": 3}).result()
    np.testing.assert_allclose(out.value["average"], np.arange(1.0, 9.0))


def test_bad_task_parameters_fail_that_task_with_a_message(fpga):
    g = create(fpga["stub"], design="black_scholes", size=1)
    with VirtualFpga.attach(fpga["orch"].address, "alice", g.id) as f:
        with pytest.raises((TaskFailed, grpc.RpcError)) as e:
            f.submit({"spot": -1.0, "strike": 1.0, "rate": 0.0, "volatility": 0.2, "maturity": 1.0}).result(30)
        assert "spot" in str(e.value)


def test_group_spans_servers_and_resizes_under_load_without_losing_tasks(fpga):
    stub, addr = fpga["stub"], fpga["orch"].address
    g = create(fpga["stub"], design="sleep", size=2)
    with VirtualFpga.attach(addr, "alice", g.id) as f:
        futures = [f.submit({"duration": 0.001}) for _ in range(600)]
        grown = stub.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="alice", group_id=g.id, size=6))
        assert sum(grown.parts.values()) == 6 and len(grown.parts) == 2  # 4 + 2: spans both servers
        f.refresh()  # (the client also refreshes by itself every second)
        assert {p.part.server for p in f._parts} == {"fpga-0", "fpga-1"}
        futures += [f.submit({"duration": 0.001}) for _ in range(600)]
        shrunk = stub.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="alice", group_id=g.id, size=2))
        assert dict(shrunk.parts) == {"fpga-0": 1, "fpga-1": 1}  # every part keeps a device
        futures += [f.submit({"duration": 0.001}) for _ in range(300)]
        outs = [fu.result(60) for fu in futures]
    ids = [o.id for o in outs]
    assert len(ids) == 1500 and len(set(ids)) == 1500  # each task exactly once


def test_shared_group_two_tenants_and_private_group_refused(fpga):
    stub, addr = fpga["stub"], fpga["orch"].address
    shared = create(stub, tenant="alice", design="sleep", size=1, sharing=fpga_pb2.FpgaGroup.SHARING_SHARED)
    private = create(stub, tenant="alice", design="sleep", size=1)
    with VirtualFpga.attach(addr, "alice", shared.id) as a, VirtualFpga.attach(addr, "bob", shared.id) as b:
        fa = [a.submit({"duration": 0.002}) for _ in range(50)]
        fb = [b.submit({"duration": 0.002}) for _ in range(50)]
        assert len([x.result(30) for x in fa + fb]) == 100
    with pytest.raises(grpc.RpcError) as e:
        stub.AttachClient(fpga_pb2.AttachClientRequest(tenant="bob", group_id=private.id))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        stub.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="bob", group_id=shared.id, size=2))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_lock_gives_one_device_exclusively(fpga):
    g = create(fpga["stub"], design="sleep", size=3)
    with VirtualFpga.attach(fpga["orch"].address, "alice", g.id) as f:
        locked = f.lock()
        device = locked.value["device"]
        outs = [f.submit({"duration": 0.001}) for _ in range(30)]
        assert {(o.result(30).server, o.result(30).device) for o in outs} == {(locked.server, device)}
        f.unlock()
        # Unlocked, the client's tasks spread over the group's devices again.
        outs = [fu.result(30) for fu in [f.submit({"duration": 0.002}) for _ in range(60)]]
        assert len({(o.server, o.device) for o in outs}) > 1


def test_revocation_cancels_queued_tasks_and_cuts_the_client_off(fpga):
    stub, addr = fpga["stub"], fpga["orch"].address
    g = create(stub, design="sleep", size=1, sharing=fpga_pb2.FpgaGroup.SHARING_SHARED)
    victim = VirtualFpga.attach(addr, "bob", g.id)
    futures = [victim.submit({"duration": 0.05}) for _ in range(100)]
    eventually(lambda: any(f.done() for f in futures), what="the first task to finish")
    reply = stub.RevokeClient(fpga_pb2.ClientRequest(tenant="alice", group_id=g.id, client_id=victim.client_id))
    assert reply.cancelled > 50
    errors = 0
    for fu in futures:
        try:
            fu.result(30)
        except TaskFailed as e:
            errors += 1
            assert "revoked" in str(e) or "PERMISSION_DENIED" in str(e)
    assert errors >= reply.cancelled
    victim.close(detach=False)
    # Only the owner may revoke.
    other = VirtualFpga.attach(addr, "bob", g.id)
    with pytest.raises(grpc.RpcError) as e:
        stub.RevokeClient(fpga_pb2.ClientRequest(tenant="bob", group_id=g.id, client_id=other.client_id))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    other.close()


def test_failed_reconfigurations_blacklist_a_device_and_the_group_keeps_working(fpga):
    stub, addr = fpga["stub"], fpga["orch"].address
    server = fpga["servers"][0]
    s = fpga_pb2_grpc.FpgaServerStub(plain_channel(server.address))
    # Off unless the server was started for it: refused, nothing injected; a negative count is bad input.
    with pytest.raises(grpc.RpcError) as off:
        fpga_pb2_grpc.FpgaServerStub(plain_channel(fpga["servers"][1].address)).InjectFault(
            fpga_pb2.InjectFaultRequest(device=0, count=100))
    assert off.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "fault_injection" in off.value.details()
    with pytest.raises(grpc.RpcError) as negative:
        s.InjectFault(fpga_pb2.InjectFaultRequest(device=0, count=-1))
    assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Every reconfiguration of device 0 fails from now on (fault injection at the emulator's edge).
    s.InjectFault(fpga_pb2.InjectFaultRequest(device=0, count=100))
    g = create(stub, design="black_scholes", size=4)  # all of fpga-0's devices, device 0 included
    with VirtualFpga.attach(addr, "alice", g.id) as f:
        outs = f.map([{"spot": 100.0, "strike": 100.0, "rate": 0.0, "volatility": 0.2, "maturity": 1.0}] * 50)
    assert len(outs) == 50
    info = eventually(lambda: (lambda i: i if any(d.state == fpga_pb2.DeviceInfo.STATE_BLACKLISTED
                                                  for d in i.devices) else None)(
        s.GetServer(fpga_pb2.GetServerRequest())), what="device 0 blacklisted")
    assert info.devices[0].state == fpga_pb2.DeviceInfo.STATE_BLACKLISTED
    assert any("blacklisted" in e for e in info.events)
    assert all(o.device != 0 or o.server != "fpga-0" for o in outs)


def test_orchestrator_restart_keeps_groups_and_data_plane_serves_meanwhile(fpga, tmp_path):
    stub, suite = fpga["stub"], fpga["suite"]
    g = create(stub, design="sleep", size=2)
    f = VirtualFpga.attach(fpga["orch"].address, "alice", g.id)
    fpga["orch"].kill()  # crash, no goodbye
    outs = [f.submit({"duration": 0.001}).result(30) for _ in range(20)]  # still served
    assert len(outs) == 20
    f.close(detach=False)
    orch2 = suite.start("fpga", servers=",".join(s.address for s in fpga["servers"]))
    stub2 = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch2.address))
    again = stub2.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=g.id))
    assert again.size == 2 and sum(again.parts.values()) == 2
    with VirtualFpga.attach(orch2.address, "alice", g.id) as f2:
        assert f2.submit({"duration": 0.001}).result(30).device_time_s == pytest.approx(0.001, rel=0.01)


def test_reserve_a_virtual_fpga_through_the_crs(suite):
    crs = suite.start("crs", heartbeat_interval_s=0.3)
    server = suite.start("fpga-server", **FAST)
    orch = suite.start("fpga", servers=server.address, crs_address=crs.address, heartbeat_interval_s=0.3)
    suite.start("compute", crs_address=crs.address, heartbeat_interval_s=0.3)
    c = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: {r.resource_type for r in c.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
               == {"vm", "vfpga"}, what="VMs and FPGAs in the CRS")
    res = c.Reserve(irm_pb2.ReserveRequest(tenant="alice", request_id="vf-1", groups=[
        irm_pb2.ResourceGroup(name="host", resource_type="vm", count=1, attributes={
            "cores": common_pb2.AttributeRequest(number=1), "memory_gb": common_pb2.AttributeRequest(number=1)}),
        irm_pb2.ResourceGroup(name="accel", resource_type="vfpga", count=1, attributes={
            "devices": common_pb2.AttributeRequest(number=2),
            "design": common_pb2.AttributeRequest(text="black_scholes")}),
    ]))
    accel = next(g for g in res.groups if g.name == "accel").resources[0]
    assert accel.address == orch.address and accel.attributes["devices"] == 2
    with VirtualFpga.attach(accel.address, "alice", accel.id) as f:
        out = f.submit({"spot": 100.0, "strike": 100.0, "rate": 0.0, "volatility": 0.2, "maturity": 1.0}).result(30)
    assert out.value["price"][0] == pytest.approx(bs_call(100.0, 100.0, 0.0, 0.2, 1.0))
    c.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="alice", reservation_id=res.id))
    o = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch.address))
    assert o.ListGroups(fpga_pb2.ListGroupsRequest(tenant="alice")).groups == []
    # The release reached the data plane too: the FPGA-server holds no part of the group, and its devices are free
    # for others (a part left behind would keep them, though the Orchestrator no longer lists the group).
    info = fpga_pb2_grpc.FpgaServerStub(plain_channel(server.address)).GetServer(fpga_pb2.GetServerRequest())
    assert list(info.groups) == []
    assert info.devices and all(d.state == fpga_pb2.DeviceInfo.STATE_FREE for d in info.devices)


@pytest.mark.parametrize("policy", ["thesis", "improved"])
def test_autoscaler_grows_a_loaded_elastic_group(suite, policy):
    server = suite.start("fpga-server", devices=4, **FAST)
    orch = suite.start("fpga", servers=server.address, autoscaler=policy, autoscaler_interval_s=0.3)
    stub = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch.address))
    busy = create(stub, design="sleep", size=1, min_size=1, max_size=3, scaling=fpga_pb2.FpgaGroup.SCALING_ELASTIC)
    idle = create(stub, design="fft", size=1, min_size=1, max_size=3, scaling=fpga_pb2.FpgaGroup.SCALING_ELASTIC)
    fixed = create(stub, design="black_scholes", size=1)  # static: never resized
    with VirtualFpga.attach(orch.address, "alice", busy.id) as f:
        futures = [f.submit({"duration": 0.01}) for _ in range(1500)]  # 15 s of work for one device
        grown = eventually(lambda: (lambda g: g if g.size > 1 else None)(
            stub.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=busy.id))), timeout=30,
            what="the loaded elastic group to grow")
        assert grown.size <= 3
        for fu in futures:
            fu.cancel()
    assert stub.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=fixed.id)).size == 1
    assert stub.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=idle.id)).size >= 1


def test_in_flight_is_bounded_and_waiting_is_not(fpga):
    g = create(fpga["stub"], design="sleep", size=1)
    att = fpga["stub"].AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id))
    f = VirtualFpga(att, max_in_flight=10, batch_size=5)
    try:
        futures = [f.submit({"duration": 0.01}) for _ in range(200)]  # returns at once: nothing blocks
        assert f.pending() > 100  # most wait: 200 x 10 ms on one device (half of it done: a 1 s stall here)
        peak = 0
        while not all(fu.done() for fu in futures):
            peak = max(peak, f.in_flight())
            wait([futures[-1]], timeout=0.02)
        assert 0 < peak <= 10
        assert len({fu.result().id for fu in futures}) == 200
    finally:
        f.close()


def test_the_irm_api_honours_placement_and_refuses_impossible_input(fpga):
    irm = irm_pb2_grpc.ResourceManagerStub(plain_channel(fpga["orch"].address))
    hosts = {r.id: r for r in irm.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
    first = sorted(hosts)[0]

    def vfpga(devices: float, placement=(), name="accel") -> irm_pb2.ResourceGroup:
        return irm_pb2.ResourceGroup(name=name, resource_type="vfpga", count=1, placement=list(placement),
                                     attributes={"devices": common_pb2.AttributeRequest(number=devices),
                                                 "design": common_pb2.AttributeRequest(text="sleep")})

    # Pinned (the CRS's choice, for its distance constraints): there, or refused -- never spilled elsewhere.
    res = irm.Reserve(irm_pb2.ReserveRequest(tenant="alice", request_id="p1", groups=[vfpga(3, [first])]))
    assert res.groups[0].resources[0].physical_id == first
    with pytest.raises(grpc.RpcError) as e:
        irm.Reserve(irm_pb2.ReserveRequest(tenant="alice", request_id="p2", groups=[vfpga(2, [first])]))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and first in e.value.details()
    irm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="alice", reservation_id=res.id))
    cases = [(irm_pb2.ReserveRequest(tenant="alice", request_id="p3", groups=[vfpga(1, ["nowhere"])]),
              "groups[0].placement"),
             (irm_pb2.ReserveRequest(tenant="alice", request_id="p4", groups=[vfpga(math.inf)]),
              "groups[0].attributes[devices]"),                         # was INTERNAL (int(inf))
             (irm_pb2.ReserveRequest(tenant="alice", request_id="x" * 129, groups=[vfpga(1)]), "request_id"),
             (irm_pb2.ReserveRequest(tenant="alice", request_id="p5", groups=[vfpga(1, name="n" * 129)]),
              "groups[0].name")]
    for request, field in cases:
        with pytest.raises(grpc.RpcError) as e:
            irm.Reserve(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in [f for f, _ in field_violations(
            e.value)], (field, e.value.details())
    g = create(fpga["stub"], design="sleep", size=1)
    with pytest.raises(grpc.RpcError) as e:
        fpga["stub"].AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c" * 65))
    assert [f for f, _ in field_violations(e.value)] == ["client_id"]


def test_tasks_queued_on_a_part_shrunk_to_nothing_run_on_the_other_part(fpga):
    stub, addr = fpga["stub"], fpga["orch"].address
    g = create(stub, design="sleep", size=8)                   # 4 devices on each server
    assert sorted(g.parts.values()) == [4, 4]
    with VirtualFpga.attach(addr, "alice", g.id) as f:
        futures = [f.submit({"duration": 0.05}) for _ in range(80)]    # ~0.5 s queued on each part
        shrunk = stub.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="alice", group_id=g.id, size=1), timeout=10)
        (left,) = [s for s, n in shrunk.parts.items() if n]
        done, hung = wait(futures, timeout=60)
        assert not hung, f"{len(hung)} of 80 tasks never answered"
        outcomes = [fu.result() for fu in futures]             # none failed: handed back, sent again
    assert len(outcomes) == 80 and {o.server for o in outcomes[-5:]} == {left}


def test_a_server_with_a_control_token_takes_control_calls_from_its_orchestrator_only(suite):
    token = "t0ken-of-this-suite"
    server = suite.start("fpga-server", name="fpga-locked", devices=2, control_token=token, **FAST)
    orch = suite.start("fpga", servers=server.address, control_token=token)
    stub = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch.address))
    g = create(stub, design="sleep", size=2)                 # the Orchestrator sends the token: it works
    with VirtualFpga.attach(orch.address, "alice", g.id) as f:
        assert len(f.map([{"duration": 0.01}] * 4)) == 4     # the data plane needs no control token
    direct = fpga_pb2_grpc.FpgaServerStub(plain_channel(server.address))
    for metadata in ((), (("x-harness-control-token", "guess"),)):
        with pytest.raises(grpc.RpcError) as e:                # a tenant reaching the server itself
            direct.AttachClient(fpga_pb2.ServerAttachRequest(group_id=g.id, client_id="mallory", token="x"),
                                metadata=metadata, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            direct.DeleteGroupPart(fpga_pb2.DeleteGroupPartRequest(group_id=g.id), metadata=metadata, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stub.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=g.id), timeout=10).size == 2
