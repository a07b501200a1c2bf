"""Configuration: defaults < YAML file < environment < command-line flags.

Each service declares a dataclass of its settings. A YAML file holds one
section per service (`crs:`, `compute:`, `agent:` ...); the environment
overrides a field as HARNESS_<SECTION>_<FIELD> (e.g. HARNESS_CRS_DATABASE);
flags override as `--set field=value`. An unknown key anywhere is an error at
start-up, not a silently ignored typo.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def read_yaml(path: str | os.PathLike[str], what: str, error: type[ValueError] = ConfigError) -> Any:
    """The YAML document in `path` (None when empty); `error` naming `what`, the file and, where YAML says
    it, the line when the file cannot be read or parsed: a start-up message, not a traceback."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise error(f"cannot read {what} {path}: not UTF-8 text") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise error(f"{what} {path} is not valid YAML: {_yaml_problem(e)}") from None


def known_keys(entry: dict, keys: Sequence[str], where: str, error: type[ValueError] = ConfigError) -> None:
    """`error` for a key of `entry` not in `keys`: a typo in a file would be a setting silently lost."""
    unknown = sorted(str(k) for k in entry if k not in keys)
    if unknown:
        raise error(f"{where}: unknown key(s) {unknown}; known: {list(keys)}")


def mapping_list(data: dict, key: str, where: str, example: str,
                 error: type[ValueError] = ConfigError) -> list[dict]:
    """`data[key]` as a list of mappings (absent: empty); `error` naming the entry otherwise, with `example`."""
    entries = data.get(key) or []
    if not isinstance(entries, list):
        raise error(f"{where}: {key} must be a list of {example}, got {entries!r}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise error(f"{where}: {key}[{i}] must be a mapping (e.g. {example}), got {entry!r}")
    return entries


def _yaml_problem(e: yaml.YAMLError) -> str:
    """One line for a YAML error (its own str() spans several, with the offending text quoted)."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        return " ".join(str(e).split())
    mark = e.problem_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: {e.problem}"
    if e.context and e.context_mark is not None and e.context_mark.line != mark.line:
        where += f" ({e.context} at line {e.context_mark.line + 1})"
    return where


def check_address(address: str) -> str:
    """`address` if it is HOST:PORT with PORT in 0..65535 (0: any free port; an IPv6 host in brackets).

    gRPC takes more -- "localhost" binds port 443, a port beyond 65535 some other one -- and a service would
    then listen somewhere nobody expects.
    """
    host, sep, port = address.rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not sep or host in ("", "[]") or bare_ipv6 or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
        raise ConfigError(f"address {address!r}: expected HOST:PORT with PORT in 0..65535 (0: any free port), "
                          "e.g. 127.0.0.1:50051 or [::1]:50051")
    return address


def _flow(value: str, opening: str, closing: str, where: str) -> Any:
    """A list or mapping given as the YAML file writes it (`[capacity, traits]`, `{pack: 1.0}`) from the environment
    or --set, decoded; any other text as it is (the comma forms `a,b` and `a=1,b=2`)."""
    text = value.strip()
    if not (text.startswith(opening) and text.endswith(closing)):
        return value
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: {text!r} is not a YAML {'list' if opening == '[' else 'mapping'}: "
                          f"{' '.join(str(e).split())}") from None


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if origin in (list, tuple):
        if isinstance(value, str):
            value = _flow(value, "[", "]", where)
            value = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else str
        return [_coerce(v, item, where) for v in value]
    if origin is dict:
        if isinstance(value, str):
            value = _flow(value, "{", "}", where)
        if isinstance(value, str):  # "a=1,b=2" from the environment or --set
            pairs = [p.partition("=") for p in value.split(",") if p.strip()]
            if any(not sep for _, sep, _ in pairs):
                raise ConfigError(f"{where}: expected name=value pairs separated by commas, got {value!r}")
            value = {k.strip(): v.strip() for k, _, v in pairs}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        vtype = args[1] if len(args) == 2 else str
        return {str(k): _coerce(v, vtype, f"{where}.{k}") for k, v in value.items()}
    if annotation is bool:
        return _bool(value, where)
    if annotation is int:
        return _int(value, where)
    if annotation is float:
        return _float(value, where)
    if annotation is str:
        return _str(value, where)
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _bad(where: str, expected: str, value: Any) -> ConfigError:
    got = "nothing (an empty value)" if value is None else repr(value)
    return ConfigError(f"{where}: expected {expected}, got {got}")


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise _bad(where, f"bool (true or false; also {', '.join(_TRUE[2:] + _FALSE[2:])}, 1, 0)", value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)        # 3.0 from YAML is 3; 2.9 is not a count of anything
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _bad(where, "int (a whole number)", value)


def _float(value: Any, where: str) -> float:
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = None
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):     # nan or inf would pass or fail every check below
        raise _bad(where, "float (a finite number)", value)
    return number


def _str(value: Any, where: str) -> str:
    if value is None or isinstance(value, list | tuple | set | dict):
        # An empty YAML value is None: str() of it would be the text "None" (a token, a path, a host...).
        raise _bad(where, "str (a text; '' for an empty one)", value)
    return value if isinstance(value, str) else str(value)


def load(
    cls: type[T],
    section: str,
    *,
    config_file: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    environ: typing.Mapping[str, str] | None = None,
    sections: typing.Mapping[str, str] | None = None,
) -> T:
    """Build `cls` (a dataclass) from all sources, most specific last.

    `sections`: every top-level name a config file may use -> the section it is (e.g. "fpga-server" ->
    "fpga_server"); others are an error. None: other names are ignored.
    """
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    # HARNESS_HOME is where the CLI looks for a suite's state: a service started by hand keeps its own there too
    # (its databases would otherwise join the default suite's in ~/.harness). Any other source overrides it.
    home = environ.get("HARNESS_HOME")
    if home:
        for name, sub in (("state_dir", ""), ("work_dir", "agent")):
            if name in names:
                values[name] = os.path.join(home, sub) if sub else home

    what = "config file"
    if not config_file and environ.get("HARNESS_CONFIG"):
        config_file, what = environ["HARNESS_CONFIG"], "HARNESS_CONFIG file"   # say where the name came from
    if config_file:
        data = read_yaml(config_file, what) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{config_file}: expected a mapping of sections")
        mine = [section]
        if sections is not None:
            # Every top-level name must be a section (or another name of one): a misnamed section would be
            # ignored without a word, every setting in it lost.
            unknown = sorted(str(k) for k in data if k not in sections)
            if unknown:
                raise ConfigError(f"{config_file}: unknown section(s) {unknown}; known: {sorted(sections)}")
            mine = [k for k in data if sections[k] == section]
            if len(mine) > 1:
                raise ConfigError(f"{config_file}: {' and '.join(map(repr, mine))} name the same section: keep one")
        part = (data.get(mine[0]) if mine else None) or {}
        if not isinstance(part, dict):
            raise ConfigError(f"{config_file}: section {section!r} must be a mapping")
        for key, value in part.items():
            if key not in names:
                raise ConfigError(f"{config_file}: unknown setting {section}.{key}; known: {sorted(names)}")
            values[key] = _coerce(value, hints[key], f"{config_file}: {section}.{key}")

    prefix = f"HARNESS_{section.upper()}_"
    for key, value in environ.items():
        if key.startswith(prefix):
            name = key[len(prefix):].lower()
            if name not in names:
                raise ConfigError(f"{key}: unknown setting {section}.{name}; known: {sorted(names)}")
            values[name] = _coerce(value, hints[name], key)

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in names:
            raise ConfigError(f"--set {key}: unknown setting of {section}; known: {sorted(names)}")
        values[key] = _coerce(value, hints[key], f"--set {key}")

    conf = cls(**values)
    check_settings(conf, section)
    return conf


# Seconds. A setting named *_interval_s or *_period_s (or heartbeat_s) is the wait between two rounds of a loop,
# one named *_timeout_s a call's deadline: 0 or less would spin that loop (a core burnt, SIGTERM waiting behind it,
# the CRS flooded) or fail every call at once. Every other *_s setting is a length of time: never less than 0.
WAIT_SUFFIXES = ("_interval_s", "_period_s")
DEADLINE_SUFFIXES = ("_timeout_s",)
POSITIVE_SECONDS = ("heartbeat_s",)         # waits named otherwise
# Waits for which 0 is documented to mean something: 0 is taken (what it means is said when less is refused).
ZERO_MEANS = {
    "reconcile_interval_s": "no reconcile rounds, the FPGA-servers reconciled at start and before each placement",
    "vm_check_interval_s": "the VM confirmed with the compute IRM before every Execute",
}
# Lists a service cannot do without: (section, setting) -> what is expected.
REQUIRED_LISTS = {
    ("orchestrator", "servers"): "at least one FPGA-server address (HOST:PORT; several comma-separated): "
                                 "without one the FPGA IRM has no device to offer",
}
# Lists of peers' addresses not named *_address.
ADDRESS_LISTS = ("servers",)


def _seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def seconds_problem(name: str, value: Any) -> str | None:
    """What setting `name` (a number of seconds, by its name) expects if `value` is not that; None if it is, or if
    `name` is no setting of seconds."""
    if not name.endswith("_s") or not _seconds(value):
        return None
    if not math.isfinite(value):
        return "expected seconds, a finite number"
    wait = name.endswith(WAIT_SUFFIXES) or name in POSITIVE_SECONDS
    deadline = name.endswith(DEADLINE_SUFFIXES)
    if (wait or deadline) and name not in ZERO_MEANS:
        if value > 0:
            return None
        why = ("the time between two rounds: 0 or less would run them back to back" if wait else
               "a deadline: 0 or less would fail every call at once")
        return f"expected seconds, more than 0 ({why})"
    if value >= 0:
        return None
    meaning = ZERO_MEANS.get(name)
    return f"expected seconds, 0 or more (0: {meaning})" if meaning else "expected seconds, 0 or more"


def check_seconds(conf: Any, section: str) -> None:
    """ConfigError naming the setting, its value and what is expected if a setting of seconds of `conf` (a
    dataclass; by its name, see `seconds_problem`) is out of range, or if heartbeat_timeout_s is not more than
    heartbeat_interval_s. For services built without `load` too (their own start-up checks)."""
    for f in dataclasses.fields(conf):
        value = getattr(conf, f.name)
        problem = seconds_problem(f.name, value)
        if problem:
            raise ConfigError(f"{section}.{f.name} = {value!r}: {problem}")
    interval = getattr(conf, "heartbeat_interval_s", None)
    timeout = getattr(conf, "heartbeat_timeout_s", None)
    if _seconds(interval) and _seconds(timeout) and not timeout > interval:
        raise ConfigError(f"{section}.heartbeat_timeout_s = {timeout!r}: expected more than heartbeat_interval_s "
                          f"({interval!r}): managers heartbeat every heartbeat_interval_s, so each would be marked "
                          "down between two of its heartbeats")


def check_settings(conf: Any, section: str) -> None:
    """ConfigError naming the setting if one of seconds is out of range (`check_seconds`), a list the service
    needs is empty (REQUIRED_LISTS), or a peer's address (`*_address`, several comma-separated; `servers`) is not
    HOST:PORT."""
    check_seconds(conf, section)
    for f in dataclasses.fields(conf):
        value = getattr(conf, f.name)
        expected = REQUIRED_LISTS.get((section, f.name))
        if expected and isinstance(value, list | tuple) and not value:
            raise ConfigError(f"{section}.{f.name} = {list(value)!r}: expected {expected}")
        if f.name.endswith("_address") and f.name != "address" and isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
        elif f.name in ADDRESS_LISTS and isinstance(value, list | tuple):
            parts = [str(p).strip() for p in value]
        else:
            continue
        for part in parts:
            try:
                check_address(part)
            except ConfigError as e:
                raise ConfigError(f"{section}.{f.name}: {e}") from None


def parse_sets(pairs: list[str]) -> dict[str, str]:
    """`["a=1", "b=x"]` -> `{"a": "1", "b": "x"}`."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected field=value")
        out[key.strip()] = value
    return out
