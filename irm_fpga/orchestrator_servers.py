"""The FPGA-servers as the Orchestrator holds them (irm_fpga.orchestrator): a handle per server, with its breaker, and
the servers' states stamped with generations, as the capacity its IRM API offers (resource type "vfpga")."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from harness.v1 import common_pb2, fpga_pb2, fpga_pb2_grpc
from irm_fpga.orchestrator_config import OrchestratorConfig
from irm_fpga.server_breaker import ServerBreaker, intercept
from services import client as rpc
from services import control
from services.clock import Clock

VFPGA = "vfpga"


@dataclass
class ServerHandle:
    name: str
    address: str
    token: str = ""            # the servers' control token (services.control)
    # Calls through `stub()` fail at once for a while after one timed out (irm_fpga.server_breaker); 0: never.
    backoff_s: float = 0.0
    backoff_max_s: float = 0.0
    breaker: ServerBreaker | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.breaker is None and self.backoff_s > 0:
            self.breaker = ServerBreaker(self.name, self.address, self.backoff_s, self.backoff_max_s)

    def stub(self) -> fpga_pb2_grpc.FpgaServerStub:
        return fpga_pb2_grpc.FpgaServerStub(intercept(control.channel(rpc.channel(self.address), self.token),
                                                      self.breaker))


class ServerGenerations:
    """Each server state's generation, for the capacity events that carry it."""

    def __init__(self, clock: Clock) -> None:
        # Capacity events' generations, strictly increasing, one per server state first seen: the CRS's view keeps
        # the highest, so a higher one must never carry an older state. Concurrent reads are answered and
        # published in any order; each server numbers its reads as it takes them (ServerInfo.read_seq), and an
        # answer older than one already stamped stands for that newer one (`newest`). Stamping at ask time was
        # not enough: the read asked later could be the one the server answered first. A count from this
        # process's start time: a restarted one starts above the last (and a reconnect's snapshot resets the
        # view anyway). Not the clock at publish time: a wall clock stepping back made every event stale.
        self._generation = int(clock.now() * 1e6)
        self._generation_lock = threading.Lock()
        self._newest_read: dict[str, tuple[str, int, fpga_pb2.ServerInfo, int]] = {}   # server -> boot, seq, info, gen
        self._old_boots: dict[str, deque[str]] = {}     # server -> its earlier runs' boot ids (answers still in flight)

    def known(self) -> dict[str, fpga_pb2.ServerInfo]:
        """The newest state seen of each server (whether it answers now or not)."""
        with self._generation_lock:
            return {server: read[2] for server, read in self._newest_read.items()}

    def newest(self, server: str, info: fpga_pb2.ServerInfo) -> tuple[fpga_pb2.ServerInfo, int]:
        """`info`, stamped with the next generation if it is the newest state of `server` seen yet; else the
        newest seen and its generation (an answer that took longer to reach us than a later read's).

        A server that does not number its reads (no boot_id) is taken as newest, as before read_seq existed.
        """
        with self._generation_lock:
            known = self._newest_read.get(server)
            if known is not None and info.boot_id:
                boot, seq, newest, generation = known
                if (info.boot_id == boot and info.read_seq <= seq) or info.boot_id in self._old_boots.get(server, ()):
                    return newest, generation
                if info.boot_id != boot:        # the server restarted: answers of its last run are older now
                    self._old_boots.setdefault(server, deque(maxlen=8)).append(boot)
            self._generation += 1
            self._newest_read[server] = (info.boot_id, info.read_seq, info, self._generation)
            return info, self._generation


def server_traits(info: fpga_pb2.ServerInfo) -> list[str]:
    """A server's traits, as groups' required_traits and forbidden_traits name them: "fpga" and its designs."""
    return ["fpga", *info.designs]


def usable_devices(info: fpga_pb2.ServerInfo) -> int:
    """A server's devices that can take groups: all but the blacklisted."""
    return sum(1 for d in info.devices if d.state != fpga_pb2.DeviceInfo.STATE_BLACKLISTED)


def physical(info: fpga_pb2.ServerInfo, generation: int, config: OrchestratorConfig) -> common_pb2.PhysicalResource:
    """A server's state as the IRM API offers it: its usable devices, those its groups hold, under `generation`."""
    usable = usable_devices(info)
    used = sum(g.target for g in info.groups)
    return common_pb2.PhysicalResource(
        id=info.name, resource_type=VFPGA, capacity={"devices": usable}, used={"devices": used},
        properties={"reconfiguration_s": info.reconfiguration_s}, traits=server_traits(info),
        location=common_pb2.Location(site=config.site, rack=config.rack, host=info.name),
        manager=config.name, generation=generation)
