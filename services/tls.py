"""TLS for every connection of the suite: services serve it, and every client of ours speaks it.

A service given `tls_cert_file` and `tls_key_file` (PEM; the certificate may carry its chain) serves TLS only. The
channels a process opens (services.client, the CLI, the client libraries) use TLS when it trusts a CA: a service's
`tls_ca_file`, or, for the CLI and a tenant's program, $HARNESS_TLS_CA_FILE; without one they stay plaintext (a
development setup). Tokens (tenants', the delegation and control tokens) are bearer secrets: without TLS anyone
on the network path reads them.

`generate(directory, hosts)` makes a private CA and one certificate for every host name and IP address the
services answer at (`harness tls generate`; `harness up --tls` for its services' addresses and the loopback
names, one certificate shared by all of them, the agent too: one machine and one user anyway).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.config import ConfigError
from services.files import write_atomic

log = logging.getLogger(__name__)
EXPIRY_WARNING = datetime.timedelta(days=14)    # a service starting with a certificate closer to its end says so

ENV_CA = "HARNESS_TLS_CA_FILE"
CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "server.pem", "server.key"

@dataclass(kw_only=True)
class TlsSettings:
    """The TLS settings every service's configuration has (inherited; keyword-only, so a service's own fields keep
    their positions): served when `tls_cert_file` and `tls_key_file` are set (PEM files); `tls_ca_file` is the CA
    the service trusts for its own calls to the others (empty: plaintext calls)."""

    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""


_lock = threading.Lock()
_roots: bytes | None = None          # this process's trusted CA (PEM), once configured or read from ENV_CA
_configured = False


def _read(path: str, what: str, setting: str) -> bytes:
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ConfigError(f"{setting} {path}: cannot read the {what}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{setting} {path}: not a PEM {what} (no -----BEGIN line)")
    return data


def _read_ca(path: str, setting: str) -> bytes:
    """The PEM certificates of `path`, ConfigError if it holds none (a private key given by mistake passed the
    -----BEGIN check, and gRPC then trusted nothing: every connection failed "Could not load any root
    certificate")."""
    from cryptography import x509

    data = _read(path, "CA certificate", setting)
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigError(f"{setting} {path}: not a PEM CA certificate (a private key, or a damaged file?): give the "
                          "CA's certificate, ca.pem of `harness tls generate`") from None
    return data


def configure(ca_file: str, setting: str = "tls_ca_file") -> None:
    """This process's channels trust `ca_file`; "": plaintext (a service's setting decides, whatever
    $HARNESS_TLS_CA_FILE says, which is the CLI's and client libraries'). ConfigError for a file that is no PEM
    certificate."""
    global _roots, _configured
    roots = _read_ca(ca_file, setting) if ca_file else None
    with _lock:
        _roots, _configured = roots, True


def reset() -> None:
    """Forget the configured CA: the next channel looks at $HARNESS_TLS_CA_FILE again (for code that configured
    it for a while in a process that goes on, as `harness demo` called in-process)."""
    global _roots, _configured
    with _lock:
        _roots, _configured = None, False


def roots() -> bytes | None:
    """The CA this process's channels trust, or None (plaintext)."""
    global _roots, _configured
    with _lock:
        if not _configured:
            path = os.environ.get(ENV_CA, "")
            _roots = _read_ca(path, ENV_CA) if path else None
            _configured = True
        return _roots


# gRPC shares subchannels between a process's channels to one address by default: a channel opened to a server
# that came back on the port of one that went away then inherits the dead one's connection back-off and fails at
# once ("Connection refused") for up to a few seconds. Each channel of ours keeps its own.
_OWN_SUBCHANNELS = ("grpc.use_local_subchannel_pool", 1)


def open_channel(address: str, options: Sequence[tuple[str, object]] | None = None) -> grpc.Channel:
    """A new channel to `address`: TLS verified against this process's CA when it has one, else plaintext; its
    connections its own (not shared with the process's other channels to `address`)."""
    options = [*(options or ()), _OWN_SUBCHANNELS]
    trusted = roots()
    if trusted is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=trusted), options=options)


def plain_channel(address: str) -> grpc.Channel:
    """A plaintext channel to `address`, its connections its own, whatever this process trusts: for benchmarks
    and tests of plaintext servers they start themselves."""
    return grpc.insecure_channel(address, options=[_OWN_SUBCHANNELS])


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials | None:
    """The credentials a service serves with (None: plaintext); ConfigError unless both files are given and PEM."""
    if not cert_file and not key_file:
        return None
    if not (cert_file and key_file):
        raise ConfigError("tls_cert_file and tls_key_file go together: give both (TLS) or neither (plaintext)")
    cert = _read(cert_file, "certificate", "tls_cert_file")
    key = _read(key_file, "private key", "tls_key_file")
    _check_pair(cert, key, cert_file, key_file)
    return grpc.ssl_server_credentials([(key, cert)])


def _check_pair(cert: bytes, key: bytes, cert_file: str, key_file: str,
                now: datetime.datetime | None = None) -> None:
    """ConfigError unless `key` is the private key of `cert`'s (first) certificate (gRPC would fail to listen,
    saying nothing of which file) and the certificate has not expired `now` (a warning when it is not valid yet,
    or expires within EXPIRY_WARNING)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate(cert)
    except ValueError:
        raise ConfigError(f"tls_cert_file {cert_file}: not a PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"tls_key_file {key_file}: not an unencrypted PEM private key ({e})") from None
    public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*public) != certificate.public_key().public_bytes(*public):
        raise ConfigError(f"tls_key_file {key_file} is not the key of tls_cert_file {cert_file}")
    # Served anyway, an expired certificate fails every client's handshake while the service looks healthy.
    now = now or datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc <= now:
        raise ConfigError(f"tls_cert_file {cert_file}: the certificate expired on "
                          f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: renew it (`harness tls generate "
                          "--dir DIR` keeps the CA already in DIR)")
    if certificate.not_valid_before_utc > now:
        log.warning(f"tls_cert_file {cert_file}: the certificate is valid only from "
                    f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: clients refuse it until then (is this "
                    "machine's clock right?)")
    elif certificate.not_valid_after_utc - now < EXPIRY_WARNING:
        log.warning(f"tls_cert_file {cert_file}: the certificate expires on "
                    f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: renew it before then (`harness tls "
                    "generate --dir DIR` keeps the CA already in DIR), then restart the service")


def _host(host: str) -> str:
    """A certificate's name for `host`: a DNS name or an IP address (IPv6 bare or in brackets), without a port."""
    import re

    bare = host.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    if not re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9*]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*",
                        bare):
        raise ConfigError(f"host {host!r}: expected a host name or an IP address, without a port (e.g. crs, "
                          "10.0.0.5, ::1)")
    return bare


def generate(directory: str, hosts: Sequence[str], days: int = 825, *, out: str | None = None) -> dict[str, str]:
    """A private CA in `directory` (ca.pem; ca.key 0600, which signs: keep it where no service runs) and a
    certificate it signs for every name in `hosts` (DNS names or IP addresses; 127.0.0.1, ::1 and localhost
    always, for clients on the same machine) in `out` (default `directory`), with a copy of ca.pem there: `out` is
    what a service mounts. A CA already there is kept (clients that trust it go on trusting it) once checked; the
    certificate is made again. Returns {"ca", "cert", "key"} paths (ca: the copy in `out`)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    names_given = [_host(h) for h in hosts]
    home = Path(directory).expanduser()
    target = Path(out).expanduser() if out else home
    home.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_path, ca_key_path = home / CA_FILE, home / "ca.key"

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    if ca_path.exists() != ca_key_path.exists():
        missing = ca_key_path if ca_path.exists() else ca_path
        raise ConfigError(f"{missing} is missing while {ca_path if missing == ca_key_path else ca_key_path} is there: "
                          "put it back to sign with that CA, or remove both for a new one (clients must then trust "
                          "the new ca.pem)")
    if ca_path.exists():
        try:
            ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
        except ValueError:
            raise ConfigError(f"{ca_path}: not a PEM certificate; remove ca.pem and ca.key for a new CA") from None
        try:
            ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{ca_key_path}: not an unencrypted PEM private key ({e})") from None
        public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if ca_key.public_key().public_bytes(*public) != ca_cert.public_key().public_bytes(*public):
            raise ConfigError(f"{ca_key_path} is not the key of {ca_path}")
        if ca_cert.not_valid_after_utc < now + datetime.timedelta(days=days):
            raise ConfigError(f"the CA {ca_path} expires {ca_cert.not_valid_after_utc:%Y-%m-%d}, before a "
                              f"certificate of {days} days would: remove ca.pem and ca.key for a new CA")
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Harness private CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False, encipher_only=False,
                                                decipher_only=False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        write_atomic(ca_key_path, pem_key(ca_key), 0o600)
        write_atomic(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*names_given, "127.0.0.1", "::1", "localhost"]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names_given[0] if names_given
                                                        else "localhost")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    write_atomic(target / KEY_FILE, pem_key(key), 0o600)
    write_atomic(target / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    if target != home:
        write_atomic(target / CA_FILE, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return {"ca": str(target / CA_FILE), "cert": str(target / CERT_FILE), "key": str(target / KEY_FILE)}
