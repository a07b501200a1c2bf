"""The clients of FPGA groups (irm_fpga.orchestrator): AttachClient puts one on every part of its group,
DetachClient and RevokeClient take it off; each against a resize or a delete of the group, which the Orchestrator's
placement lock serialises.
"""

from __future__ import annotations

import logging
import secrets
import threading
import uuid
import zlib
from typing import TYPE_CHECKING

import grpc
from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError

from harness.v1 import fpga_pb2
from irm_fpga.models import Client, Group
from irm_fpga.orchestrator_errors import check_id, rpc_error
from irm_fpga.orchestrator_servers import ServerHandle
from services.errors import (
    MANAGER_UNAVAILABLE,
    RETRY_LATER_S,
    Aborted,
    FailedPrecondition,
    HarnessError,
    InvalidArgument,
    NotFound,
    Unavailable,
    owned,
    require_tenant,
)

if TYPE_CHECKING:
    from irm_fpga.orchestrator import Orchestrator

# The Orchestrator's one logger: its operators (and tests) follow its records under that name, whichever module.
log = logging.getLogger("irm_fpga.orchestrator")
ATTACH_LOCK_STRIPES = 64
ATTACHING = "attaching"    # a client row whose AttachClient call has not completed


class ClientAttachments:
    """The FpgaOrchestrator API's client calls (the Orchestrator's methods call these), over its groups (`_group`),
    servers (`servers`, `_handle`, `ask_all`) and placement lock (`lock`): each looked up on it at each use, not
    copied, since its `servers` map is replaced as servers answer and tests replace its methods."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self.config = orch.config
        self.db = orch.db
        # Attaches under one client id take turns (a client's retry after a timeout waits for its first call):
        # a first call that failed would otherwise delete the row a concurrent retry had just attached under.
        # Striped, so memory stays bounded whatever ids clients send.
        self._attach_locks = tuple(threading.Lock() for _ in range(ATTACH_LOCK_STRIPES))

    def AttachClient(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g = self.orch._group(request.group_id)
        if not g.shared:
            owned(tenant, g.tenant, f"FPGA group {g.id!r} (private)")
        # What the FPGA-servers refuse (a NUL: their gRPC layer; empty is ours to fill) must be refused before
        # the row is written: a row no server takes would break every later part of the group (and PostgreSQL
        # cannot store a NUL at all).
        if len(request.client_id) > 64:
            raise InvalidArgument.of("client_id", "at most 64 characters (or leave it empty for one to be made)")
        if "\x00" in request.client_id:
            raise InvalidArgument.of("client_id", "must not contain a NUL character (\\x00)")
        client_id = request.client_id or f"fc-{uuid.uuid4().hex[:16]}"
        with self._attach_lock(client_id):
            return self.attach(tenant, g, client_id)

    def _attach_lock(self, client_id: str) -> threading.Lock:
        return self._attach_locks[zlib.crc32(client_id.encode()) % len(self._attach_locks)]

    def attach(self, tenant: str, g: Group, client_id: str) -> fpga_pb2.Attachment:
        g = self.orch._group(g.id)       # as it is now: a resize may have moved its parts while this call waited
        with self.db.read() as s:
            existing = s.get(Client, client_id)
        new = existing is None
        if new:
            token = secrets.token_hex(16)
            try:
                # "attaching" until every server took it: a concurrent call (another Orchestrator's) is told to
                # retry, never that the client is attached, since this call may yet fail and take it back.
                self.db.transact(lambda s: s.add(Client(id=client_id, group_id=g.id, tenant=tenant, token=token,
                                                        state=ATTACHING)))
            except IntegrityError:
                # A concurrent attach under this id (a retry after a timeout) wrote it first.
                with self.db.read() as s:
                    existing = s.get(Client, client_id)
                if existing is None:
                    raise Aborted(f"client {client_id!r} is being attached by another call; retry") from None
                new = False
        if existing is not None:
            owned(tenant, existing.tenant, f"client {client_id!r}")
            if existing.state == ATTACHING:
                raise Aborted(f"client {client_id!r} is being attached by another call; retry")
            if existing.state != "attached" or existing.group_id != g.id:
                raise FailedPrecondition(f"client {client_id!r} was {existing.state} or belongs to another group; "
                                         "attach under a new client id")
            token = existing.token
        accepted: list[ServerHandle] = []
        # Parts on servers that did not answer: left out of the answer (the client uses the others, and learns of
        # them on a later attach), the client put on them by the reconcile rounds once they answer. One silent
        # server of a group spread over several must not keep every client off the parts that work.
        silent: dict[str, HarnessError] = {}

        def attach_on(parts: dict[str, int]) -> None:
            for name, n in parts.items():
                # A server silent to this call is not asked again under the lock (with no breaker, each ask would
                # hold every placement for server_timeout_s); only parts a resize added meanwhile are new.
                if n <= 0 or name in silent or any(h.name == name for h in accepted):
                    continue
                try:
                    h = self.orch._handle(name)
                    h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=g.id, client_id=client_id,
                                                                       token=token),
                                          timeout=self.config.server_timeout_s)
                except Unavailable as e:
                    silent[name] = e
                    continue
                except grpc.RpcError as e:
                    if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise rpc_error(name, e) from None
                    silent[name] = rpc_error(name, e)
                    continue
                accepted.append(h)

        try:
            attach_on(g.parts)          # outside the lock: the servers' answers must not hold up placements
            with self.orch.lock:
                # Resizes and deletes take this lock and attach (or revoke) only clients already "attached": one
                # that ran while this call attached would leave this client off a part it added (a resize onto a
                # new server) or attached to a deleted group. So: the group as it is now, the client put on any
                # part it gained, and marked attached before either can run again.
                g = self.orch._group(g.id)      # NotFound if deleted meanwhile: taken back below
                if not new:
                    # Revokes and detaches mark the row under this lock: one that came after this call read the
                    # row must not be undone by the attach made meanwhile (a client library refreshes every
                    # second, with its old token).
                    with self.db.read() as s:
                        now_row = s.get(Client, client_id)
                    if now_row is None or now_row.state != "attached":
                        ended = now_row.state if now_row is not None else "removed"
                        self.revoke_everywhere(client_id, accepted,
                                               "DetachClient" if ended == "detached" else "RevokeClient")
                        raise FailedPrecondition(f"client {client_id!r} was {ended} or belongs to another group; "
                                                 "attach under a new client id")
                attach_on(g.parts)
                if not accepted and silent:
                    raise next(iter(silent.values()))       # no part answered: nothing to use yet
                if new and not self.db.transact(lambda s: s.execute(
                        update(Client).where(Client.id == client_id, Client.state == ATTACHING)
                        .values(state="attached")).rowcount):
                    raise Aborted(f"client {client_id!r} was detached or cleared while it was being attached; retry")
            ok = {h.name for h in accepted}
            parts = [fpga_pb2.AttachedPart(server=name, address=self.orch._handle(name).address, devices=n)
                     for name, n in g.parts.items() if n > 0 and name in ok]
            if silent:
                log.warning("client attached without the parts on FPGA-servers that did not answer; the reconcile "
                            "rounds attach it there once they do",
                            extra={"client": client_id, "group": g.id, "servers": sorted(silent)})
        except BaseException:
            if new:
                # Not attached anywhere, then: a retry under the same id starts afresh, and no row is left that
                # the reconcile rounds (and every later part of the group) would try to attach again.
                self.revoke_everywhere(client_id, accepted)
                self.db.transact(lambda s: s.execute(delete(Client).where(Client.id == client_id,
                                                                          Client.state == ATTACHING)))
            raise
        return fpga_pb2.Attachment(client_id=client_id, group_id=g.id, token=token, parts=parts, design=g.design)

    def revoke_everywhere(self, client_id: str, handles: list[ServerHandle], method: str = "RevokeClient") -> None:
        """Take an attach that did not complete (or should not have) back from `handles` with `method` (best
        effort: a server that does not answer is logged; it holds a client no one was given, until the rounds)."""
        replies = self.orch.ask_all({h.name: h for h in handles}, method,
                                    fpga_pb2.ServerClientRequest(client_id=client_id))
        for name, reply in replies.items():
            if isinstance(reply, grpc.RpcError):
                log.warning("could not take back an attach that did not complete",
                            extra={"client": client_id, "server": name, "code": reply.code().name})

    def _client(self, tenant: str, request: fpga_pb2.ClientRequest) -> tuple[Group, Client]:
        g = self.orch._group(request.group_id)
        check_id("client_id", request.client_id)
        with self.db.read() as s:
            c = s.get(Client, request.client_id)
        if c is None or c.group_id != g.id:
            raise NotFound(f"client {request.client_id!r} is not attached to {g.id!r}")
        return g, c

    def _to_servers(self, g: Group, method: str, client_id: str) -> int:
        """`method` for the client on every server of `g` at once: the tasks cancelled. A server that does not
        answer is UNAVAILABLE naming it, after the others have done it (the reconcile rounds finish it there)."""
        handles = {name: h for name in g.parts if (h := self.orch.servers.get(name)) is not None}
        total, failed = 0, []
        request = fpga_pb2.ServerClientRequest(client_id=client_id)
        for name, reply in self.orch.ask_all(handles, method, request).items():
            if isinstance(reply, grpc.RpcError):
                failed.append((name, reply))
            else:
                total += reply.cancelled           # type: ignore[attr-defined]
        if failed:
            name, e = failed[0]
            done = sorted(set(handles) - {n for n, _ in failed})
            raise Unavailable(f"{method} of client {client_id!r}: FPGA-server {name!r} did not answer "
                              f"({e.code().name}); done on {', '.join(done) or 'no other server'} "
                              f"({total} queued tasks cancelled); it holds there once that server answers "
                              "(the reconcile rounds), or retry", reason=MANAGER_UNAVAILABLE,
                              retry_after_s=RETRY_LATER_S)
        return total

    def _end_client(self, g: Group, c: Client, method: str, state: str) -> int:
        """`c` marked `state`, then taken off every part of `g` (`method` on its servers): tasks cancelled.

        Marked first, under the lock resizes take: a resize after it puts the client on no new part (resizes
        attach "attached" clients only), and the parts read with it include any a resize before it gave the
        client. Taken off the servers after, it was put back on a part a resize added meanwhile, and kept its
        access there. A server that does not answer now is set right by the reconcile rounds (they take every
        client the database does not hold attached off the servers); the call fails, and may be retried.
        """
        with self.orch.lock:
            g = self.orch._group(g.id)
            self.db.transact(lambda s: setattr(s.get(Client, c.id), "state", state))
        return self._to_servers(g, method, c.id)

    def DetachClient(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g, c = self._client(tenant, request)
        owned(tenant, c.tenant, f"client {c.id!r}")
        self._end_client(g, c, "DetachClient", "detached")
        return fpga_pb2.ClientResponse()

    def RevokeClient(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g, c = self._client(tenant, request)
        owned(tenant, g.tenant, f"FPGA group {g.id!r} (only its owner revokes clients)")
        return fpga_pb2.ClientResponse(cancelled=self._end_client(g, c, "RevokeClient", "revoked"))
