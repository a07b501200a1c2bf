"""TLS (services.tls): certificates of a private CA, servers that speak only TLS, clients that verify it."""

from __future__ import annotations

import os
import stat

import grpc
import pytest

from harness.v1 import diagnostics_pb2, diagnostics_pb2_grpc
from services import server, suite, tls
from services.config import ConfigError


@pytest.fixture
def trust(monkeypatch):  # type: ignore[no-untyped-def]
    """Set this process's trusted CA for one test (the module keeps it process-wide)."""
    monkeypatch.setattr(tls, "_roots", None)
    monkeypatch.setattr(tls, "_configured", False)
    return tls.configure


def _echo(credentials):  # type: ignore[no-untyped-def]
    return server.start("127.0.0.1:0", [], credentials=credentials)


def _ask(port: int) -> str:
    stub = diagnostics_pb2_grpc.DiagnosticsStub(tls.open_channel(f"127.0.0.1:{port}"))
    return stub.Echo(diagnostics_pb2.EchoRequest(payload=b"hi"), timeout=5).payload.decode()


def test_a_new_channel_reaches_a_server_back_on_the_port_of_one_that_went_away() -> None:
    # gRPC's shared subchannels would hand the new channel the dead server's connection back-off: a client that
    # reconnects to a restarted server (or a test to a new one on a reused port) was refused for seconds.
    first = _echo(None)
    port = first.port
    assert _ask(port) == "hi"
    first.stop(0)
    with pytest.raises(grpc.RpcError) as gone:
        _ask(port)
    assert gone.value.code() == grpc.StatusCode.UNAVAILABLE
    second = server.start(f"127.0.0.1:{port}", [])
    try:
        assert _ask(port) == "hi"
    finally:
        second.stop(0)


def test_generate_keeps_the_ca_and_names_every_host(tmp_path) -> None:
    from cryptography import x509

    files = tls.generate(str(tmp_path), ["crs", "10.0.0.5", "[fd00::1]"], out=str(tmp_path / "services"))
    ca = open(tmp_path / "ca.pem", "rb").read()
    assert open(files["ca"], "rb").read() == ca                   # a copy beside the certificate, to mount
    assert not (tmp_path / "services" / "ca.key").exists()        # the CA's key stays where it was made
    assert stat.S_IMODE(os.stat(files["key"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(open(files["cert"], "rb").read())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5", "fd00::1", "127.0.0.1", "::1"]
    assert names.get_values_for_type(x509.DNSName) == ["crs", "localhost"]
    agent = tls.generate(str(tmp_path), ["agent"], out=str(tmp_path / "agent"))
    assert open(agent["ca"], "rb").read() == ca                   # clients that trust it go on trusting it
    agent_names = x509.load_pem_x509_certificate(open(agent["cert"], "rb").read()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert agent_names == ["agent", "localhost"]                  # its own: not the other services' names
    with pytest.raises(ConfigError, match="'crs:50051': expected a host name or an IP address, without a port"):
        tls.generate(str(tmp_path), ["crs:50051"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ca.pem").write_text("junk")
    (tmp_path / "bad" / "ca.key").write_text("junk")
    with pytest.raises(ConfigError, match="bad/ca.pem: not a PEM certificate"):
        tls.generate(str(tmp_path / "bad"), ["crs"])
    os.rename(tmp_path / "ca.key", tmp_path / "kept-apart.key")
    with pytest.raises(ConfigError, match="ca.key is missing while .*ca.pem is there"):
        tls.generate(str(tmp_path), ["crs"])                     # never a new CA in place of the one trusted
    assert open(tmp_path / "ca.pem", "rb").read() == ca


def test_a_tls_server_answers_clients_that_trust_its_ca_only(tmp_path, trust) -> None:
    files = tls.generate(str(tmp_path / "a"), ["127.0.0.1"])
    other = tls.generate(str(tmp_path / "b"), ["127.0.0.1"])
    running = _echo(tls.server_credentials(files["cert"], files["key"]))
    try:
        trust(files["ca"])
        assert _ask(running.port) == "hi"
        trust(other["ca"])                                    # another CA's: the certificate is not trusted
        with pytest.raises(grpc.RpcError) as e:
            _ask(running.port)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        trust("")                                             # plaintext to a TLS-only server
        with pytest.raises(grpc.RpcError) as e:
            _ask(running.port)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop(0)


def test_the_clients_ca_comes_from_the_environment_unless_configured(tmp_path, trust, monkeypatch) -> None:
    files = tls.generate(str(tmp_path), ["127.0.0.1"])
    monkeypatch.setenv(tls.ENV_CA, files["ca"])
    assert tls.roots() == open(files["ca"], "rb").read()
    trust("")                                   # a service's setting decides, whatever the environment says
    assert tls.roots() is None


@pytest.mark.parametrize(("cert", "key", "says"), [
    ("server.pem", "", "tls_cert_file and tls_key_file go together"),
    ("missing.pem", "server.key", "tls_cert_file .*missing.pem: cannot read the certificate"),
    ("server.pem", "junk", "tls_key_file .*junk: not a PEM private key"),
    ("server.pem", "other/server.key", "tls_key_file .*other/server.key is not the key of tls_cert_file"),
])
def test_bad_tls_settings_say_what_to_fix(tmp_path, cert: str, key: str, says: str) -> None:
    tls.generate(str(tmp_path), ["127.0.0.1"])
    tls.generate(str(tmp_path), ["127.0.0.1"], out=str(tmp_path / "other"))
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(ConfigError, match=says):
        tls.server_credentials(str(tmp_path / cert) if cert else "", str(tmp_path / key) if key else "")
    assert tls.server_credentials("", "") is None
    with pytest.raises(ConfigError, match="tls_ca_file .*junk: not a PEM CA certificate"):
        tls.configure(str(tmp_path / "junk"))


def test_the_suite_marks_its_tls_for_the_cli_and_unmarks_it_without(tmp_path, monkeypatch) -> None:
    from tests.unit.test_operator_config import _FakeProc

    spawned: list[_FakeProc] = []

    def fake(service: str, *, name: str | None = None, address: str = "", **kwargs):  # type: ignore[no-untyped-def]
        spawned.append(_FakeProc(service, name, address, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(suite, "spawn", fake)
    state = str(tmp_path / "state")
    running = suite.start(state, auto_ports=True, environ={}, tls=True)
    ca = suite.tls_ca(state)                       # while it runs (holding the state directory's lock)
    suite.stop(running)
    assert ca == str(tmp_path / "state" / "tls" / "ca.pem")
    for p in spawned:                              # every service serves with the suite's certificate and trusts it
        section = suite.SERVICES[p.service].section.upper()
        assert p.kwargs["env"][f"HARNESS_{section}_TLS_CA_FILE"] == ca, p.service
        assert p.kwargs["env"][f"HARNESS_{section}_TLS_CERT_FILE"].endswith("server.pem")
    spawned.clear()
    running = suite.start(state, auto_ports=True, environ={})
    assert suite.tls_ca(state) is None             # a later plaintext start: the CLI must not speak TLS to it
    suite.stop(running)
    assert not any("TLS" in k for p in spawned for k in p.kwargs["env"])


def test_status_tells_a_tls_refusal_from_a_service_that_is_not_there(tmp_path, trust) -> None:
    # Review 25: a running service refused by the client's TLS (another CA, no CA) was "does not answer: start it".
    from services import commands

    files = tls.generate(str(tmp_path / "a"), ["127.0.0.1"])
    other = tls.generate(str(tmp_path / "b"), ["127.0.0.1"])
    running = _echo(tls.server_credentials(files["cert"], files["key"]))
    where = {"crs": f"127.0.0.1:{running.port}"}
    try:
        trust(other["ca"])
        [entry] = commands.health_of(where)
        assert entry["status"] == "UNREACHABLE" and entry["connection"].startswith("the TLS handshake failed (")
        assert "certificate" in entry["connection"] and "HARNESS_TLS_CA_FILE" in entry["connection"]
        assert commands._service_problem(entry, None).startswith(
            f"crs at {where['crs']} cannot be reached over this connection: the TLS handshake failed (")
        trust("")
        [entry] = commands.health_of(where)
        assert entry["connection"] == ("it closed the connection this client opened without TLS: if it serves TLS, "
                                       "give this client its CA (HARNESS_TLS_CA_FILE=.../ca.pem)")
        trust(files["ca"])
        assert commands.health_of(where)[0]["status"] == "SERVING"
    finally:
        running.stop(0)
    [entry] = commands.health_of(where)                # nothing there now: start it
    assert "connection" not in entry and "start it" in commands._service_problem(entry, None)


def test_a_cli_command_refused_by_tls_says_so_not_whether_a_suite_runs(tmp_path, trust, capsys) -> None:
    from services import commands

    files = tls.generate(str(tmp_path / "a"), ["127.0.0.1"])
    running = _echo(tls.server_credentials(files["cert"], files["key"]))
    try:
        trust(str(tls.generate(str(tmp_path / "b"), ["127.0.0.1"])["ca"]))
        with pytest.raises(grpc.RpcError) as e:
            _ask(running.port)
        assert commands._fail(e.value) == 1
        err = capsys.readouterr().err
        assert "a service answers there, but not to this client: the TLS handshake failed (" in err
        assert "is a suite running there" not in err
    finally:
        running.stop(0)


def test_an_expired_certificate_or_a_key_given_as_the_ca_stops_start_up_saying_so(tmp_path, trust, caplog) -> None:
    # Review 25: a service served an expired certificate (every client's handshake failed, nothing logged), and a
    # private key given as tls_ca_file passed (gRPC then trusted nothing: "Could not load any root certificate").
    import datetime

    files = tls.generate(str(tmp_path), ["127.0.0.1"], days=30)
    cert, key = open(files["cert"], "rb").read(), open(files["key"], "rb").read()
    now = datetime.datetime.now(datetime.UTC)
    tls._check_pair(cert, key, files["cert"], files["key"], now=now)                 # valid: nothing said
    assert "expires on" not in caplog.text
    with pytest.raises(ConfigError, match=r"tls_cert_file .*server.pem: the certificate expired on \d{4}-\d\d-\d\d "
                                          r"\d\d:\d\d UTC: renew it \(`harness tls generate --dir DIR` keeps the CA"):
        tls._check_pair(cert, key, files["cert"], files["key"], now=now + datetime.timedelta(days=31))
    tls._check_pair(cert, key, files["cert"], files["key"], now=now + datetime.timedelta(days=20))
    assert "the certificate expires on" in caplog.text and "renew it before then" in caplog.text
    tls._check_pair(cert, key, files["cert"], files["key"], now=now - datetime.timedelta(days=1))
    assert "the certificate is valid only from" in caplog.text
    with pytest.raises(ConfigError, match=r"tls_ca_file .*server.key: not a PEM CA certificate \(a private key"):
        trust(files["key"])
    trust(files["ca"])                                     # the CA itself: taken
    assert tls.roots() == open(files["ca"], "rb").read()
