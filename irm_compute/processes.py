"""Which processes on this machine belong to which execution: one scan of the process table for all of them.

Every execution's monitor needs its processes at every sample, and its end needs them all to kill. Walking the
machine's process table (and reading the environment of every process started since) once per execution per
sample made the agent's cost executions x processes on the machine: 48 executions on a machine of ~660 processes
took a whole core, samples came seconds apart and 5 s timeouts fired at up to 8-12 s. Here one scan serves them
all (`ProcessTable.members` reuses one younger than the caller's interval allows): it reads each process's
/proc/<pid>/stat, and a process's environment at most once in its life.

A process belongs to an execution, for its whole life once placed, by the first of:

* being its command (`spawn`);
* lineage: its parent belonged to the execution when a scan saw it (so it stays the execution's after its
  parent exits, setsid() or not);
* its mark (`EXECUTION_MARK` in its environment, which every descendant inherits): one whose parent exited
  before any scan saw it;
* its session, when it is an execution's (each command leads a session of its own): a background job whose
  parent exited unseen, whatever it did to its environment;
* adoption: with the agent a child subreaper (`adopt_orphans`), what its executions' processes orphan becomes
  the agent's child rather than init's, so it cannot get lost. A child of the agent none of the above places --
  a daemon that double-forked, setsid() and rewrote its environment area (setproctitle does) between two scans
  -- can only come from an execution running when it was created, since the agent's process starts nothing
  else: from the only one, it is that one's; from several, it is killed when the last of them ends (and is
  counted in none of their measurements).

A successor agent (one started on the same work dir after this one was SIGKILLed) finds what this one ran through
a ledger (`record`): after each scan and each spawn, the processes of the executions whose mark starts with the
agent's prefix -- pid, start time, group and session -- written to a file when they change. A child that rewrote
its environment (a program passing its own `env=`) or a daemon a scan saw is found there by its pid and start
time, and whatever stays in a recorded session or group by that (`leftovers`).

Killing an execution kills the process groups of its processes too (what a member forks meanwhile goes with
them), and a process of an execution that has ended, found by a later scan, is killed then. With the agent a
subreaper it scans every `_SWEEP_S` even when idle, reaping the orphans it adopted that died (nobody else will).

What is still not caught: with the agent no subreaper (prctl refused), a process that double-forks into a
session of its own and rewrites its environment before any scan sees it or its parent. This confines honest
programs for measurement; it is not a security boundary (cgroups are).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

import psutil

from irm_compute.cpu_ledger import CpuReading

log = logging.getLogger(__name__)

# The environment variable marking an execution's processes.
EXECUTION_MARK = "HARNESS_EXECUTION_MARK"
_MARK_KEY = EXECUTION_MARK.encode() + b"="

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PR_SET_CHILD_SUBREAPER = 36
# How many scan-and-kill rounds `kill` makes: a process forking between a scan and its kill leaves a child
# the next round finds.
_KILL_ROUNDS = 3
# How long `kill` waits for the processes it killed that are the agent's children (adopted) to be reaped.
_ADOPTED_REAP_S = 1.0
# With the agent a subreaper, how often it scans when no execution asks it to (an idle agent): it reaps the orphans
# it adopted that died, and kills what an ended execution left running.
_SWEEP_S = 1.0


def _ticks_now() -> int:
    """Now, in the unit of a process's start time in /proc/<pid>/stat: clock ticks since boot."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK)


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat's fields after the command name (the state first); None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold anything, parentheses and spaces included.
    return data[data.rfind(b")") + 2:].split()


def _read_stat(pid: int) -> tuple[bytes, int, int, int, int] | None:
    """(state, parent pid, process group id, session id, start time in clock ticks since boot) of a process; None
    if it is gone."""
    fields = _stat_fields(pid)
    try:
        return fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except (TypeError, IndexError, ValueError):
        return None


def _read_cpu(pid: int, start: int) -> CpuReading | None:
    """A process's CPU reading (its time and its waited-for children's, its parent, whether a zombie), if `pid`
    is still the process started at `start` (clock ticks since boot)."""
    fields = _stat_fields(pid)
    try:
        if int(fields[19]) != start:
            return None
        return CpuReading((int(fields[11]) + int(fields[12])) / _CLK_TCK, (int(fields[13]) + int(fields[14])) / _CLK_TCK,
                          int(fields[1]), fields[0] == b"Z", start)
    except (TypeError, IndexError, ValueError):
        return None


def _read_mark(pid: int) -> str:
    """The execution mark in a process's environment: '' if none, unreadable (not ours, a zombie) or rewritten."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return ""
    for entry in data.split(b"\0"):
        if entry.startswith(_MARK_KEY):
            return entry[len(_MARK_KEY):].decode(errors="replace")
    return ""


def _set_subreaper(on: bool) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pin_threads(pid: int, allowed: frozenset[int]) -> None:
    """Put every thread of `pid` whose CPU mask reaches beyond `allowed` back on `allowed`.

    A mask is a thread's, not a process's: a worker thread that widens its own (sched_setaffinity(0) in it)
    leaves the main thread's, which psutil reads, as it was.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return  # gone
    for name in tids:
        tid = int(name)
        try:
            if not os.sched_getaffinity(tid) <= allowed:
                os.sched_setaffinity(tid, allowed)
        except OSError:
            continue  # the thread ended, or is not ours to change


@dataclass(eq=False)
class _Proc:
    pid: int
    start: int                   # clock ticks since boot: with the pid, which process this is
    ppid: int = 0
    pgid: int = 0
    sid: int = 0
    zombie: bool = False
    owner: Hashable | None = None              # the execution it belongs to, for its life once set
    shared: frozenset[Hashable] | None = None  # an orphan any of these executions may have started
    mark: str | None = None                    # its mark, once read
    seen: int = 0                              # clock ticks since boot when a scan first saw it
    handle: psutil.Process | None = None

    @property
    def placed(self) -> bool:
        return self.owner is not None or self.shared is not None


@dataclass(frozen=True)
class _Execution:
    pid: int
    start: int
    mark: str
    seen: int = 0            # clock ticks since boot when it was first known alive (its spawn)


class ProcessTable:
    """The machine's processes, as far as the executions registered here are concerned (see the module).

    Executions are keys (any hashable: the sandbox uses its LocalExecution objects); every command must be
    spawned through `spawn`, leading a session of its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[int, _Proc] = {}
        self._executions: dict[Hashable, _Execution] = {}
        self._roots: dict[tuple[int, int], Hashable] = {}
        self._by_mark: dict[str, Hashable] = {}
        self._sessions: dict[int, Hashable] = {}
        self._owned: dict[Hashable, list[_Proc]] = {}   # by execution, as of the last scan
        self._scanned = -math.inf          # monotonic time the last scan began
        self._subreaper = 0                # holders of `adopt_orphans`
        self._adopting_since = math.inf    # clock ticks: orphans started since then come to this process
        self._oldest = 0                   # (during a scan) the start of the oldest command running
        self._my_session = 0
        self._idle = threading.Event()     # set: the sweeper stops
        self._ledgers: dict[Path, tuple[str, frozenset[tuple[int, int, int, int, int]] | None]] = {}
        self._scan_tick = 0                # clock ticks since boot when the last scan began
        self.scans = 0                     # how many scans ran (for tests and measurements)

    # --- executions ---------------------------------------------------------------

    def spawn(self, key: Hashable, mark: str, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """`start()` (which spawns the command) and the command registered as `key`'s, with no scan between:
        one would take the new child of the agent, not yet anyone's command, for an adopted orphan."""
        with self._lock:
            popen = start()
            stat = _read_stat(popen.pid)  # the child is not reaped before this returns: it is there
            begun = stat[4] if stat is not None else _ticks_now()
            self._executions[key] = _Execution(popen.pid, begun, mark, _ticks_now())
            self._roots[(popen.pid, begun)] = key
            self._by_mark[mark] = key
            self._sessions[popen.pid] = key
            self._write_ledgers()       # at once: the command's session and group hold what it forks
        return popen

    def unregister(self, key: Hashable) -> None:
        """`key` ended (its command reaped). Its processes stay its own (a late kill still finds them); an orphan
        it shared with others no longer running is killed."""
        with self._lock:
            ex = self._executions.pop(key, None)
            if ex is None:
                return
            self._roots.pop((ex.pid, ex.start), None)
            self._by_mark.pop(ex.mark, None)
            self._sessions.pop(ex.pid, None)
            self._write_ledgers()       # what it leaves, this table kills (see `_scan`)
            orphans: list[_Proc] = []
            adopted: list[psutil.Process] = []
            for p in self._procs.values():
                if p.shared is not None and key in p.shared:
                    p.shared = p.shared - {key}
                    if not p.shared and not p.zombie:
                        orphans.append(p)
            if orphans:
                log.warning("killing orphans none of whose possible executions runs any more",
                            extra={"pids": [p.pid for p in orphans]})
                adopted = self._kill(orphans)
        if adopted:
            psutil.wait_procs(adopted, timeout=_ADOPTED_REAP_S)  # the agent's children: reaped, not left zombies

    def members(self, key: Hashable, max_age: float) -> list[psutil.Process]:
        """`key`'s live processes, its command first (if it still runs), from a scan at most `max_age` old."""
        with self._lock:
            self._ensure(time.monotonic() - max_age)
            return self._live(key)

    def cpu_readings(self, key: Hashable, max_age: float) -> dict[tuple[int, int], tuple[int, CpuReading]]:
        """`key`'s processes, zombies too, from a scan at most `max_age` old: (pid, start) -> (pid, its CPU
        reading) (irm_compute.cpu_ledger)."""
        with self._lock:
            self._ensure(time.monotonic() - max_age)
            procs = [(p.pid, p.start) for p in self._owned.get(key, ())]
        out = {}
        for pid, start in procs:
            reading = _read_cpu(pid, start)
            if reading is not None:
                out[(pid, start)] = (pid, reading)
        return out

    def kill(self, key: Hashable) -> None:
        """SIGKILL every process of `key` found now (its command included, if not yet reaped), scanning again
        for what they forked meanwhile; those that are the agent's children (adopted) are reaped."""
        adopted: list[psutil.Process] = []
        signalled: set[int] = set()
        for _ in range(_KILL_ROUNDS):
            asked = time.monotonic()
            with self._lock:
                self._ensure(asked)   # a scan begun after the last kills: it sees what they forked
                mine = self._owned.get(key, [])
                groups = {p.pgid for p in mine}
                # A scan may find only the zombie of a process that forked and exited while it ran, its child born
                # after the listing: the zombie's group still reaches it.
                if all(p.zombie for p in mine) and groups <= signalled:
                    break
                signalled |= groups
                adopted += self._kill(mine)
        if adopted:
            # No scan may follow (the agent idle): what it killed must not stay the agent's zombies.
            psutil.wait_procs(adopted, timeout=_ADOPTED_REAP_S)

    # --- the ledger a successor reads -------------------------------------------------

    def record(self, path: Path, prefix: str) -> None:
        """Keep `path` listing the processes of the executions whose mark starts with `prefix` (see the module),
        from now until `stop_recording`."""
        with self._lock:
            self._ledgers[path] = (prefix, None)
            self._write_ledgers()

    def stop_recording(self, path: Path) -> None:
        """Stop keeping `path`, and remove it: what it listed has been killed (a shutdown)."""
        with self._lock:
            self._ledgers.pop(path, None)
        path.unlink(missing_ok=True)

    def _write_ledgers(self) -> None:
        """Each ledger's entries: (pid, start, group, session, seen) of the processes of its executions, `seen`
        the clock tick (since boot) at which it was first known alive, in that group and session: the scan's that
        first saw it, the spawn's for a command (see `leftovers`). Written when they change."""
        for path, (prefix, written) in list(self._ledgers.items()):
            entries: dict[tuple[int, int, int, int], int] = {}
            for key, ex in self._executions.items():
                if not ex.mark.startswith(prefix):
                    continue
                entries[(ex.pid, ex.start, ex.pid, ex.pid)] = ex.seen
                for q in self._owned.get(key, ()):
                    if not q.zombie:
                        entries.setdefault((q.pid, q.start, q.pgid, q.sid), q.seen)
            now = frozenset((*ident, seen) for ident, seen in entries.items())
            if now == written:
                continue
            try:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(json.dumps({"boot_id": _boot_id(), "processes": sorted(now)}))
                os.replace(tmp, path)
            except OSError as e:    # a full disk: the executions run on; only a successor's cleanup is less sure
                log.warning("could not write the process ledger", extra={"path": str(path), "error": str(e)})
                continue
            self._ledgers[path] = (prefix, now)

    # --- orphans ------------------------------------------------------------------

    def adopt_orphans(self) -> bool:
        """Make this process a child subreaper while at least one holder wants it; False if the kernel refused."""
        with self._lock:
            if self._subreaper == 0:
                if not _set_subreaper(True):
                    return False
                self._adopting_since = _ticks_now()
                self._idle = threading.Event()
                threading.Thread(target=self._sweep, args=(self._idle,), name="process-sweep", daemon=True).start()
            self._subreaper += 1
            return True

    def release_orphans(self) -> None:
        with self._lock:
            if self._subreaper == 0:
                return
            self._subreaper -= 1
            if self._subreaper == 0:
                _set_subreaper(False)
                self._adopting_since = math.inf
                self._idle.set()

    def _sweep(self, stop: threading.Event) -> None:
        """While a subreaper, scan at least every _SWEEP_S, executions running or not (see `_scan`)."""
        while not stop.wait(_SWEEP_S):
            try:
                with self._lock:
                    self._ensure(time.monotonic() - _SWEEP_S, idle_too=True)
            except Exception:  # noqa: BLE001 - the sweeper must outlive one bad scan
                log.exception("process sweep failed")

    # --- the scan (under the lock) -------------------------------------------------

    def _live(self, key: Hashable) -> list[psutil.Process]:
        ex = self._executions.get(key)
        out: list[psutil.Process] = []
        for p in self._owned.get(key, ()):
            if not p.zombie and (h := self._handle(p)) is not None:
                if ex is not None and p.pid == ex.pid:
                    out.insert(0, h)
                else:
                    out.append(h)
        return out

    def _handle(self, p: _Proc) -> psutil.Process | None:
        if p.handle is None:
            try:
                h = psutil.Process(p.pid)
            except psutil.Error:
                return None
            stat = _read_stat(p.pid)
            if stat is None or stat[4] != p.start:
                return None  # the pid now names another process (psutil's identity check is that one's)
            p.handle = h
        return p.handle

    def _ensure(self, newer_than: float, idle_too: bool = False) -> None:
        if self._scanned >= newer_than or not (self._executions or idle_too):
            return
        self._scanned = time.monotonic()
        self._scan_tick = _ticks_now()
        self._scan()

    def _kill(self, procs: list[_Proc]) -> list[psutil.Process]:
        """SIGKILL `procs` and their process groups; the handles of those that are the agent's (adopted) children.

        A group goes at once, also with what its members fork meanwhile (the kernel holds back a fork while a
        signal to its group is delivered): a process hopping to a new child every few milliseconds outruns
        killing by pid. The group of an execution's process holds only the execution's processes: its sessions
        are its own (each command leads a new one), and a group never spans two sessions. Signalled just after a
        scan saw a member (a zombie, unreaped, counts), so its id is still that group's.
        """
        me, my_group = os.getpid(), os.getpgid(0)
        for group in {p.pgid for p in procs} - {my_group, 0}:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        roots = {ex.pid for ex in self._executions.values()}
        adopted = []
        for p in procs:
            if p.zombie or (h := self._handle(p)) is None:
                continue
            try:
                h.kill()
            except psutil.Error:
                pass
            if p.ppid == me and p.pid not in roots:
                adopted.append(h)
        return adopted

    def _scan(self) -> None:
        self.scans += 1
        me = os.getpid()
        procs: dict[int, _Proc] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            stat = _read_stat(pid)
            if stat is None or pid == me:
                continue
            state, ppid, pgid, sid, start = stat
            p = self._procs.get(pid)
            if p is None or p.start != start:
                p = _Proc(pid, start, seen=self._scan_tick)
            p.ppid, p.pgid, p.sid, p.zombie = ppid, pgid, sid, state in (b"Z", b"X")
            procs[pid] = p
        self._procs = procs
        self._place(me)
        self._reap_adopted(me)
        owned: dict[Hashable, list[_Proc]] = {}
        for p in self._procs.values():
            if p.owner is not None:
                owned.setdefault(p.owner, []).append(p)
        self._owned = owned
        self._write_ledgers()
        # What an ended execution left running (forked while it was being killed, or it escaped its kill): it goes
        # now, as it should have with its execution.
        left = [p for p in self._procs.values()
                if (p.owner is not None and p.owner not in self._executions) or p.shared == frozenset()]
        if left:
            if alive := [p.pid for p in left if not p.zombie]:
                log.warning("killing what ended executions left running", extra={"pids": alive})
            self._kill(left)

    def _place(self, me: int) -> None:
        # Only a process started since the oldest command can be a descendant of one: only those are read.
        self._oldest = min((ex.start for ex in self._executions.values()), default=math.inf)
        self._my_session = os.getsid(0)
        done: set[int] = set()
        for p in list(self._procs.values()):
            # Its ancestors not placed yet, nearest first; then placed from the top down, so each inherits.
            chain: list[_Proc] = []
            cur: _Proc | None = p
            while cur is not None and cur.pid not in done and not cur.placed:
                chain.append(cur)
                done.add(cur.pid)
                cur = self._procs.get(cur.ppid) if cur.ppid != me else None
            for q in reversed(chain):
                parent = self._procs.get(q.ppid) if q.ppid != me else None
                if parent is not None and parent.placed:
                    q.owner, q.shared = parent.owner, parent.shared
                else:
                    self._place_alone(q, me)

    def _place_alone(self, p: _Proc, me: int) -> None:
        key = self._roots.get((p.pid, p.start))
        if key is None and p.start >= self._oldest:
            if p.mark is None:
                p.mark = _read_mark(p.pid)  # once: what it started with counts, a later rewrite does not
            key = self._by_mark.get(p.mark) if p.mark else None
        if key is None and p.sid != p.pid:
            key = self._sessions.get(p.sid)
        if (key is None and self._subreaper and p.ppid == me and p.sid != self._my_session
                and p.start >= self._adopting_since and (p.pid, p.start) not in self._roots):
            could = frozenset(k for k, ex in self._executions.items() if ex.start <= p.start)
            if len(could) == 1:
                key = next(iter(could))
            elif could:
                p.shared = could
        p.owner = key

    def _reap_adopted(self, me: int) -> None:
        """Reap the agent's adopted children that died: nobody else will (the agent's own commands are reaped
        by their executions). With the agent a subreaper, every child of it that is no command and not in its
        session is one: the agent's process starts nothing else, and a command leads a session of its own."""
        for p in list(self._procs.values()):
            if not (p.zombie and p.ppid == me) or (p.pid, p.start) in self._roots:
                continue
            if not (p.placed or (self._subreaper and p.sid != self._my_session)):
                continue
            try:
                if os.waitpid(p.pid, os.WNOHANG)[0] == p.pid:
                    del self._procs[p.pid]
            except ChildProcessError:
                pass


def _boot_id() -> str:
    """This boot's id: a ledger of another boot lists processes that died with it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def leftovers(path: Path) -> list[psutil.Process]:
    """The live processes a ledger `path` (see `ProcessTable.record`) accounts for: each listed one still running
    (same pid, same start time), and each in a listed process group or session that is still the listed one.
    Not this process, its group or its session; nothing from a ledger of another boot (its processes died with
    it, and pids, groups and start times start again).

    A group's (or session's) id is its creator's pid, which the kernel does not give out again while any process
    is in that group. So the group is the listed one if its leader is gone (its members hold the id; short of a
    reused id made a group again by a process that exited since, leaving children), or if the leader had
    started when a listed member was seen in the group (it held the pid then; a later process given the pid
    started after the group was gone).
    """
    try:
        ledger = json.loads(path.read_text())
        boot = str(ledger["boot_id"])
        listed = [tuple(int(x) for x in e) for e in ledger["processes"]]
        if any(len(e) != 5 for e in listed):
            raise ValueError("an entry is not (pid, start, group, session, seen)")
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError) as e:
        log.warning("could not read the process ledger", extra={"path": str(path), "error": str(e)})
        return []
    if boot != _boot_id():
        return []
    starts = {pid: start for pid, start, _, _, _ in listed}
    me, mine = os.getpid(), {os.getpgid(0), os.getsid(0)}
    # Per group and session id: the latest tick a listed member was seen in it (any one proves the leader).
    seen: dict[tuple[str, int], int] = {}
    for _, _, group, session, tick in listed:
        for kind, ident in (("g", group), ("s", session)):
            if ident not in mine:
                seen[(kind, ident)] = max(seen.get((kind, ident), 0), tick)
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _read_stat(int(name))) is not None:
            stats[int(name)] = stat

    def still_listed(kind: str, leader: int) -> bool:
        tick = seen.get((kind, leader))
        if tick is None:
            return False
        stat = stats.get(leader)
        return stat is None or stat[4] <= tick

    out = []
    for pid, (state, _, pgid, sid, start) in stats.items():
        if pid == me or state in (b"Z", b"X"):
            continue
        if starts.get(pid) == start or still_listed("g", pgid) or still_listed("s", sid):
            try:
                out.append(psutil.Process(pid))
            except psutil.Error:
                continue
    return out


# The table every execution of this process uses.
PROCESSES = ProcessTable()
