"""The `harness` command."""

from __future__ import annotations

import argparse
import os
import re
import sys

from services import config as cfg


def _serve(args: argparse.Namespace) -> int:
    from services import logs, server
    from services.catalog import SERVICES, config_sections

    entry = SERVICES[args.service]
    config_class, factory = entry.load()
    try:
        overrides = cfg.parse_sets(args.set or [])
        if args.address:
            overrides["address"] = args.address
        conf = cfg.load(config_class, entry.section, config_file=args.config, overrides=overrides,
                        sections=config_sections())
        # Checked here, whichever source set them: gRPC and SQLAlchemy would take a bad one further (a port
        # nobody expects, a traceback).
        cfg.check_address(conf.address)
        _check_database(getattr(conf, "database", ""))
    except cfg.ConfigError as e:
        print(f"harness serve {args.service}: {e}", file=sys.stderr)
        return 2
    logs.setup(args.service)
    if os.environ.get("HARNESS_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["HARNESS_SWITCH_INTERVAL"]))
    from sqlalchemy.exc import OperationalError

    try:
        component = factory(conf)
        server.serve(conf.address, [component], port_file=args.port_file)
    except (ValueError, OSError) as e:
        print(f"harness serve {args.service}: cannot start: {e}", file=sys.stderr)
        return 2
    except OperationalError as e:             # e.g. the database not taking connections (yet)
        print(f"harness serve {args.service}: cannot start: the database did not answer: {e.orig}", file=sys.stderr)
        return 3
    return 0


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
    s.set_defaults(func=_serve)

    g = sub.add_parser("gen-protos", help="regenerate gen/ from protos/ (--check: fail if they drifted)")
    g.add_argument("--check", action="store_true")
    g.set_defaults(func=lambda a: __import__("services.protogen").protogen.main(["--check"] if a.check else []))

    from services import commands

    commands.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `harness run ... -- cmd args`: what follows the first `--` is the tenant's command, untouched (its own
    # `--` and options included), and the options before it may come in any order.
    command = None
    if argv[:1] == ["run"] and "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    if command is not None:
        args.argv = command
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
