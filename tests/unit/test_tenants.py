"""Tenant authentication (services.tenants): the tenants file, the check every server runs, the CLI's verbs."""

from __future__ import annotations

import os
import stat

import grpc
import pytest

from harness.v1 import irm_pb2, irm_pb2_grpc
from services import control, server, tenants
from services.config import ConfigError
from services.errors import PermissionDenied, Unauthenticated, Unavailable
from services.tls import plain_channel

DELEGATION = "delegation-secret"


class _Context:
    def __init__(self, *metadata: tuple[str, str]) -> None:
        self._metadata = metadata

    def invocation_metadata(self):  # type: ignore[no-untyped-def]
        return self._metadata


def _bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def two(tmp_path):  # type: ignore[no-untyped-def]
    path = str(tmp_path / "tenants.yaml")
    return path, tenants.add(path, "alice"), tenants.add(path, "bob")


def test_add_writes_digests_only_private_and_a_new_token_replaces_the_old(two) -> None:
    path, alice, bob = two
    text = open(path).read()
    assert alice not in text and bob not in text
    assert tenants.digest(alice) in text and tenants.digest(bob) in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = tenants.add(path, "alice")
    assert again != alice
    assert tenants.read(path) == {"alice": tenants.digest(again), "bob": tenants.digest(bob)}
    assert tenants.remove(path, "bob") is True
    assert tenants.remove(path, "bob") is False
    assert list(tenants.read(path)) == ["alice"]


@pytest.mark.parametrize(("text", "says"), [
    ("- alice\n", "expected a mapping with `tenants:`"),
    ("tenant:\n  alice: sha256:00\n", "unknown key(s) ['tenant']"),
    ("tenants:\n  alice: s3cret\n", "tenant 'alice': expected sha256:<64 hex digits>"),
    ("tenants:\n  '': sha256:" + "0" * 64 + "\n", "a tenant is a non-empty string"),
    ("tenants: [alice]\n", "tenants must map each tenant"),
    ("tenants:\n  alice: [\n", "is not valid YAML"),
])
def test_a_bad_tenants_file_is_refused_saying_what_to_fix(tmp_path, text: str, says: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as e:
        tenants.auth(str(path), "crs", delegation_token=DELEGATION)
    assert says in str(e.value)


def test_the_settings_a_service_is_refused_with(two, tmp_path) -> None:
    path, _, _ = two
    # A service that takes the CRS's and the AM's calls for tenants needs the digest to check them with.
    with pytest.raises(ConfigError, match="agent: tenants_file needs delegation_sha256 too"):
        tenants.auth(path, "agent")
    # The CRS sends the token too: the fix to name is the token itself (review 25: told delegation_sha256, an
    # operator gave it and had a CRS whose calls for tenants the managers refused).
    with pytest.raises(ConfigError, match="^crs: tenants_file needs delegation_token too"):
        tenants.auth(path, "crs", delegates=True)
    assert tenants.auth(path, "crs", delegation_token=DELEGATION, delegates=True) is not None
    with pytest.raises(ConfigError, match="delegation_sha256 must be sha256:<64 hex digits>"):
        tenants.auth(path, "agent", delegation_sha256=DELEGATION)
    assert tenants.auth(path, "am", takes_delegation=False) is not None
    with pytest.raises(ConfigError, match="cannot read tenants file"):
        tenants.auth(str(tmp_path / "missing.yaml"), "crs", delegation_token=DELEGATION)
    assert tenants.auth("", "crs") is None
    # A service acting for tenants without checking them would act for anyone who names one.
    with pytest.raises(ConfigError, match="am: delegation_token without tenants_file would act for any tenant"):
        tenants.delegation("", DELEGATION, "am")
    assert tenants.delegation(path, DELEGATION, "am") == DELEGATION


def test_the_check_tells_missing_unknown_and_someone_elses_tokens_apart(two) -> None:
    path, alice, bob = two
    auth = tenants.auth(path, "agent", delegation_sha256=tenants.digest(DELEGATION))
    assert auth is not None
    request = irm_pb2.GetReservationRequest(tenant="alice", reservation_id="r")
    auth.check(request, _Context(_bearer(alice)))
    auth.check(request, _Context(("authorization", f"bearer   {alice} ")))      # the scheme is case-insensitive
    auth.check(request, _Context(("x-harness-delegation", DELEGATION)))          # the CRS or the AM, for anyone
    auth.check(irm_pb2.GetReservationRequest(reservation_id="r"), _Context())    # no tenant named: nothing to check
    with pytest.raises(Unauthenticated, match="carries no tenant token.*HARNESS_TENANT_TOKEN"):
        auth.check(request, _Context())
    with pytest.raises(Unauthenticated, match="carries no tenant token"):
        auth.check(request, _Context(("authorization", f"Basic {alice}")))
    with pytest.raises(Unauthenticated, match="no tenant's of this deployment"):
        auth.check(request, _Context(_bearer(alice + "x")))
    with pytest.raises(Unauthenticated, match="a delegation token this service does not accept.*make them agree"):
        auth.check(request, _Context(("x-harness-delegation", tenants.digest(DELEGATION))))   # the digest is no key
    with pytest.raises(Unauthenticated):
        auth.check(request, _Context(("x-harness-control-token", DELEGATION)))
    with pytest.raises(PermissionDenied, match="the one of tenant 'bob': it cannot act for tenant 'alice'"):
        auth.check(request, _Context(_bearer(bob)))


def test_a_peers_refusal_of_our_credentials_is_unavailable_for_the_operator_not_aborted() -> None:
    # A CRS below with another delegation digest: the top answered ABORTED ("retry"), which cannot help.
    import grpc

    from services.errors import Unavailable, from_rpc_error
    from tests.conftest import PeerError

    refused = PeerError(grpc.StatusCode.UNAUTHENTICATED,
                        "tenant 'alice': the call carries a delegation token this service does not accept")
    e = from_rpc_error("manager 'crs-site-c'", refused, "nothing was reserved")
    assert isinstance(e, Unavailable) and "operator must give them the same control and delegation tokens" in str(e)
    # At the CRS: a definite refusal (nothing to compensate for a day), and no "retry later" reason.
    from cross_resource_scheduler.refusals import definite, err_from_rpc

    assert definite(refused)
    crs_said = err_from_rpc("crs-site-c", refused)
    assert crs_said.reason == "CREDENTIALS_REFUSED" and crs_said.retry_after_s is None   # said so, no retry


def test_a_batch_is_checked_for_every_tenant_it_names(two) -> None:
    path, alice, _ = two
    auth = tenants.auth(path, "crs", delegation_token=DELEGATION)
    assert auth is not None
    batch = irm_pb2.ReserveBatchRequest(requests=[irm_pb2.ReserveRequest(tenant="alice", request_id="1"),
                                                  irm_pb2.ReserveRequest(tenant="bob", request_id="2")])
    with pytest.raises(PermissionDenied, match="cannot act for tenant 'bob'"):
        auth.check(batch, _Context(_bearer(alice)))
    del batch.requests[1]
    auth.check(batch, _Context(_bearer(alice)))


def test_the_file_is_read_again_when_it_changes_and_a_broken_one_refuses_every_tenant(two) -> None:
    path, alice, bob = two
    clock = _Clock()
    file = tenants.TenantFile(path, clock)
    assert file.who(alice) == "alice"
    tenants.remove(path, "alice")
    carol = tenants.add(path, "carol")
    assert file.who(alice) == "alice"                 # not looked at again within RELOAD_CHECK_S
    clock.t += tenants.RELOAD_CHECK_S
    assert file.who(alice) is None
    assert file.who(carol) == "carol"
    assert not file.broken
    with open(path, "a") as f:
        f.write("  dave: not-a-digest\n")
    clock.t += tenants.RELOAD_CHECK_S
    # Fail closed: a revocation written with a typo must not leave the revoked tenant in.
    assert file.who(carol) is None and file.who(bob) is None
    assert "dave" in file.broken
    tenants.write(path, {"carol": tenants.digest(carol)})            # fixed
    clock.t += tenants.RELOAD_CHECK_S
    assert file.who(carol) == "carol" and not file.broken
    os.remove(path)
    clock.t += tenants.RELOAD_CHECK_S
    assert file.who(carol) is None and "cannot read tenants file" in file.broken


def test_a_service_whose_file_broke_answers_unavailable_and_logs_a_refusal_once(two, caplog) -> None:
    path, alice, _ = two
    auth = tenants.auth(path, "crs", delegation_token=DELEGATION)
    assert auth is not None
    request = irm_pb2.GetReservationRequest(tenant="alice", reservation_id="r")
    auth.tenants._checked -= tenants.RELOAD_CHECK_S
    with open(path, "w") as f:
        f.write("tenants: [")
    with pytest.raises(Unavailable, match="cannot use its tenants file now"):
        auth.check(request, _Context(_bearer(alice)))
    auth.check(request, _Context(("x-harness-delegation", DELEGATION)))       # the CRS's own calls go on
    for _ in range(3):
        with pytest.raises(Unauthenticated):
            auth.check(request, _Context())
    refusals = [r for r in caplog.records if "refused a call for tenant 'alice'" in r.getMessage()]
    assert [r.getMessage().split(": ")[1].split(" (")[0] for r in refusals] == ["Unavailable", "Unauthenticated"]


def test_edits_keep_the_files_mode_and_never_lose_one_another(tmp_path) -> None:
    import threading

    path = str(tmp_path / "tenants.yaml")
    tenants.add(path, "first")
    os.chmod(path, 0o640)                 # the operator made it readable to the services' group
    tenants.add(path, "second")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    names = [f"t{i}" for i in range(16)]
    threads = [threading.Thread(target=tenants.add, args=(path, n)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(tenants.read(path)) == {"first", "second", *names}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tenants")] == []   # no temporary left


class _Reservations(irm_pb2_grpc.ResourceManagerServicer):
    def GetReservation(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return irm_pb2.Reservation(id=request.reservation_id, tenant=request.tenant)


def test_a_server_with_tenants_answers_with_statuses_and_the_client_channel_sends_the_token(two, monkeypatch) -> None:
    path, alice, bob = two
    comp = server.Component(
        name="t", register=lambda s: irm_pb2_grpc.add_ResourceManagerServicer_to_server(_Reservations(), s),
        service_names=["harness.v1.ResourceManager"], auth=tenants.auth(path, "crs", delegation_token=DELEGATION))
    running = server.start("127.0.0.1:0", [comp])
    try:
        address = f"127.0.0.1:{running.port}"
        request = irm_pb2.GetReservationRequest(tenant="alice", reservation_id="r1")

        def call(channel: grpc.Channel) -> irm_pb2.Reservation:
            return irm_pb2_grpc.ResourceManagerStub(channel).GetReservation(request, timeout=10)

        assert call(tenants.tenant_channel(address, alice)).tenant == "alice"
        monkeypatch.setenv(tenants.ENV_TOKEN, f" {alice}\n")          # as a shell's $(cat file) may leave it
        assert call(tenants.tenant_channel(address)).id == "r1"
        monkeypatch.delenv(tenants.ENV_TOKEN)
        with pytest.raises(grpc.RpcError) as e:
            call(tenants.tenant_channel(address))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "HARNESS_TENANT_TOKEN" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            call(tenants.tenant_channel(address, bob))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert call(tenants.delegating(plain_channel(address), DELEGATION)).tenant == "alice"
        with pytest.raises(grpc.RpcError) as e:                   # the control token acts for no tenant
            call(control.channel(plain_channel(address), DELEGATION))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        running.stop(0)


def test_the_suite_gives_every_tenant_facing_service_the_tenants_file_and_its_part_of_the_delegation_secret(
        tmp_path, monkeypatch) -> None:
    from services import suite
    from tests.unit.test_operator_config import _FakeProc

    spawned: list[_FakeProc] = []

    def fake(service: str, *, name: str | None = None, address: str = "", **kwargs):  # type: ignore[no-untyped-def]
        spawned.append(_FakeProc(service, name, address, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(suite, "spawn", fake)
    monkeypatch.chdir(tmp_path)
    tenants.add(str(tmp_path / "tenants.yaml"), "alice")
    config = tmp_path / "harness.yaml"
    config.write_text(f"crs:\n  tenants_file: {tmp_path}/crs-tenants.yaml\n")
    procs = suite.start(str(tmp_path / "state"), auto_ports=True, config_file=str(config),
                        environ={suite.TENANTS_FILE_ENV: "tenants.yaml"})
    suite.stop(procs)
    env = {p.service: p.kwargs["env"] for p in spawned}
    delegation = env["am"]["HARNESS_AM_DELEGATION_TOKEN"]
    assert len(delegation) >= 40 and env["crs"]["HARNESS_CRS_DELEGATION_TOKEN"] == delegation
    for service in ("compute", "agent", "fpga", "am"):
        section = suite.SERVICES[service].section.upper()
        assert env[service][f"HARNESS_{section}_TENANTS_FILE"] == str(tmp_path / "tenants.yaml"), service
    for service in ("crs", "compute", "agent", "fpga"):
        section = suite.SERVICES[service].section.upper()
        assert env[service][f"HARNESS_{section}_DELEGATION_SHA256"] == tenants.digest(delegation), service
    # The services checking the delegation token hold only its digest (the agent runs tenants' programs).
    assert not [k for p in ("compute", "agent", "fpga") for k in env[p] if k.endswith("_DELEGATION_TOKEN")]
    assert "HARNESS_CRS_TENANTS_FILE" not in env["crs"]          # the config file's choice stands
    assert not any("TENANTS" in k or "DELEGATION" in k for k in env["fpga-server"])

    (tmp_path / "tenants.yaml").write_text("tenants: [alice]\n")
    spawned.clear()
    with pytest.raises(ConfigError, match="tenants must map"):
        suite.start(str(tmp_path / "state2"), auto_ports=True, environ={suite.TENANTS_FILE_ENV: "tenants.yaml"})
    assert not spawned


def test_each_request_of_a_client_stream_is_checked(two) -> None:
    path, alice, _ = two

    def collect(requests, context):  # type: ignore[no-untyped-def]
        return irm_pb2.Reservation(id=",".join(r.reservation_id for r in requests))

    handler = grpc.method_handlers_generic_handler("test.Stream", {"Collect": grpc.stream_unary_rpc_method_handler(
        collect, request_deserializer=irm_pb2.GetReservationRequest.FromString,
        response_serializer=irm_pb2.Reservation.SerializeToString)})
    comp = server.Component(name="t", register=lambda s: s.add_generic_rpc_handlers((handler,)),
                            service_names=["test.Stream"], auth=tenants.auth(path, "crs", delegation_token=DELEGATION))
    running = server.start("127.0.0.1:0", [comp])
    try:
        call = tenants.tenant_channel(f"127.0.0.1:{running.port}", alice).stream_unary(
            "/test.Stream/Collect", request_serializer=irm_pb2.GetReservationRequest.SerializeToString,
            response_deserializer=irm_pb2.Reservation.FromString)

        def stream(*tenants_named: str):  # type: ignore[no-untyped-def]
            return iter([irm_pb2.GetReservationRequest(tenant=t, reservation_id=f"r{i}")
                         for i, t in enumerate(tenants_named)])

        assert call(stream("alice", "alice"), timeout=10).id == "r0,r1"
        with pytest.raises(grpc.RpcError) as e:
            call(stream("alice", "bob"), timeout=10)          # the second names another tenant
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        running.stop(0)
