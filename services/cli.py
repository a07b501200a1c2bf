"""The `harness` command."""

from __future__ import annotations

import argparse
import os
import sys

from services import config as cfg


def _serve(args: argparse.Namespace) -> int:
    from services import logs, server
    from services.catalog import SERVICES, config_sections

    entry = SERVICES[args.service]
    config_class, factory = entry.load()
    overrides = cfg.parse_sets(args.set or [])
    if args.address:
        overrides["address"] = args.address
    try:
        conf = cfg.load(config_class, entry.section, config_file=args.config, overrides=overrides,
                        sections=config_sections())
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
