"""The Orchestrator's rounds over its FPGA-servers (irm_fpga.orchestrator): at start, every reconcile_interval_s
and before every placement, the servers are made to hold what the database says; every autoscaler_interval_s, each
server's autoscaler policy resizes the elastic groups living there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
from sqlalchemy import delete, select

from harness.v1 import fpga_pb2
from irm_fpga import autoscaler
from irm_fpga import engine as eng
from irm_fpga.models import Client, Group, Reservation
from irm_fpga.orchestrator_clients import ATTACHING
from irm_fpga.orchestrator_servers import ServerHandle
from services.errors import HarnessError

if TYPE_CHECKING:
    from irm_fpga.orchestrator import Orchestrator

# The Orchestrator's one logger: its operators (and tests) follow its records under that name, whichever module.
log = logging.getLogger("irm_fpga.orchestrator")


# Reads of the servers a reconcile round makes while decisions keep coming between a read and the lock, before it
# acts on the last one anyway.
READS_BEFORE_ACTING = 3


class Rounds:
    """The reconcile and autoscaler rounds and their threads, over the Orchestrator's servers (`servers`,
    `_discover_servers`, `_server_infos`, `ask_all`), groups (`resize`, `_delete_parts`, `_publish`), clients
    (`clients.revoke_everywhere`) and placement lock (`lock`): each looked up on it at each use, not copied, since
    its `servers` map is replaced as servers answer and tests replace its methods."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self.config = config = orch.config
        self.db = orch.db
        self._stop = threading.Event()
        # One Autoscaler per server (it keeps that server's recent intervals); the
        # policy is built here so an unknown name fails at start-up.
        self.scalers: dict[str, autoscaler.Autoscaler] = {}
        if config.autoscaler != "none":
            try:
                autoscaler.make_policy(config.autoscaler)
            except ValueError as e:
                raise ValueError(f"orchestrator configuration: {e}") from None
        self._scaler = threading.Thread(target=self._autoscale_loop, name="autoscaler", daemon=True)
        self._reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)

    def start(self) -> None:
        if self.config.autoscaler != "none":
            self._scaler.start()
        if self.config.reconcile_interval_s > 0:
            self._reconciler.start()

    def stop(self) -> None:
        self._stop.set()

    def reassert(self) -> None:
        """After a restart: make every server hold what the database says (all calls idempotent)."""
        with self.db.read() as s:
            groups = list(s.scalars(select(Group).where(Group.deleted.is_(False))))
            clients = list(s.scalars(select(Client).where(Client.state == "attached")))
            live = {r.id for r in s.scalars(select(Reservation).where(Reservation.state != "pending"))}
            unfinished = [r.id for r in s.scalars(select(Reservation).where(Reservation.state == "pending"))]
            cut_short = list(s.scalars(select(Client.id).where(Client.state == ATTACHING)))
        # A crash in the middle of AttachClient: its caller was never answered; take it back, so the id can be used.
        for client_id in cut_short:
            self.orch.clients.revoke_everywhere(client_id, list(self.orch.servers.values()))
            self.db.transact(lambda s, c=client_id: s.execute(delete(Client).where(Client.id == c,
                                                                                   Client.state == ATTACHING)))
        # A crash in the middle of Reserve left groups its reservation never got: give them back.
        orphans = [g for g in groups if g.reservation_id and g.reservation_id not in live]
        for g in orphans:
            self.orch._delete_parts(g, {name: 0 for name in self.orch.servers})
            self.db.transact(lambda s, gid=g.id: setattr(s.get(Group, gid), "deleted", True))
        if unfinished:
            self.db.transact(lambda s: s.execute(delete(Reservation).where(Reservation.id.in_(unfinished))))
        groups = [g for g in groups if g not in orphans]
        # Parts made, set to their recorded size (a resize cut short), dropped (a delete that could not reach a
        # server); then every client re-attached, also where its part survived.
        self.reconcile(self.orch._server_infos())
        by_group = {g.id: g for g in groups}
        for c in clients:
            g = by_group.get(c.group_id)
            if g is None:
                continue
            for server in g.parts:
                h = self.orch.servers.get(server)
                if h is not None:
                    try:
                        h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=g.id, client_id=c.id,
                                                                           token=c.token),
                                              timeout=self.config.server_timeout_s)
                    except grpc.RpcError:
                        pass

    def _every(self, interval_s: float, round_: Callable[[], object], what: str) -> None:
        while not self._stop.wait(interval_s):
            try:
                round_()
            except Exception:  # noqa: BLE001 - the loop must survive a bad round
                log.exception("%s round failed", what)

    def _reconcile_loop(self) -> None:
        self._every(self.config.reconcile_interval_s, self.reconcile_once, "reconcile")

    def reconcile_once(self) -> dict[str, int]:
        """Make every reachable FPGA-server hold what the database says; returns the parts (re)made and dropped.

        A server that restarted comes back empty: the live groups' parts there are made again and their clients
        attached again. A resize or creation cut short (a server that failed mid-way, an Orchestrator that died)
        left parts of other sizes than recorded, or parts the group's row does not have: they are set to the
        recorded size ("made" counts them) or dropped. A delete that could not reach a server left its part
        running (its clients served, its devices held): it is dropped now. Servers that did not answer at start
        are mapped once they do, and published to the watchers (the CRS), as is a server whose usable devices,
        use or designs changed by themselves (a device blacklisted). Under the lock: no group is being made, resized or deleted meanwhile.
        """
        self.orch._discover_servers()
        lock = self.orch.lock
        out = None
        for _ in range(READS_BEFORE_ACTING):
            with lock:              # waits out a decision in progress (its taking already counted)
                before = lock.taken
            infos = self.orch._server_infos()      # asked before the lock: a silent server must not stall placements
            with lock:
                # Nobody took the lock between the read and now: no group was made, resized or deleted, no client
                # attached or revoked meanwhile, so what the servers said is what the database should say. Else
                # the read is stale (a group made meanwhile looks missing: "made" again, falsely), so read again.
                if lock.taken == before + 1:
                    out = self.reconcile(infos)
                    break
        if out is None:
            with lock:                             # a busy manager: act on the last read (idempotent calls)
                out = self.reconcile(infos)
        if out["made"] or out["dropped"] or self.orch._offered_changed(infos):
            self.orch._publish()
        return out

    def reconcile(self, infos: dict[str, fpga_pb2.ServerInfo]) -> dict[str, int]:
        """`reconcile_once` on servers already asked (under the lock: also before every placement)."""
        made = dropped = 0
        with self.orch.lock:
            with self.db.read() as s:
                live = {g.id: g for g in s.scalars(select(Group).where(Group.deleted.is_(False)))}
                clients = list(s.scalars(select(Client).where(Client.state == "attached")))
                # Being attached: its call puts it on the servers before the row says attached (and takes it back
                # if it fails); the rounds leave it alone.
                attaching = set(s.scalars(select(Client.id).where(Client.state == ATTACHING)))
                # Detached: the server drains them (their queued and running tasks end, then they go); revoking
                # would cancel that work.
                detached = set(s.scalars(select(Client.id).where(Client.state == "detached")))
            for name, info in infos.items():
                h = self.orch.servers[name]
                held = {p.group_id: p.target for p in info.groups}
                on_part = {p.group_id: set(p.clients) for p in info.groups}
                try:
                    # Gone from the database, or never recorded on this server (every part is recorded before
                    # a server makes it, and under this lock: nothing here is on its way to being recorded).
                    for gid in sorted(gid for gid in held if gid not in live or name not in (live[gid].parts or {})):
                        h.stub().DeleteGroupPart(fpga_pb2.DeleteGroupPartRequest(group_id=gid),
                                                 timeout=self.config.server_timeout_s)
                        dropped += 1
                    for gid, g in live.items():
                        if name not in (g.parts or {}):
                            continue
                        n = g.parts[name]        # 0 too: the part must exist for the group to grow there again
                        if gid in held:
                            if held[gid] != n:
                                hand_back = n == 0 and any(m > 0 for k, m in g.parts.items() if k != name)
                                h.stub().ResizeGroupPart(fpga_pb2.ResizeGroupPartRequest(
                                    group_id=gid, size=n, hand_back=hand_back), timeout=self.config.server_timeout_s)
                                made += 1
                            # The part's clients as the database has them: one an attach left off while this
                            # server was silent is put on; one revoked or detached while it was is taken off.
                            want = {c.id: c for c in clients if c.group_id == gid}
                            for cid in sorted(set(want) - on_part[gid]):
                                h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=cid,
                                                                                   token=want[cid].token),
                                                      timeout=self.config.server_timeout_s)
                                made += 1
                            for cid in sorted(on_part[gid] - set(want) - attaching):
                                if cid in detached:     # idempotent; not a change (listed until it has drained)
                                    h.stub().DetachClient(fpga_pb2.ServerClientRequest(client_id=cid),
                                                          timeout=self.config.server_timeout_s)
                                    continue
                                h.stub().RevokeClient(fpga_pb2.ServerClientRequest(client_id=cid),
                                                      timeout=self.config.server_timeout_s)
                                dropped += 1
                            continue
                        h.stub().CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=gid, design=g.design,
                                                                                 size=n),
                                                 timeout=self.config.server_timeout_s)
                        for c in clients:
                            if c.group_id == gid:
                                h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=c.id,
                                                                                   token=c.token),
                                                      timeout=self.config.server_timeout_s)
                        made += 1
                except grpc.RpcError as e:
                    log.warning("could not reconcile an FPGA-server", extra={"server": name, "code": e.code().name})
        if made or dropped:
            log.warning("FPGA-servers reconciled with the database", extra={"made": made, "dropped": dropped})
        return {"made": made, "dropped": dropped}

    def _autoscale_loop(self) -> None:
        self._every(self.config.autoscaler_interval_s, self.autoscale_once, "autoscaler")

    def autoscale_once(self) -> dict[str, int]:
        """One autoscaler round: per server, the policy resizes the elastic groups living there.

        The policy sees the server's groups with their limits: an elastic group
        that lives on this server alone keeps its own min/max; every other group
        (static, or spread over servers) is pinned to its size for the policy.
        """
        if self.config.autoscaler == "none":
            return {}
        with self.db.read() as s:
            groups = {g.id: g for g in s.scalars(select(Group).where(Group.deleted.is_(False)))}
        decided: dict[str, int] = {}
        where: dict[str, str] = {}          # group -> the server whose policy decided it
        servers = self.orch.servers
        for name, m in self.orch.ask_all(servers, "GetMeasurements", fpga_pb2.GetMeasurementsRequest()).items():
            if isinstance(m, grpc.RpcError):
                continue
            try:
                scaler = self.scalers.get(name) or self.scalers.setdefault(name, self._new_scaler(servers[name]))
            except grpc.RpcError:
                continue
            for gid, size in scaler.step(self._engine_view(m, groups)).items():  # type: ignore[arg-type]
                decided[gid] = size
                where[gid] = name
        # Shrinks first: a policy that moves a device from one group to another on a server means the device
        # the shrink frees; and a grow stays on that server (it would otherwise spread the group elsewhere).
        changes = [(gid, size) for gid, size in decided.items()
                   if (g := groups.get(gid)) is not None and g.elastic and size != g.size]
        for gid, size in sorted(changes, key=lambda c: c[1] - groups[c[0]].size):
            g = groups[gid]
            try:
                self.orch.resize(g, max(g.min_size, min(g.max_size, size)), pinned=[where[gid]])
            except HarnessError as e:
                log.info("autoscaler resize refused", extra={"group": gid, "reason": str(e)})
        return decided

    def _new_scaler(self, h: ServerHandle) -> autoscaler.Autoscaler:
        """A policy that knows what a reconfiguration costs on this server (when it weighs that)."""
        info = h.stub().GetServer(fpga_pb2.GetServerRequest(), timeout=self.config.server_timeout_s)
        try:
            return autoscaler.Autoscaler(self.config.autoscaler, reconfig_s=info.reconfiguration_s)
        except ValueError:
            return autoscaler.Autoscaler(self.config.autoscaler)

    @staticmethod
    def _engine_view(m: fpga_pb2.ServerMeasurements, groups: dict[str, Group]) -> eng.ServerMeasurements:
        out = []
        for c in m.groups:
            g = groups.get(c.group_id)
            movable = g is not None and g.elastic and len([n for n in g.parts.values() if n]) <= 1
            lo, hi = (g.min_size, g.max_size) if movable else (c.target, c.target)  # type: ignore[union-attr]
            out.append(eng.GroupMeasurement(
                c.group_id, c.design, c.active, c.target, c.joining, c.draining, min(lo, c.target),
                max(hi, c.target), c.completed, c.busy_device_s, c.waiting, c.running,
                tuple(eng.ClientMeasurement(k.client_id, k.completed, k.waiting, k.running) for k in c.clients),
                c.failed, c.incarnation))
        return eng.ServerMeasurements(m.time, m.devices, m.usable_devices, m.reconfigurations,
                                      m.reconfiguration_failures, tuple(out))
