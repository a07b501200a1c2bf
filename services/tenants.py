"""Tenant authentication: who may act as which tenant.

Every tenant call names its tenant in the request (`tenant`); without authentication anyone who reaches an
address may name any tenant and read, release or run in another tenant's reservations. A service given a
*tenants file* takes a call naming a tenant only when its metadata carries that tenant's token
(`authorization: Bearer <token>`, what gRPC tooling in every language sends), or the deployment's *delegation
token* (`x-harness-delegation`): the services that act for tenants (the CRS towards its IRMs, the application
manager towards the CRS and the agents) hold it and send it. The services that only check it hold its SHA-256
(`delegation_sha256`), never the token: an agent runs tenants' programs, which can read what it holds, and must
hold nothing that acts for every tenant. (It is not the control token, which the agent holds for its own calls.)

The file (YAML) maps each tenant to the SHA-256 of its token, never the token itself:

    tenants:
      alice: sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08

`harness tenant add NAME --file F` makes a token, prints it once and writes its digest. A service re-reads the file
when it changes (looked at once a second at most), so tenants come and go without a restart; a file it cannot read
any more (deleted, unreadable, malformed) refuses every tenant (UNAVAILABLE) until it is fixed: a revocation is
never silently ignored. A service without a file checks nothing (a development setup).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from services.config import ConfigError, known_keys, read_yaml
from services.errors import PermissionDenied, Unauthenticated, Unavailable
from services.files import write_atomic

log = logging.getLogger(__name__)

METADATA_KEY = "authorization"
SCHEME = "Bearer"
DELEGATION_KEY = "x-harness-delegation"
ENV_TOKEN = "HARNESS_TENANT_TOKEN"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# How often, at most, a service looks whether its tenants file changed.
RELOAD_CHECK_S = 1.0
# A refused call is logged at most this often per tenant and cause (a client retrying in a loop floods nothing).
REFUSAL_LOG_S = 60.0


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe (a header value as it is)."""
    return secrets.token_urlsafe(32)


def digest(token: str) -> str:
    """What a tenants file (or `delegation_sha256`) holds for `token`. A token is random and long, so a plain hash
    is safe to keep: no dictionary to try it against."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def parse(data: Any, where: str) -> dict[str, str]:
    """tenant -> digest from a tenants file's document; ConfigError naming what to fix."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with `tenants:`, got {type(data).__name__}")
    known_keys(data, ["tenants"], where)
    tenants = data.get("tenants") or {}
    if not isinstance(tenants, dict):
        raise ConfigError(f"{where}: tenants must map each tenant to sha256:<hex digest of its token>")
    out: dict[str, str] = {}
    for name, value in tenants.items():
        if not isinstance(name, str) or not name or len(name) > 128 or "\x00" in name:
            raise ConfigError(f"{where}: tenant {name!r}: a tenant is a non-empty string of at most 128 characters")
        if not isinstance(value, str) or not _DIGEST.fullmatch(value):
            raise ConfigError(f"{where}: tenant {name!r}: expected sha256:<64 hex digits> (the digest of its token; "
                              f"`harness tenant add` writes it), got {value!r}")
        out[name] = value
    return out


def read(path: str) -> dict[str, str]:
    return parse(read_yaml(path, "tenants file"), f"tenants file {path}")


def _stat(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode


class TenantFile:
    """The tenants of a file, re-read when it changes. `who(token)`: the tenant whose token it is, or None;
    `broken`: why the file cannot be used now (every tenant refused meanwhile), or ""."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = _stat(path)
        self._by_digest = self._index(read(path))        # start-up: a bad file is a ConfigError, fix it first
        self.broken = ""
        self._checked = clock()

    @staticmethod
    def _index(tenants: dict[str, str]) -> dict[str, str]:
        return {d: name for name, d in tenants.items()}

    def who(self, token: str) -> str | None:
        self._maybe_reload()
        return self._by_digest.get(digest(token))

    def _maybe_reload(self) -> None:
        now = self._clock()
        if now - self._checked < RELOAD_CHECK_S:
            return
        with self._lock:
            if now - self._checked < RELOAD_CHECK_S:
                return
            self._checked = now
            stamp = _stat(self.path)
            if stamp == self._stamp:
                return
            self._stamp = stamp                            # a file that stays broken is read (and logged) once
            try:
                tenants = read(self.path)
            except ConfigError as e:
                # Fail closed: keeping the tenants read before would keep a revoked tenant in for as long as the
                # file stays unusable, while `harness tenant remove` said it was out.
                self._by_digest, self.broken = {}, str(e)
                log.error("every tenant is refused until the tenants file is fixed: %s", e)
                return
            self._by_digest = self._index(tenants)
            if self.broken:
                log.warning("the tenants file can be used again: %d tenant(s)", len(tenants))
            else:
                log.info("tenants file re-read: %d tenant(s)", len(tenants))
            self.broken = ""


def _tenants_of(request: Any) -> list[str]:
    """The tenants a request acts for: its `tenant`, or each batched request's."""
    inner = getattr(request, "requests", None)
    if inner is not None and not isinstance(inner, str | bytes):
        return sorted({t for r in inner for t in _tenants_of(r)})
    tenant = getattr(request, "tenant", None)
    return [tenant] if isinstance(tenant, str) and tenant else []


def _metadata(context: Any) -> dict[str, str]:
    # A servicer called in-process (embedding code, tests) may have a context without metadata.
    get = getattr(context, "invocation_metadata", None)
    return dict((get() if get else None) or ())


def forwarded(context: Any) -> list[tuple[str, str]]:
    """The call's tenant credentials (its bearer token, its delegation token), to send on with a call made to
    answer it: a service that asks another for a tenant's data on the caller's behalf (the compute IRM asking an
    agent for a VM's metrics) proves what the caller proved, and holds nothing that would act for every tenant."""
    metadata = _metadata(context)
    return [(k, metadata[k]) for k in (METADATA_KEY, DELEGATION_KEY) if metadata.get(k)]


def bearer(context: Any) -> str:
    """The token of the call's `authorization: Bearer <token>`, or ""."""
    scheme, _, token = _metadata(context).get(METADATA_KEY, "").strip().partition(" ")
    return token.strip() if scheme.lower() == SCHEME.lower() else ""


@dataclass
class TenantAuth:
    """Checks that a call may act for the tenants its request names (see the module's doc). `delegation`: the
    digest of the delegation token it takes for any tenant ("" none)."""

    tenants: TenantFile
    delegation: str
    _logged: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)
    _log_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def delegated(self, context: Any) -> bool:
        given = _metadata(context).get(DELEGATION_KEY, "")
        return bool(self.delegation and given) and hmac.compare_digest(digest(given), self.delegation)

    def check(self, request: Any, context: Any) -> None:
        names = _tenants_of(request)
        if not names or self.delegated(context):
            return
        try:
            token = bearer(context)
            if not token and _metadata(context).get(DELEGATION_KEY):
                # A service acting for the tenant (a CRS above, the AM) whose delegation token this one does not
                # take: "no tenant token" sent its operator looking at the tenant.
                raise Unauthenticated(
                    f"tenant {names[0]!r}: the call carries a delegation token this service does not accept (its "
                    "delegation_sha256 is not the digest of the calling service's delegation_token, or it has "
                    "none): the operator must make them agree (harness tenant delegation); a tenant sends its own "
                    f"token as '{METADATA_KEY}: {SCHEME} <token>' instead")
            self._check(names, token)
        except (Unauthenticated, PermissionDenied, Unavailable) as e:
            self._log_refusal(names[0], type(e).__name__, context, e.message)
            raise

    def _check(self, names: list[str], token: str) -> None:
        if not token:
            raise Unauthenticated(
                f"tenant {names[0]!r}: the call carries no tenant token; send metadata '{METADATA_KEY}: {SCHEME} "
                f"<token>' (the harness CLI and client library: the environment variable {ENV_TOKEN}); the operator "
                "gives tenants their tokens (harness tenant add)")
        who = self.tenants.who(token)
        if self.tenants.broken:
            raise Unavailable("this service cannot use its tenants file now, so it refuses every tenant until the "
                              "operator fixes it (its log says why); try again later")
        if who is None:
            raise Unauthenticated("the tenant token sent is no tenant's of this deployment (mistyped, revoked, or "
                                  "another deployment's): ask the operator for yours")
        others = [n for n in names if n != who]
        if others:
            raise PermissionDenied(f"the token sent is the one of tenant {who!r}: it cannot act for tenant {others[0]!r}")

    def _log_refusal(self, tenant: str, cause: str, context: Any, message: str) -> None:
        now, key = time.monotonic(), (cause, tenant)
        with self._log_lock:
            if now - self._logged.get(key, -REFUSAL_LOG_S) < REFUSAL_LOG_S:
                return
            if len(self._logged) > 10_000:          # names are the caller's: keep the table bounded
                self._logged.clear()
            self._logged[key] = now
        peer = context.peer() if hasattr(context, "peer") else "?"
        log.warning("refused a call for tenant %r from %s: %s (%s; logged once a minute per tenant and cause)",
                    tenant[:128], peer, cause, message[:600])


def _accepted(service: str, delegation_sha256: str, delegation_token: str) -> str:
    if delegation_sha256 and not _DIGEST.fullmatch(delegation_sha256):
        raise ConfigError(f"{service}: delegation_sha256 must be sha256:<64 hex digits> (`harness tenant "
                          f"delegation` prints one), got {delegation_sha256[:80]!r}")
    return delegation_sha256 or (digest(delegation_token) if delegation_token else "")


def auth(tenants_file: str, service: str, *, delegation_sha256: str = "", delegation_token: str = "",
         takes_delegation: bool = True, delegates: bool = False) -> TenantAuth | None:
    """A service's TenantAuth from its settings (None: no tenants file, nothing checked); ConfigError when the
    file cannot be used, or when the service takes calls the CRS or the AM make for tenants (`takes_delegation`)
    and has no delegation digest to check them with (`delegation_sha256`, or that of its own `delegation_token`;
    `delegates`: it sends one too, as the CRS does, and the fix to name is its `delegation_token`)."""
    accepted = _accepted(service, delegation_sha256, delegation_token)
    if not tenants_file:
        return None
    if takes_delegation and not accepted:
        if delegates:
            # It sends the token too (the CRS to its managers): the token itself, whose digest it then accepts.
            raise ConfigError(f"{service}: tenants_file needs delegation_token too (the suite's, as the AM's; "
                              "`harness tenant delegation` makes one): without it, the AM's calls for tenants would "
                              "be refused here and this service's at the managers")
        raise ConfigError(f"{service}: tenants_file needs delegation_sha256 too (the SHA-256 of the CRS's and the "
                          "AM's delegation_token; `harness tenant delegation` makes a pair): without it, the calls "
                          "they make for tenants would be refused")
    return TenantAuth(TenantFile(tenants_file), accepted)


def delegation(tenants_file: str, delegation_token: str, service: str) -> str:
    """The delegation token a service acting for tenants (the CRS, the AM) sends: its `delegation_token`, which it
    may hold only with a tenants file -- a service that checks no tenant would act for anyone who names one."""
    if delegation_token and not tenants_file:
        raise ConfigError(f"{service}: delegation_token without tenants_file would act for any tenant a caller "
                          "names at services that check tenants: give it the tenants file too")
    if tenants_file and not delegation_token:
        # Fine while the services it calls check no tenant; where they do, its calls for tenants are refused.
        log.warning("%s checks tenants but has no delegation_token: the services it calls for tenants refuse those "
                    "calls if they check tenants too (give it the suite's delegation_token)", service)
    return delegation_token


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, key: str, value: str) -> None:
        self._pair = (key, value)

    def _with(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or ()), self._pair])

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._with(client_call_details), requests)

    def intercept_stream_stream(self, continuation, client_call_details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._with(client_call_details), requests)


def channel(base: grpc.Channel, token: str) -> grpc.Channel:
    """`base`, sending tenant `token` with every call (as it is when the token is empty)."""
    return grpc.intercept_channel(base, _Metadata(METADATA_KEY, f"{SCHEME} {token}")) if token else base


def delegating(base: grpc.Channel, token: str) -> grpc.Channel:
    """`base`, sending the delegation `token` with every call (as it is when the token is empty)."""
    return grpc.intercept_channel(base, _Metadata(DELEGATION_KEY, token)) if token else base


def tenant_channel(address: str, token: str | None = None) -> grpc.Channel:
    """A new channel to `address` that sends a tenant's token: `token`, else $HARNESS_TENANT_TOKEN (neither:
    nothing is sent, for a deployment without a tenants file). The environment rather than a command-line flag: a
    process's arguments are visible to everyone on the machine."""
    token = os.environ.get(ENV_TOKEN, "") if token is None else token
    from services import tls

    return channel(tls.open_channel(address), token.strip())


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """One `harness tenant` edit of `path` at a time: two read-modify-writes at once would lose one (a removed
    tenant brought back)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def add(path: str, name: str) -> str:
    """Give tenant `name` a new token in the file at `path` (made if missing; a tenant already there gets a new
    one, the old one stops working): the token, which is kept nowhere else."""
    parse({"tenants": {name: digest("x")}}, "tenant")                 # the name's own rules, before any write
    with _locked(path):
        tenants = read(path) if Path(path).exists() else {}
        token = new_token()
        tenants[name] = digest(token)
        write(path, tenants)
    return token


def remove(path: str, name: str) -> bool:
    """Take tenant `name` out of the file: its token stops working. False if it was not there."""
    with _locked(path):
        tenants = read(path) if Path(path).exists() else {}
        if tenants.pop(name, None) is None:
            return False
        write(path, tenants)
    return True


def write(path: str, tenants: dict[str, str]) -> None:
    """The file, replaced atomically (a service re-reading it never sees half of it), with the mode and owner it
    had (new: 0600): an operator's file made readable to the services' user stays readable to them."""
    import yaml

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.stat(target)
        mode, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
    except FileNotFoundError:
        mode, owner = 0o600, None
    text = ("# Harness tenants: each tenant's token's SHA-256 (harness tenant add/remove; services re-read this "
            "file)\n" + yaml.safe_dump({"tenants": dict(sorted(tenants.items()))}, sort_keys=False))
    write_atomic(target, text.encode(), mode, owner)
