"""Scheduling algorithms from outside the project: a researcher's function, by name, live and simulated.

A Hydrogen scheduling algorithm (seed 001 §IV) is a pure function

    alg(queue, available, window, cost, *, now) -> [(job_id, devices), ...]

of the ready queue (`hydrogen.HJob`s in arrival order), the free devices,
the window (how many queued jobs it may look at) and the cost model
(`cost(job, devices) -> seconds`). Besides the built-in names, a policy name
may be

* `package.module:function` -- imported on first use; or
* the name of an entry point in the `harness.qos_algorithms` group, so an
  installed package can offer algorithms by short names.

The same name then works everywhere a built-in one does: the FPGA IRM's
`jobs_policy` (checked at start-up: an unknown or ill-formed one stops the
service with a message), `irm_fpga.qos.sim.run_hydrogen`, and
`harness bench policies --algorithm NAME`. A module that cannot be imported
-- missing, raising, even calling `exit()` or interrupted while it loads -- is
a `PolicyError` with the reason, never an exception (or an exit) of the
caller's. Whatever an algorithm returns is checked before it is acted on
(`check_allocation`): a plug-in with a bug gets a `PolicyError` naming its
fault, never a group on devices it had no right to; job ids must be `str`s
and device counts integers (`int`, or what `operator.index` takes, such as
numpy's; never a `bool`, a float or a string).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import operator
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from irm_fpga.qos import hydrogen as hy

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "harness.qos_algorithms"
BUILT_IN: dict[str, Callable[..., hy.Allocation]] = {**hy.ALGORITHMS, **hy.DEADLINE_ALGORITHMS}


class PolicyError(ValueError):
    """A scheduling algorithm cannot be loaded, or returned what it may not."""


class UnknownPolicy(PolicyError, KeyError):
    """No algorithm has that name (a KeyError too, as unknown names always were)."""

    def __str__(self) -> str:          # KeyError's would quote the message
        return str(self.args[0]) if self.args else ""


def is_external(name: str) -> bool:
    """Whether `name` is not built in but may name a plug-in (a `module:function` path or an entry point)."""
    return name not in BUILT_IN and (":" in name or any(ep.name == name for ep in _entry_points()))


def _entry_points():
    return entry_points(group=ENTRY_POINT_GROUP)


@functools.lru_cache(maxsize=64)
def single_algorithm(name: str) -> Callable[..., hy.Allocation]:
    """The algorithm `name` stands for: built in, `module:function`, or an entry point; else PolicyError.

    Loading runs the plug-in module's own code: whatever it raises, `SystemExit` and `KeyboardInterrupt`
    included, is this PolicyError (UnknownPolicy when the module or the name in it is not there), so that a
    caller checking a configuration stops with the reason instead of exiting or printing a traceback.
    """
    if name in BUILT_IN:
        if shadowed := [ep.value for ep in _entry_points() if ep.name == name]:
            # Installed to replace it, maybe: said, since the built-in runs (as the CRS says of its plug-ins).
            log.warning(f"entry point {name!r} of group {ENTRY_POINT_GROUP!r} ({', '.join(shadowed)}) is never used: "
                        f"the built-in algorithm of that name runs; register the plug-in under another name")
        return BUILT_IN[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        what = f"scheduling algorithm {name!r}: cannot load {attr!r} from module {module!r}"
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise UnknownPolicy(f"{what} ({_load_reason(e)})") from None
        except BaseException as e:     # noqa: BLE001 - the module's own code: it may raise or exit anything
            raise PolicyError(f"{what} ({_load_reason(e)})") from None
    else:
        found = [ep for ep in _entry_points() if ep.name == name]
        if not found:
            known = ", ".join(sorted(BUILT_IN))
            raise UnknownPolicy(f"unknown scheduling algorithm {name!r}; built in: {known}; or give "
                              f"'package.module:function', or an entry point of group {ENTRY_POINT_GROUP!r}")
        try:
            fn = found[0].load()
        except BaseException as e:     # noqa: BLE001 - as above: the entry point's module runs its code
            raise PolicyError(f"scheduling algorithm {name!r}: cannot load entry point {found[0].value!r} of group "
                              f"{ENTRY_POINT_GROUP!r} ({_load_reason(e)})") from None
    _check_signature(name, fn)
    return fn


REASON_CHARS = 500      # the most of an exception's text a load failure quotes (a start-up error is one line)


def reason(e: BaseException) -> str:
    """'Type: message' of an exception a plug-in's code raised (`exit(code)` for a SystemExit), on one line and
    clipped; never raises (its `__str__` is the plug-in's code too)."""
    if isinstance(e, SystemExit):
        text = f"exit({describe(e.code)})"
    else:
        try:
            message = str(e)
        except Exception:     # noqa: BLE001 - a plug-in's exception: its __str__ may fail
            message = "(its message cannot be shown)"
        text = f"{type(e).__name__}: {message}" if message else type(e).__name__
    return clip(" ".join(text.split()), REASON_CHARS)


def _load_reason(e: BaseException) -> str:
    return f"importing it called {reason(e)}" if isinstance(e, SystemExit) else reason(e)


def _check_signature(name: str, fn: object) -> None:
    if not callable(fn):
        raise PolicyError(f"scheduling algorithm {name!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind([], 0, 1, hy.linear_cost, now=0.0)
    except Exception:     # noqa: BLE001 - TypeError/ValueError; an object's own __signature__ may raise anything
        raise PolicyError(f"scheduling algorithm {name!r} must accept (queue, available, window, cost, *, now); "
                          f"its signature is {_signature(fn)}") from None


def _signature(fn: object) -> str:
    try:
        return str(inspect.signature(fn))        # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "unknown"


MAX_TEXT_CHARS = 4000       # the most of a plug-in's text (its answer's repr, an error's traceback) a message quotes


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text`, cut to about `limit` characters (saying how much was left out)."""
    if len(text) <= limit:
        return text
    return f"{text[:max(0, limit - 40)]}... ({len(text) - max(0, limit - 40)} characters more)"


def describe(value: object) -> str:
    """`repr(value)`, clipped; a repr that fails is named, not raised."""
    try:
        return clip(repr(value))
    except Exception as e:     # noqa: BLE001 - a plug-in's object: its repr may be broken too
        return f"<{type(value).__name__} object (its repr raised {type(e).__name__})>"


class NotPairs(TypeError):
    """An answer that is not a list of (str job id, integer devices) pairs; its message says what is wrong."""


def allocation_pairs(allocation: object) -> hy.Allocation:
    """A plug-in's answer as plain (str job id, int devices) pairs; NotPairs (a TypeError) saying what is wrong if
    it is none, or the TypeError / ValueError its own code raised.

    A job id must be a `str`, a device count an integer: an `int` or what `operator.index` takes (numpy's
    integers), never a `bool` (True is no count of devices), a float (1.9 is not 1 device) or a string. Runs
    the answer's own code (its iteration, `__index__`): the live job manager calls this in the plug-in's worker
    process (`plugin_worker`), which sends back only the plain pairs.
    """
    pairs = []
    for item in allocation:     # type: ignore[attr-defined]
        try:
            job_id, n = item
        except (TypeError, ValueError):
            raise NotPairs(f"{describe(item)} is not a (job id, devices) pair") from None
        if not isinstance(job_id, str):
            raise NotPairs(f"the job id {describe(job_id)} is a {_type_name(job_id)}, not a str")
        if isinstance(n, bool):
            raise NotPairs(f"{describe(job_id)} got {describe(n)} devices: a bool, not an integer")
        try:
            devices = operator.index(n)     # exactly an int (Python 3.10+)
        except TypeError:
            raise NotPairs(f"{describe(job_id)} got {describe(n)} devices: a {_type_name(n)}, not an "
                           f"integer") from None
        pairs.append((str.__str__(job_id), devices))    # a plain str (a subclass's own __str__ is not called)
    return pairs


def _type_name(value: object) -> str:
    name = getattr(type(value), "__name__", "")
    return clip(name, 100) if isinstance(name, str) and name else "object"


def check_allocation(name: str, allocation: object, queue: Sequence[hy.HJob], window: int,
                     available: int) -> hy.Allocation:
    """`allocation` as a list of (job id, devices) if an algorithm may return it, else PolicyError.

    Each job started at most once, from the first `window` queued jobs, on min..max of its devices, all of
    them within `available`.
    """
    by_id = {j.job_id: j for j in queue[:window]}
    try:
        pairs = allocation_pairs(allocation)
    except NotPairs as e:
        raise PolicyError(f"scheduling algorithm {name!r} returned {describe(allocation)}; expected a list of "
                          f"(job id, devices), each job id a str and each device count an integer: {e}") from None
    except (TypeError, ValueError):
        raise PolicyError(f"scheduling algorithm {name!r} returned {describe(allocation)}; "
                          f"expected a list of (job id, devices)") from None
    seen: set[str] = set()
    for job_id, n in pairs:
        job = by_id.get(job_id)
        if job is None:
            raise PolicyError(f"scheduling algorithm {name!r} started {describe(job_id)}, which is not among the first "
                              f"{window} queued jobs")
        if job_id in seen:
            raise PolicyError(f"scheduling algorithm {name!r} started {describe(job_id)} twice")
        seen.add(job_id)
        if not job.min_devices <= n <= job.max_devices:
            raise PolicyError(f"scheduling algorithm {name!r} gave {describe(job_id)} {describe(n)} devices; it allows "
                              f"{job.min_devices}..{job.max_devices}")
    used = sum(n for _, n in pairs)
    if used > available:
        raise PolicyError(f"scheduling algorithm {name!r} started jobs on {used} devices; {available} are free")
    return pairs
