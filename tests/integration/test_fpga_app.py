"""An application's FPGA implementation: a VM coordinates, a virtual FPGA computes.

The option-pricing example runs in a VM through the agent and offloads its
batch to the reservation's virtual FPGA (reserved through the CRS alongside
the VM), as the Application Manager runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from application_manager.local import resource_env
from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, irm_pb2, irm_pb2_grpc
from services import suite as suite_mod
from services.tls import plain_channel
from tests.conftest import eventually

APP = Path(__file__).resolve().parents[2] / "examples" / "option_pricing" / "app.py"


def test_option_pricing_runs_on_a_virtual_fpga(tmp_path):
    procs = suite_mod.start(str(tmp_path), auto_ports=True)
    try:
        addrs = {p.name: p.address for p in procs}
        crs = irm_pb2_grpc.ResourceManagerStub(plain_channel(addrs["crs"]))
        eventually(lambda: {r.resource_type for r in crs.DiscoverResources(
            irm_pb2.DiscoverResourcesRequest()).resources} == {"vm", "vfpga"}, what="VMs and FPGAs")
        res = crs.Reserve(irm_pb2.ReserveRequest(tenant="quant", request_id="bs-fpga", groups=[
            irm_pb2.ResourceGroup(name="host", resource_type="vm", count=1, attributes={
                "cores": common_pb2.AttributeRequest(number=1),
                # The manifest's host VM (256 MB): the example must run in it, whatever the group's size.
                "memory_gb": common_pb2.AttributeRequest(number=0.25)}),
            irm_pb2.ResourceGroup(name="dfe", resource_type="vfpga", count=1, attributes={
                "devices": common_pb2.AttributeRequest(number=1),
                "design": common_pb2.AttributeRequest(text="black_scholes")}),
        ], constraints=[irm_pb2.GroupConstraint(expression="hops(host, dfe) <= 4")]))
        vm = next(g for g in res.groups if g.name == "host").resources[0]
        agent = agent_pb2_grpc.ExecutionAgentStub(plain_channel(vm.address))
        out, exited = b"", None
        for ev in agent.Execute(agent_pb2.ExecuteRequest(
                tenant="quant", vm_id=vm.id, argv=[sys.executable, str(APP), "1", "--fpga"],
                env=resource_env("quant", res)), timeout=120):
            if ev.WhichOneof("event") in ("stdout", "stderr"):
                out += ev.stdout or ev.stderr
            if ev.WhichOneof("event") == "exited":
                exited = ev.exited
        assert exited is not None and exited.exit_code == 0, out.decode()
        text = out.decode()
        assert "options=1000000" in text and "fpga_group=" in text
        assert exited.peak_memory_mb < 256, exited
        device_s = float(text.split("device_s=")[1].split()[0])
        assert device_s > 0  # the devices' emulated time was really spent on it
    finally:
        suite_mod.stop(procs)
