"""The `harness` command."""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import sys
import tempfile
from pathlib import Path

from services import config as cfg
from services import tls


def _serve(args: argparse.Namespace) -> int:
    from services import logs, server
    from services.catalog import SERVICES, config_sections

    entry = SERVICES[args.service]
    config_class, factory = entry.load()
    try:
        overrides = cfg.parse_sets(args.set or [])
        if args.address:
            overrides["address"] = args.address
        if args.config and not args.shared_config:
            _own_section(args.config, entry.section, args.service, config_sections())
        conf = cfg.load(config_class, entry.section, config_file=args.config, overrides=overrides,
                        sections=config_sections())
        # Checked here, whichever source set them: gRPC and SQLAlchemy would take a bad one further (a port
        # nobody expects, a traceback).
        cfg.check_address(conf.address)
        _check_database(getattr(conf, "database", ""))
        credentials = tls.server_credentials(conf.tls_cert_file, conf.tls_key_file)
        tls.configure(conf.tls_ca_file)
    except cfg.ConfigError as e:
        print(f"harness serve {args.service}: {e}", file=sys.stderr)
        return 2
    logs.setup(args.service)
    if os.environ.get("HARNESS_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["HARNESS_SWITCH_INTERVAL"]))
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.exc import DatabaseError

    failed: dict[str, object] = {}        # the URL of the database whose connection or statement failed last

    def note(ctx) -> None:  # noqa: ANN001 - sqlalchemy's ExceptionContext
        if ctx.engine is not None:
            failed["url"] = ctx.engine.url

    event.listen(Engine, "handle_error", note)
    try:
        component = factory(conf)
        server.serve(conf.address, [component], port_file=args.port_file, credentials=credentials)
    except (ValueError, OSError) as e:
        print(f"harness serve {args.service}: cannot start: {e}", file=sys.stderr)
        return 2
    except DatabaseError as e:
        # Exit 3 (compose's `restart: on-failure` tries again) only for what may pass: the database not taking
        # connections (yet), a timeout, a lock. A database this configuration cannot use is status 2, as any
        # setting to fix: restarting would only fail the same way, for ever.
        setting = "database" if getattr(conf, "database", "") else "state_dir"
        status, message = database_problem(e, failed.get("url"), setting)
        if status is None:
            raise
        print(f"harness serve {args.service}: cannot start: {message}", file=sys.stderr)
        return status
    finally:
        event.remove(Engine, "handle_error", note)
    return 0


# SQLite result codes (the primary code, the low byte) of a database file this configuration cannot use.
_SQLITE_PERMANENT = {3: "SQLITE_PERM", 8: "SQLITE_READONLY", 11: "SQLITE_CORRUPT", 14: "SQLITE_CANTOPEN",
                     23: "SQLITE_AUTH", 26: "SQLITE_NOTADB"}
_SQLITE_PERMANENT_TEXT = ("unable to open database file", "readonly database", "file is not a database",
                          "database disk image is malformed")
# PostgreSQL: SQLSTATEs of a refusal that a retry cannot change: class 28 (invalid authorization: wrong password,
# no such role, no pg_hba.conf entry), 3D000 (no such database), 42501 (insufficient privilege). A refused
# connection carries none through libpq, only the server's message: those are told by their text.
_PG_PERMANENT_STATES = ("28", "3D000", "42501")
_PG_PERMANENT_TEXT = re.compile(
    r"authentication failed|database \"[^\"]*\" does not exist|role \"[^\"]*\" does not exist|"
    r"no pg_hba\.conf entry|is not permitted to log in|permission denied for database|no password supplied")


def database_problem(e: Exception, url: object, setting: str) -> tuple[int | None, str]:
    """(exit status, one line) for a database error at start-up: 2 if the database named by `url` (a URL or
    sqlalchemy URL; None: not known) cannot be used as configured (`setting` says what to fix), 3 if a later try
    may succeed; (None, "") for an error that is neither (a bug: its traceback is the report)."""
    from sqlalchemy.engine import URL, make_url
    from sqlalchemy.exc import ArgumentError, OperationalError

    orig = getattr(e, "orig", None) or e
    cause = " ".join(str(orig).split()) or type(orig).__name__        # libpq's messages span lines
    try:
        parsed = url if isinstance(url, URL) else make_url(str(url)) if url is not None else None
    except ArgumentError:
        parsed = None
    if parsed is not None and parsed.password:
        # The drivers' messages do not quote it; were a URL or connection string in one, its password goes. (Not
        # every occurrence of it: a password that is also the user's or the database's name would hide those.)
        password = str(parsed.password)
        cause = cause.replace(f":{password}@", ":***@").replace(f"password={password}", "password=***")
    sqlite = parsed is not None and parsed.get_backend_name() == "sqlite"
    if sqlite:
        path = parsed.database or ":memory:"
        code = getattr(orig, "sqlite_errorcode", None)
        permanent = (code & 0xFF) in _SQLITE_PERMANENT if isinstance(code, int) else \
            any(t in cause for t in _SQLITE_PERMANENT_TEXT)
        where = f"the SQLite database {path}"
        if permanent:
            why = _sqlite_cause(path)
            return 2, f"{where} cannot be used: {cause}{f' ({why})' if why else ''}; fix {setting}"
    else:
        where = (f"the database {parsed.render_as_string(hide_password=True)}" if parsed is not None
                 else "the service's database")
        state = getattr(orig, "sqlstate", None) or ""
        permanent = state.startswith(_PG_PERMANENT_STATES) or bool(_PG_PERMANENT_TEXT.search(cause))
        if permanent:
            return 2, f"{where} refused: {cause}; fix {setting}"
    if isinstance(e, OperationalError) and _passing(orig, sqlite):
        return 3, f"the database did not answer: {cause} ({where}); a later start may succeed"
    return None, ""     # e.g. "no such table", "duplicate column": a bug or a broken schema, not the database away


def _passing(orig: object, sqlite: bool) -> bool:
    """Whether a database error may pass by itself: SQLite busy or locked (another process holds it), PostgreSQL
    not answering (no SQLSTATE: refused, timed out), its connection failing (08xxx), shutting down or starting
    (57P0x), or out of connections (53300)."""
    if sqlite:
        code = getattr(orig, "sqlite_errorcode", None)
        if isinstance(code, int):
            return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
        return "database is locked" in str(orig)
    state = getattr(orig, "sqlstate", None) or ""
    return not state or state.startswith(("08", "57P")) or state == "53300"


def _sqlite_cause(path: str) -> str:
    """Why the SQLite file `path` cannot be opened or written, as far as the file system says; "" if it does not."""
    if path == ":memory:" or path.startswith("file:"):
        return ""
    file = Path(path)
    if file.is_dir():
        return f"{file} is a directory"
    directory = file.parent
    if not directory.is_dir():
        return f"directory {directory} does not exist"
    try:
        tempfile.TemporaryFile(dir=directory).close()   # SQLite makes its -wal and -shm files there
    except OSError as err:
        return f"cannot create files in {directory}: {err.strerror or err}"
    if file.exists():
        try:
            with open(file, "r+b"):
                pass
        except OSError as err:
            return f"cannot write {file}: {err.strerror or err}"
    return ""


def _own_section(config_file: str, section: str, service: str, sections: dict[str, str]) -> None:
    """ConfigError if `config_file` (given to `harness serve` for this service alone) has sections but none of
    `service`'s: another service's file, and the service would run on the defaults (no database, control token or
    CRS of the operator's) without a word. A suite's shared file (`harness up`) may leave a service out."""
    data = cfg.read_yaml(config_file, "config file")
    if not isinstance(data, dict) or not data or any(k not in sections for k in data):
        return          # (not a mapping, or a section misnamed: cfg.load says so, more precisely)
    if not any(sections.get(k) == section for k in data):
        raise cfg.ConfigError(f"{config_file} has no {service!r} section (it has: {', '.join(map(str, data))}): "
                              f"give {service} its own section there, or leave --config out to run on the defaults")


def _check_database(url: str) -> None:
    """ConfigError unless `url` (empty: the service's SQLite default) names a database SQLAlchemy can use."""
    if not url:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError  # NoSuchModuleError (an unknown dialect) is one too

    try:
        make_url(url).get_dialect().import_dbapi()
    except ArgumentError as e:
        problem = str(e)
    except ImportError as e:
        problem = f"its driver is not installed: {e}"
    else:
        return
    raise cfg.ConfigError(f"invalid database URL {_hide_password(url)!r} ({problem}): expected e.g. "
                          "sqlite:///path or postgresql+psycopg://user:pw@host/db")


def _hide_password(url: str) -> str:
    """`url` with the password of its user:password@ (if any) as ***: messages end up in logs."""
    return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)


def build_parser() -> argparse.ArgumentParser:
    from services.catalog import SERVICES

    p = argparse.ArgumentParser(prog="harness", description="Harness heterogeneous-cloud control plane")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run one service in the foreground")
    s.add_argument("service", choices=sorted(SERVICES))
    s.add_argument("--config", help="YAML file with one section per service")
    s.add_argument("--address", help="host:port to bind (port 0: any free port)")
    s.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override one setting")
    s.add_argument("--port-file", help="write the bound port here once serving")
    # A suite's file, shared by its services (`harness up`): one of them may have no section.
    s.add_argument("--shared-config", action="store_true", help=argparse.SUPPRESS)
    s.set_defaults(func=_serve)

    g = sub.add_parser("gen-protos", help="regenerate gen/ from protos/ (--check: fail if they drifted)")
    g.add_argument("--check", action="store_true")
    g.set_defaults(func=lambda a: __import__("services.protogen").protogen.main(["--check"] if a.check else []))

    from services import commands

    commands.add_commands(sub)
    return p


def _not_utf8(argv: list[str]) -> str | None:
    """What of the command line and the HARNESS_* environment is not UTF-8 (Python keeps such bytes as lone
    surrogates), for a one-line refusal: the API's strings are UTF-8, and such a value failed deep in protobuf
    with a traceback."""
    for i, arg in enumerate(argv, 1):
        try:
            arg.encode()
        except UnicodeEncodeError:
            return f"argument {i} ({os.fsencode(arg)!r}) is not valid UTF-8"
    for name, value in os.environ.items():
        if name.startswith("HARNESS_"):
            try:
                value.encode()
            except UnicodeEncodeError:
                return f"${name} is not valid UTF-8"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if (bad := _not_utf8(argv)) is not None:
        print(f"harness: {bad}: Harness's API takes UTF-8 text only (a file name of other bytes cannot be passed "
              "to a program either; rename it)", file=sys.stderr)
        return 2
    # `harness run ... -- cmd args`: what follows the first `--` is the tenant's command, untouched (its own
    # `--` and options included), and the options before it may come in any order.
    command = None
    if argv[:1] == ["run"] and "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    if command is not None:
        args.argv = command
    # Not for those that connect to nothing (a CA file still to be made is no error there) or configure TLS for
    # the services they run.
    if args.command not in ("serve", "up", "demo", "down", "tenant", "tls", "gen-protos"):
        try:
            _trust(args)
        except cfg.ConfigError as e:
            print(f"harness: {e}", file=sys.stderr)
            return 2
    return int(args.func(args) or 0)


def _trust(args: argparse.Namespace) -> None:
    """The CA a client verb trusts: $HARNESS_TLS_CA_FILE's, else, talking to the suite running from its state
    directory with `harness up --tls`, that suite's (not with --default-ports: compose's ports are another's)."""
    if os.environ.get(tls.ENV_CA):
        tls.roots()                                         # a bad file: one line, not a traceback later
        return
    if not hasattr(args, "state_dir") or getattr(args, "default_ports", False):
        return
    from services import suite

    ca = suite.tls_ca(args.state_dir)
    if ca:
        tls.configure(ca, "the suite's CA")


if __name__ == "__main__":
    raise SystemExit(main())
