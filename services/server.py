"""Server bootstrap shared by every Harness service.

`create_server(address, components) -> (server, port)` builds a gRPC server
with health checking, reflection, the Diagnostics echo and the error-mapping
interceptor; `serve()` runs it until SIGTERM/SIGINT and shuts down gracefully.
Tests bind port 0 and read the port back.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from harness.v1 import diagnostics_pb2, diagnostics_pb2_grpc, irm_pb2
from services.db import unavailable_error
from services.errors import HarnessError, InvalidArgument, to_status
from services.launcher import LISTEN_FAILED

log = logging.getLogger(__name__)


def documented_files() -> dict[str, bytes]:
    """The API's proto files with their comments, serialized by name: gen/'s descriptor set (made with source
    info). The stubs' descriptors carry none, and a descriptor pool drops it, so reflection served the API
    without a word of its documentation."""
    import harness.v1

    files = descriptor_pb2.FileDescriptorSet.FromString(
        (Path(harness.v1.__file__).parent / "api_descriptor_set.binpb").read_bytes())
    return {f.name: f.SerializeToString() for f in files.file}


class DocumentedReflection(reflection.ReflectionServicer):
    """grpc-reflection's servicer, its answers' API files swapped for the same files with their comments, so a
    client with reflection alone (grpcurl describe, another language's tooling) reads the documentation."""

    def __init__(self, service_names: Iterable[str]) -> None:
        super().__init__(service_names)
        self._documented = documented_files()

    def _file_containing_symbol(self, request, fully_qualified_name):  # type: ignore[no-untyped-def]
        # The reflection protocol names a method as <package>.<service>.<method> (what `grpcurl describe
        # harness.v1.ResourceManager.Reserve` asks); upb's pool finds services and messages but not methods.
        service, _, method = fully_qualified_name.rpartition(".")
        try:
            found = self._pool.FindServiceByName(service).methods_by_name.get(method) if service else None
        except KeyError:
            found = None
        return super()._file_containing_symbol(request, service if found is not None else fully_qualified_name)

    def ServerReflectionInfo(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        for reply in super().ServerReflectionInfo(request_iterator, context):
            if reply.HasField("file_descriptor_response"):
                files = reply.file_descriptor_response.file_descriptor_proto
                for i, raw in enumerate(files):
                    documented = self._documented.get(descriptor_pb2.FileDescriptorProto.FromString(raw).name)
                    if documented is not None:
                        files[i] = documented
            yield reply


# grpc.reflection.v1: the stable name of the reflection service, which newer clients (grpcurl, buf curl, IDE
# plug-ins) ask first. grpcio-reflection serves only v1alpha; the two protos have the same messages, field
# numbers and method, so v1 is served by the same servicer, its file derived from v1alpha's.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"
_V1_FILE_LOCK = threading.Lock()    # servers made at once in one process (tests) add it once


def _reflection_v1_file() -> None:
    """Add grpc.reflection.v1's file (v1alpha's, renamed) to the default pool, once: reflection describes the
    services it lists, v1 included."""
    pool = descriptor_pool.Default()
    with _V1_FILE_LOCK:
        try:
            pool.FindFileByName(_V1_FILE)
        except KeyError:
            pool.AddSerializedFile(_v1_from_v1alpha().SerializeToString())


def _v1_from_v1alpha() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    old, new = fd.package, "grpc.reflection.v1"
    fd.name, fd.package = _V1_FILE, new
    fd.ClearField("options")
    # The type names referring to v1alpha's own messages.
    for message in fd.message_type:
        for f in message.field:
            if f.HasField("type_name"):
                f.type_name = f.type_name.replace(f".{old}.", f".{new}.")
    for service in fd.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{old}.", f".{new}.")
            method.output_type = method.output_type.replace(f".{old}.", f".{new}.")
    return fd


def _reflection_v1_handler(servicer: reflection.ReflectionServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(REFLECTION_V1, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)})


def _noop() -> None:
    return None


@dataclass
class Component:
    """One service's part of a server: its servicers and its background work."""

    name: str
    register: Callable[[grpc.Server], None]
    # Full proto service names, for health and reflection.
    service_names: list[str]
    start: Callable[[], None] = _noop
    # Shutting down, in this order: `quiesce` ends what would hold the server's grace period open (watch streams,
    # long calls waiting on work it cancels) and stops announcing the service (memberships); the server then
    # takes no new call and lets those in flight finish (within the grace period); `stop` releases what they
    # used (the database, threads, clients).
    quiesce: Callable[[], None] = _noop
    stop: Callable[[], None] = _noop
    extra: dict[str, Any] = field(default_factory=dict)
    # gRPC worker threads it needs (e.g. one per long-lived stream, plus room for other calls); the server
    # takes the largest wish of its components, at least the default.
    max_workers: int | None = None
    # Raises unless its database takes work again (see DatabaseHealth): run while the server reports NOT_SERVING
    # for its database, so that it comes back without waiting for a call.
    probe: Callable[[], None] | None = None
    # Who may act for which tenant (services.tenants.TenantAuth; None: anyone, a development setup): checked
    # before every call that names a tenant.
    auth: Any = None


# Consecutive calls failing on the database (DATABASE_UNAVAILABLE) that make the server report NOT_SERVING, and how
# often, meanwhile, the components' probes look whether it takes work again.
DB_FAILURES_NOT_SERVING = 3
DB_PROBE_INTERVAL_S = 5.0
# Failures count "in a row" while each comes within this long of the one before.
DB_FAILURE_WINDOW_S = 60.0
# Database errors of contention (left after the retries): answered UNAVAILABLE, never counted against health.
CONTENTION_CODES = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED", "40001", "40P01"})


class CallCap:
    """At most `limit` long-lived calls of one kind at once (streams, runs), each holding a server worker thread
    for as long as it lasts. One more is refused with `refuse(open, limit, *context)` (a RESOURCE_EXHAUSTED saying
    the setting to raise): a service sizes its pool as the cap plus workers of their own for the other calls, so
    that those never queue behind the long ones (idle streams, runs of days)."""

    def __init__(self, limit: int, refuse: Callable[..., HarnessError]) -> None:
        self.limit = limit
        self._refuse = refuse
        self._lock = threading.Lock()
        self.open = 0

    def take(self, *context: object) -> None:
        with self._lock:
            if self.open >= self.limit:
                raise self._refuse(self.open, self.limit, *context)
            self.open += 1

    def give_back(self) -> None:
        with self._lock:
            self.open -= 1


class DatabaseHealth:
    """The server's health as its database makes it: NOT_SERVING (every service) once `threshold` calls in a row
    (each within DB_FAILURE_WINDOW_S of the last) failed on the database (its environment: a full disk, a server
    down; services.db.unavailability; contention is not counted), SERVING again
    once the database does the work again: a call of a method that failed so succeeds, or every component's probe
    passes (tried every `probe_interval_s` meanwhile). Calls that never failed on it (a health check, a read that
    works on a full disk) neither count nor clear: only the work that failed proves it works again.
    Never raises into a call."""

    def __init__(self, threshold: int = DB_FAILURES_NOT_SERVING,
                 probe_interval_s: float = DB_PROBE_INTERVAL_S) -> None:
        self.threshold = threshold
        self.probe_interval_s = probe_interval_s
        self._lock = threading.Lock()
        self._failures = 0
        self._last_failure = -math.inf      # monotonic time of the last failure counted
        self._failed: set[str] = set()       # methods that failed on the database since it last worked
        self.down = False                    # NOT_SERVING because of the database
        self._health: health.HealthServicer | None = None
        self._names: list[str] = []
        self._probes: list[Callable[[], None]] = []
        self._closed = threading.Event()
        self._prober: threading.Thread | None = None

    def attach(self, health_servicer: health.HealthServicer, names: list[str],
               probes: list[Callable[[], None]]) -> None:
        self._health, self._names, self._probes = health_servicer, [*names, ""], probes

    def failed(self, method: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last_failure > DB_FAILURE_WINDOW_S:
                self._failures = 0           # "in a row" within a while: sporadic failures over hours never add up
            self._last_failure = now
            self._failures += 1
            self._failed.add(method)
            if self.down or self._failures < self.threshold:
                return
            self.down = True
            log.error("%d calls in a row failed on the database: reporting NOT_SERVING until it works again",
                      self._failures)
            self._set(health_pb2.HealthCheckResponse.NOT_SERVING)
            if self._probes and self._prober is None and not self._closed.is_set():
                self._prober = threading.Thread(target=self._probe_loop, name="db-probe", daemon=True)
                self._prober.start()

    def succeeded(self, method: str) -> None:
        if method not in self._failed:       # the usual case: nothing to clear (a set look-up, no lock)
            return
        self._recovered(f"{method} succeeded")

    def _recovered(self, how: str) -> None:
        with self._lock:
            self._failures = 0
            self._failed.clear()
            if self.down:
                self.down = False
                log.warning("the database works again (%s): reporting SERVING", how)
                self._set(health_pb2.HealthCheckResponse.SERVING)

    def _set(self, status: int) -> None:
        if self._health is None:
            return
        for name in self._names:             # after graceful shutdown began, the servicer ignores these
            self._health.set(name, status)

    def _probe_loop(self) -> None:
        while not self._closed.wait(self.probe_interval_s):
            with self._lock:
                if not self.down:            # a call proved it works: done (the next NOT_SERVING starts another)
                    self._prober = None
                    return
            try:
                for probe in self._probes:
                    probe()
            except Exception as e:  # noqa: BLE001 - still down: try again later
                if unavailable_error(e) is None:
                    log.warning("database probe failed", exc_info=True)
                continue
            self._recovered("probe")

    def close(self) -> None:
        self._closed.set()


def _abort(context: grpc.ServicerContext, error: HarnessError) -> None:
    context.abort_with_status(rpc_status.to_status(to_status(error)))


def _internal(context: grpc.ServicerContext, method: str, exc: BaseException, db_health: DatabaseHealth) -> None:
    """`exc`, which no handler expected: UNAVAILABLE (DATABASE_UNAVAILABLE) when the database's environment failed
    (a full disk, a server down: services.db.unavailability), INTERNAL for anything else (a bug)."""
    try:
        unavailable = unavailable_error(exc)
    except Exception:  # noqa: BLE001 - telling it apart must never hide the error itself
        log.exception("could not classify an error in %s", method)
        unavailable = None
    if unavailable is not None:
        log.warning("the database failed in %s: %s", method, unavailable.message, extra={"method": method})
        # Contention left after the retries (busy, locked) is load, not the database failing: retryable, but it
        # does not take the server out of service.
        if unavailable.metadata.get("code") not in CONTENTION_CODES:
            db_health.failed(method)
        _abort(context, unavailable)
        return
    log.exception("unexpected error in %s", method, extra={"method": method})
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}; see the service log")


def nul_field(message: Any, prefix: str = "") -> str | None:
    """The path of the first string field of `message` holding a NUL character, if any (nested, repeated, maps).

    PostgreSQL's text cannot hold one (the driver raises, which read as an internal error) and no name, id or
    key of ours needs it: every service refuses it up front, the same on every database.
    """
    for fd, value in message.ListFields():
        path = f"{prefix}{fd.name}"
        if fd.type == fd.TYPE_STRING:
            items = value if fd.is_repeated else [value]
            if any("\x00" in v for v in items):
                return path
        elif fd.type == fd.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                for k, v in value.items():
                    if isinstance(k, str) and "\x00" in k or isinstance(v, str) and "\x00" in v:
                        return f"{path}[{k!r}]"
                    if hasattr(v, "ListFields") and (found := nul_field(v, f"{path}[{k!r}].")):
                        return found
            else:
                items = value if fd.is_repeated else [value]
                for i, item in enumerate(items):
                    sub = f"{path}[{i}]." if fd.is_repeated else f"{path}."
                    if found := nul_field(item, sub):
                        return found
    return None


_NUL = "must not contain a NUL character (\\x00)"


def _refuse_nul(request: Any) -> None:
    if hasattr(request, "ListFields") and (path := nul_field(request)):
        raise InvalidArgument.of(path, _NUL)


def _unimplemented(context: grpc.ServicerContext, method: str, exc: Exception) -> None:
    """A generated servicer's method this service does not implement (the Orchestrator's ReserveBatch, which a CRS
    tries first) raised `exc`: answered UNIMPLEMENTED, an answer rather than a fault with a traceback to log."""
    if isinstance(exc, NotImplementedError) and context.code() == grpc.StatusCode.UNIMPLEMENTED:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented by this service")


class Undecodable:
    """What a request's bytes became when they did not decode as its message (invalid UTF-8 in a string field --
    protobuf.js encodes a lone surrogate so --, a truncated message, field number 0...). grpc itself answers
    those INTERNAL "Exception deserializing request!" and logs a traceback per call; the guard answers this one
    INVALID_ARGUMENT naming the message, and nothing is logged: it is the caller's input, not our fault."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def error(self) -> InvalidArgument:
        return InvalidArgument.of("request", self.message)


def _decoding(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer`, answering `Undecodable` rather than raising for bytes that are no such message."""
    if deserializer is None:
        return None
    owner = getattr(deserializer, "__self__", None)
    name = getattr(getattr(owner, "DESCRIPTOR", None), "full_name", "the method's request message")

    def decode(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as e:  # noqa: BLE001 - whatever the bytes do to the parser, they are the caller's
            return Undecodable(
                f"the bytes sent do not decode as a {name} ({type(e).__name__}: {e}); check that every string "
                "field is valid UTF-8 (no lone UTF-16 surrogates) and that the message is whole")

    return decode


def _reserve_batch(behaviour: Callable[[Any, Any], Any], request: irm_pb2.ReserveBatchRequest,
                   context: grpc.ServicerContext) -> irm_pb2.ReserveBatchResponse:
    """ReserveBatch answers each request as Reserve would: a request holding a NUL gets its own
    INVALID_ARGUMENT outcome (the field named as in that request, as Reserve's BadRequest names it); the
    handler sees, and answers, only the others."""
    refused: dict[int, irm_pb2.ReserveOutcome] = {}
    for i, one in enumerate(request.requests):
        if path := nul_field(one):
            refused[i] = irm_pb2.ReserveOutcome(error=irm_pb2.ReserveError(
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=f"{path}: {_NUL}",
                field_violations=[irm_pb2.ReserveFieldViolation(field=path, description=_NUL)]))
    if not refused:
        return behaviour(request, context)
    rest = [one for i, one in enumerate(request.requests) if i not in refused]
    if rest:
        reply = behaviour(irm_pb2.ReserveBatchRequest(requests=rest), context)
        if len(reply.outcomes) != len(rest):
            raise RuntimeError(f"ReserveBatch answered {len(reply.outcomes)} outcomes for {len(rest)} requests")
        answered = iter(reply.outcomes)
    else:
        answered = iter(())
    return irm_pb2.ReserveBatchResponse(
        outcomes=[refused[i] if i in refused else next(answered) for i in range(len(request.requests))])


class ErrorInterceptor(grpc.ServerInterceptor):
    """Maps domain errors to statuses; nothing escapes as UNKNOWN."""

    def __init__(self, db_health: DatabaseHealth | None = None, auth: Any = None) -> None:
        # method -> (its handler, the guarded handler): wrapping is done once per method,
        # not per call (the server asks for every RPC, on its one polling thread).
        self._guarded: dict[str, tuple[Any, Any]] = {}
        self.db_health = db_health if db_health is not None else DatabaseHealth()
        self.auth = auth

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        known = self._guarded.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        guarded = self._guard(handler, method, self.db_health, self.auth)
        self._guarded[method] = (handler, guarded)
        return guarded

    @staticmethod
    def _guard(handler, method, db_health: DatabaseHealth, auth: Any):  # type: ignore[no-untyped-def]
        check = auth.check if auth is not None else (lambda _request, _context: None)

        def guard_unary(behaviour):  # type: ignore[no-untyped-def]
            def wrapped(request, context):  # type: ignore[no-untyped-def]
                try:
                    if type(request) is Undecodable:
                        raise request.error()
                    check(request, context)
                    if isinstance(request, irm_pb2.ReserveBatchRequest):
                        reply = _reserve_batch(behaviour, request, context)
                    else:
                        _refuse_nul(request)
                        reply = behaviour(request, context)
                except HarnessError as e:
                    _abort(context, e)
                except Exception as e:  # noqa: BLE001
                    _unimplemented(context, method, e)
                    if context.code() is not None:  # the handler aborted on purpose
                        raise
                    _internal(context, method, e, db_health)
                else:
                    db_health.succeeded(method)
                    return reply

            return wrapped

        def guard_stream(behaviour):  # type: ignore[no-untyped-def]
            def wrapped(request, context) -> Iterator[Any]:  # type: ignore[no-untyped-def]
                try:
                    if type(request) is Undecodable:
                        raise request.error()
                    check(request, context)
                    _refuse_nul(request)
                    yield from behaviour(request, context)
                except HarnessError as e:
                    _abort(context, e)
                except Exception as e:  # noqa: BLE001
                    _unimplemented(context, method, e)
                    if context.code() is not None:
                        raise
                    _internal(context, method, e, db_health)
                else:
                    db_health.succeeded(method)

            return wrapped

        decode = _decoding(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                guard_unary(handler.unary_unary),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                guard_stream(handler.unary_stream),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )

        def check_each(behaviour):  # type: ignore[no-untyped-def]
            # A stream of requests: each is checked as it is read (a tenant named in the first or the hundredth).
            # A message that did not decode ends the stream INVALID_ARGUMENT where it stands: the handler never
            # sees it, and what it answered before stands (what came after it is not read).
            def wrapped(request_iterator, context):  # type: ignore[no-untyped-def]
                def checked():  # type: ignore[no-untyped-def]
                    for request in request_iterator:
                        if type(request) is Undecodable:
                            raise request.error()
                        check(request, context)
                        yield request
                return behaviour(checked(), context)

            return wrapped

        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                guard_unary(check_each(handler.stream_unary)),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            guard_stream(check_each(handler.stream_stream)),
            request_deserializer=decode,
            response_serializer=handler.response_serializer,
        )


class DiagnosticsServicer(diagnostics_pb2_grpc.DiagnosticsServicer):
    def __init__(self, service: str) -> None:
        self.service = service

    def Echo(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return diagnostics_pb2.EchoResponse(payload=request.payload, service=self.service)


SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


@dataclass
class Running:
    server: grpc.Server
    port: int
    health: health.HealthServicer
    components: list[Component]
    db_health: DatabaseHealth = field(default_factory=DatabaseHealth)

    def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, quiesce every component, stop the server (new calls are refused at once, calls in
        flight have `grace` seconds to finish), then stop every component: a write in flight still finds its
        database open."""
        self.health.enter_graceful_shutdown()
        self.db_health.close()
        self._each("quiescing", lambda c: c.quiesce())
        self.server.stop(grace).wait()
        self._each("stopping", lambda c: c.stop())

    def _each(self, what: str, step: Callable[[Component], None]) -> None:
        for c in self.components:
            try:
                step(c)
            except Exception:  # noqa: BLE001 - one component's failure must not keep the others running
                log.exception("%s %s failed", what, c.name)


DEFAULT_MAX_WORKERS = 32


def create_server(
    address: str,
    components: Iterable[Component],
    *,
    max_workers: int | None = None,
    max_concurrent_rpcs: int | None = None,
    db_health: DatabaseHealth | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """`db_health`: how the database's failures make the server's health (default: a DatabaseHealth of its own);
    `credentials`: TLS (services.tls.server_credentials), else plaintext."""
    components = list(components)
    if max_workers is None:
        max_workers = max([DEFAULT_MAX_WORKERS, *(c.max_workers for c in components if c.max_workers)])
    db_health = db_health if db_health is not None else DatabaseHealth()
    auths = {id(c.auth): c.auth for c in components if c.auth is not None}
    if len(auths) > 1:
        raise ValueError("the components of one server must share one tenant authentication")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
        interceptors=[ErrorInterceptor(db_health, next(iter(auths.values()), None))],
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [diagnostics_pb2.DESCRIPTOR.services_by_name["Diagnostics"].full_name]
    diagnostics_pb2_grpc.add_DiagnosticsServicer_to_server(
        DiagnosticsServicer("+".join(c.name for c in components)), server
    )
    for c in components:
        c.register(server)
        names += c.service_names
    _reflection_v1_file()
    reflector = DocumentedReflection([*names, reflection.SERVICE_NAME, REFLECTION_V1, health.SERVICE_NAME])
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflector, server)
    server.add_generic_rpc_handlers((_reflection_v1_handler(reflector),))
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as e:                 # grpc raises (rather than returning 0) when the port is taken
        raise OSError(f"{LISTEN_FAILED} {address} (in use by another process?): {e}") from None
    if port == 0:
        raise OSError(f"could not bind {address}")
    for name in names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    db_health.attach(health_servicer, names, [c.probe for c in components if c.probe is not None])
    return server, port, health_servicer


def start(address: str, components: Iterable[Component], **kwargs: Any) -> Running:
    """Create, start, run the components' start hooks, then report SERVING. `db_health` (optional): see
    create_server."""
    components = list(components)
    db_health = kwargs.pop("db_health", None) or DatabaseHealth()
    server, port, health_servicer = create_server(address, components, db_health=db_health, **kwargs)
    server.start()
    running = Running(server, port, health_servicer, components, db_health)
    for c in components:
        c.extra["port"] = port
        c.start()
    diagnostics = diagnostics_pb2.DESCRIPTOR.services_by_name["Diagnostics"].full_name
    for name in [diagnostics, *(n for c in components for n in c.service_names)]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return running


def serve(
    address: str,
    components: Iterable[Component],
    *,
    port_file: str | None = None,
    grace: float = 5.0,
    **kwargs: Any,
) -> None:
    """Run until SIGTERM or SIGINT, then drain and stop."""
    running = start(address, components, **kwargs)
    host = address.rsplit(":", 1)[0]
    log.info("serving", extra={"address": f"{host}:{running.port}"})
    if port_file:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(str(running.port))
        tmp.replace(port_file)  # atomic: a reader never sees a half-written port
    stopping = threading.Event()

    def on_signal(signum, _frame):  # type: ignore[no-untyped-def]
        log.info("shutting down", extra={"signal": signal.Signals(signum).name})
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping.wait()
    running.stop(grace)
    log.info("stopped")
