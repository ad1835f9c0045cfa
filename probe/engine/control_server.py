"""The per-process control socket, server side: how ``probe attach`` turns the probe on
and off.

The plugin (:mod:`probe.engine.plugin`) calls :func:`start_server` in every vLLM process. It
opens a Unix domain socket ``<run dir>/ctl-<pid>.sock`` (the run dir is
:func:`run_dir`: per user, mode 0700, checked, with a fallback when the shared one is not
safe; the socket is 0600) and serves it from a daemon thread blocked in ``accept``; each
connection gets its own short-lived thread (at most :data:`MAX_CLIENTS`), and each
request must arrive whole within :data:`REQUEST_DEADLINE_S`. Nothing here runs per hooked
call: the hooks still check ``RT.enabled`` and nothing else.

Protocol: one JSON object per line, at most :data:`MAX_LINE` bytes, one reply line per
request. Requests name a command from a fixed set and its arguments; nothing else is
accepted and no code or path travels over the socket::

    {"cmd": "status"}
    {"cmd": "enable", "gpu_timing": false, "hooks": ["step", "dispatch"], "sample_every": 4}
    {"cmd": "enable", "duration_s": 30}
    {"cmd": "disable"}
    {"cmd": "snapshot"}

Replies are ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; an error reply
changes nothing. ``enable`` creates the ring in the process's own run dir and answers
with its file name. Only a peer with our uid (or root) is served (``SO_PEERCRED``).

While a reader is attached a watchdog thread of its own (it depends on no client's
I/O) wakes every ``watchdog_interval_s``: when the attaching process is gone, or the
reader's heartbeat in the ring header
(:meth:`probe.reader.ring_reader.RingReader.touch_heartbeat`) is
older than ``heartbeat_timeout_s`` while the reader is stopped (or its state cannot be
read), or older than ``live_silence_s`` while it runs (a reader waiting for a CPU on a
saturated host), it disables the hooks and removes the ring, so a killed ``probe
attach`` never leaves a server instrumented.
An ``enable`` with ``duration_s`` also sets a deadline (that long after this process's
hooks went on): the same thread wakes at it and turns the hooks off itself, however far
behind the reader is (``probe attach --duration``). ``status`` tells the deadline and
how the last attachment ended (``last_off``: why, and when on CLOCK_BOOTTIME).

This module is the engine side (it runs in every vLLM process and imports nothing of
the reader side); the reader's client is :mod:`probe.reader.control`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe import config

# the protocol, shared with the readers' client (probe.reader.control)
from probe.control_protocol import (
    CLIENT_TIMEOUT_S,
    COMMANDS,
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    LIVE_READER_SILENCE_S,
    MAX_CLIENTS,
    MAX_DURATION_S,
    MAX_LINE,
    PROTOCOL,
    REQUEST_DEADLINE_S,
    SOCK_RE,
    WATCHDOG_INTERVAL_S,
    ControlError,
    PeerRefused,
    check_peer,
    parse_message,
    peer_cred,
    pid_alive,
    pid_stat,
    role_from,
    run_dir,
    socket_path,
)
from probe.engine.identity import (
    cmdline,
    model_from_argv,
    model_name,
    ranks_of,
    stack_modules,
)
from probe.ring_dir import candidate_run_dirs  # for readers; re-exported from here

if TYPE_CHECKING:
    import logging


def _model(name: str | None) -> str | None:
    """The model by its name, never the engine machine's folder (identity.model_name)."""
    return model_name(name) if name else None


def _log() -> logging.Logger:
    """The "probe" logger. ``logging`` is imported when something is logged: the readers
    import this module for the protocol, and ``probe attach`` before its enable."""
    import logging

    return logging.getLogger("probe")


MAX_STEP_INTERVAL = config.MAX_STEP_INTERVAL


# -- the probe inside this process, as the server drives it ------------------------------------


class ProbeHost:
    """What the server does to the probe in this process (a seam for tests)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.writer: Any = None

    @property
    def enabled(self) -> bool:
        from probe.engine.runtime import RT

        return bool(RT.enabled)

    def installed_families(self) -> list[str]:
        from probe.engine import hooks

        return sorted({h.family for h in hooks.INSTALLER.hooks.values()})

    def parked_hooks(self) -> int:  # left dormant by a detach (probe.engine.hooks.PARKED)
        return (
            len(sys.modules["probe.engine.hooks"].PARKED)
            if "probe.engine.hooks" in sys.modules
            else 0
        )

    def known_families(self) -> list[str]:
        from probe.engine import hooks

        return list(hooks.FAMILIES)

    def enable(
        self,
        ring_path: Path,
        gpu_timing: int,
        families: list[str] | None,
        sample_every: int = 1,
    ) -> Any:
        """Create the ring and attach: the per-step hooks are installed only now."""
        from probe.engine import hooks
        from probe.engine.ring_writer import RingWriter

        capacity = config.get_int(config.RING_CAPACITY, self.environ)
        if ring_path.exists():  # a stale ring of an earlier process with our pid
            ring_path.unlink()
        writer = RingWriter.create(ring_path, capacity)
        try:
            hooks.attach(
                writer, families=families, gpu_timing=gpu_timing, sample_every=sample_every
            )
        except BaseException:
            writer.close()
            raise
        self.writer = writer
        return writer

    def disable(self) -> None:
        """Detach (the per-step hooks are removed again) and drop the ring."""
        from probe.engine import hooks

        writer = hooks.detach()
        for w in (writer, self.writer):
            close = getattr(w, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()
        self.writer = None

    def heartbeat_ns(self) -> int:
        w = self.writer
        if w is None:
            return 0
        try:
            return int(w.reader_heartbeat_ns)
        except ValueError:  # the ring was closed under us (disable, takeover): no reader
            return 0

    def dropped(self) -> int:
        w = self.writer
        return int(w.dropped) if w is not None else 0

    def faults(self) -> dict[str, int]:
        from probe.engine.runtime import RT

        return dict(RT.faults)

    def snapshot(self) -> dict[str, Any] | None:
        from probe.engine.runtime import RT

        snap = RT.static.get("snapshot")
        return dict(snap) if isinstance(snap, dict) else None

    def static(self) -> dict[str, Any]:
        from probe.engine.runtime import RT

        return {k: v for k, v in RT.static.items() if k != "snapshot"}


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


# -- server -----------------------------------------------------------------------------------


class ControlServer:
    """One process's control socket and its thread (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        environ: Mapping[str, str] | None = None,
        host: ProbeHost | None = None,
        role_hint: str = "other",
        clock_ns: Callable[[], int] = _boottime_ns,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        watchdog_interval_s: float = WATCHDOG_INTERVAL_S,
        alive: Callable[[int], bool] = pid_alive,
        stat: Callable[[int], tuple[str, int] | None] = pid_stat,
        live_silence_s: float = LIVE_READER_SILENCE_S,
        watchdog_thread: bool = True,
    ) -> None:
        from probe.ring_dir import check_ring_dir

        self.run_dir = check_ring_dir(run_dir)
        self.environ = dict(os.environ if environ is None else environ)
        self.host = host if host is not None else ProbeHost(self.environ)
        self.pid = os.getpid()
        self.path = socket_path(self.pid, self.run_dir)
        self.role_hint = role_hint
        self.clock_ns = clock_ns
        self.heartbeat_timeout_ns = int(heartbeat_timeout_s * 1e9)
        self.watchdog_interval_s = watchdog_interval_s
        self.alive = alive
        self.stat = stat
        self.live_silence_ns = int(live_silence_s * 1e9)
        # False: no thread of its own; the caller drives watchdog() (an injected clock's
        # tests, where a real-time thread would race the hand-driven calls)
        self.watchdog_thread = watchdog_thread
        self.attached_by: int | None = None
        self.reader_start: int | None = None  # the reader's start time (a reused pid differs)
        self.enabled_at_ns = 0
        self.deadline_ns: int | None = None  # hooks off at this CLOCK_BOOTTIME (duration_s)
        self.last_off: dict[str, Any] | None = None  # why and when the hooks last went off
        self.ring_path: Path | None = None
        self.watchdog_trips = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._watchdog_thread: threading.Thread | None = None
        self._wake = threading.Event()  # set on enable and on close: the watchdog's cue
        self._clients = threading.BoundedSemaphore(MAX_CLIENTS)
        self._stopped = False

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        """Bind the socket (0600) and start the control thread."""
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # a stale socket of an earlier process with our pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket file is created 0600, with no window
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        sock.set_inheritable(False)
        self._sock = sock
        self._thread = threading.Thread(
            target=self._serve, name=f"probe-control-{self.pid}", daemon=True
        )
        self._thread.start()
        if self.watchdog_thread:
            self._watchdog_thread = threading.Thread(
                target=self._watch, name=f"probe-watchdog-{self.pid}", daemon=True
            )
            self._watchdog_thread.start()

    def close(self) -> None:
        """Stop serving, disable the probe if we enabled it, remove the socket file."""
        self._stopped = True
        self._wake.set()
        if self.attached_by is not None:
            with contextlib.suppress(Exception):
                self._disable("server closing", "closing")
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if os.getpid() == self.pid:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for t in (self._thread, self._watchdog_thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=2.0)

    def _serve(self) -> None:
        """Accept connections; each is served on its own thread (at most
        :data:`MAX_CLIENTS` at once), so a slow client delays nobody else."""
        while not self._stopped:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._stopped:
                    return
                time.sleep(0.1)
                continue
            if not self._clients.acquire(blocking=False):
                conn.settimeout(1.0)
                _send(conn, {"ok": False, "error": f"busy: {MAX_CLIENTS} clients connected"})
                conn.close()
                continue
            try:
                threading.Thread(
                    target=self._client, args=(conn,), name="probe-control-client", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had: refuse this one, keep serving
                self._clients.release()
                conn.close()

    def _client(self, conn: socket.socket) -> None:
        try:
            self._handle_conn(conn)
        except Exception as exc:  # a bad client never takes a thread down with it
            _log().debug("probe control: connection failed: %r", exc)
        finally:
            conn.close()
            self._clients.release()

    def _watch(self) -> None:
        """The watchdog's own thread: it runs whatever any client does or does not send."""
        while not self._stopped:
            if self.attached_by is None:
                self._wake.wait()
                self._wake.clear()
                continue
            wait = self.watchdog_interval_s
            deadline = self.deadline_ns
            if deadline is not None:  # wake at the deadline, not up to an interval after it
                wait = min(wait, max(0.0, (deadline - self.clock_ns()) / 1e9))
            self._wake.wait(wait)
            self._wake.clear()
            self.watchdog()

    def _handle_conn(self, conn: socket.socket) -> None:
        cred = peer_cred(conn)
        try:
            check_peer(cred)
        except PeerRefused as exc:
            conn.settimeout(1.0)
            _send(conn, {"ok": False, "error": str(exc)})
            return
        buf = b""
        while not self._stopped:
            # the deadline is per request, from its first byte's wait: a client that
            # trickles a byte at a time is cut off when it passes
            deadline = time.monotonic() + REQUEST_DEADLINE_S
            nl = buf.find(b"\n")
            while nl < 0:
                if len(buf) > MAX_LINE:
                    _send(conn, {"ok": False, "error": f"request longer than {MAX_LINE} bytes"})
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    _send(
                        conn,
                        {"ok": False, "error": f"no whole request in {REQUEST_DEADLINE_S:g} s"},
                    )
                    return
                conn.settimeout(left)
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                buf += chunk
                nl = buf.find(b"\n")
            line, buf = buf[:nl], buf[nl + 1 :]
            if len(line) > MAX_LINE:
                _send(conn, {"ok": False, "error": f"request longer than {MAX_LINE} bytes"})
                return
            reply = self.handle_line(line, peer_pid=cred[0])
            conn.settimeout(CLIENT_TIMEOUT_S)  # a client that never reads is dropped too
            _send(conn, reply)

    # -- requests -------------------------------------------------------------------------

    def handle_line(self, line: bytes, peer_pid: int) -> dict[str, Any]:
        """One request line -> its reply. Never raises."""
        self.requests += 1
        if len(line) > MAX_LINE:
            return {"ok": False, "error": f"request longer than {MAX_LINE} bytes"}
        try:
            req = parse_message(line)
        except (ValueError, UnicodeDecodeError) as exc:
            return {"ok": False, "error": f"malformed JSON: {exc}"}
        except RecursionError:
            return {"ok": False, "error": "malformed JSON: nested too deeply"}
        if not isinstance(req, dict):
            return {"ok": False, "error": "a request is one JSON object"}
        cmd = req.get("cmd")
        if not isinstance(cmd, str) or cmd not in COMMANDS:
            return {"ok": False, "error": f"unknown command {cmd!r}; known: {sorted(COMMANDS)}"}
        extra = sorted(set(req) - {"cmd"} - COMMANDS[cmd])
        if extra:
            return {"ok": False, "error": f"{cmd}: unknown argument(s) {extra}"}
        try:
            with self._lock:
                out: dict[str, Any] = getattr(self, f"cmd_{cmd}")(req, peer_pid)
        except ControlError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:
            _log().warning("probe control: %s failed: %r", cmd, exc)
            return {"ok": False, "error": f"{cmd} failed: {exc!r}"}
        return {"ok": True, **out}

    def cmd_status(self, req: Mapping[str, Any], peer_pid: int) -> dict[str, Any]:
        title = cmdline()
        snap = self.host.snapshot() or {}
        vllm = sys.modules.get("vllm")
        hb = self.host.heartbeat_ns()
        return {
            "protocol": PROTOCOL,
            "pid": self.pid,
            "ppid": os.getppid(),
            "role": self.role(title),
            "title": " ".join(title)[:200],
            "ranks": ranks_of(snap, title),
            "vllm_version": getattr(vllm, "__version__", None) or snap.get("vllm_version"),
            "runner": snap.get("runner"),
            "model": _model(
                snap.get("model") or model_from_argv(title) or model_from_argv(sys.argv)
            ),
            "enabled": self.host.enabled,
            "attached_by": self.attached_by,
            "reader_heartbeat_age_s": (
                (self.clock_ns() - hb) / 1e9 if self.attached_by is not None and hb else None
            ),
            "ring": self.ring_path.name if self.ring_path is not None else None,
            "deadline_ns": self.deadline_ns,
            "last_off": self.last_off,
            "dropped": self.host.dropped(),
            "hook_faults": self.host.faults(),
            "hook_families": self.host.installed_families(),
            "parked_hooks": self.host.parked_hooks(),
            "watchdog_trips": self.watchdog_trips,
            "snapshot_taken": bool(snap),
        }

    def role(self, title: Sequence[str] | None = None) -> str:
        live = role_from(cmdline() if title is None else title)
        return live if live != "other" else self.role_hint

    def cmd_enable(self, req: Mapping[str, Any], peer_pid: int) -> dict[str, Any]:
        every = config.get_int(config.GPU_TIMING, self.environ)
        gpu_timing = req.get("gpu_timing", every)
        if isinstance(gpu_timing, bool):  # true: every N-th step as configured here
            gpu_timing = (every or 8) if gpu_timing else 0
        if not isinstance(gpu_timing, int) or not 0 <= gpu_timing <= MAX_STEP_INTERVAL:
            raise ControlError(
                f"enable: gpu_timing must be true, false or a step interval 0..{MAX_STEP_INTERVAL}"
            )
        sample_every = req.get("sample_every", 1)
        if (
            isinstance(sample_every, bool)
            or not isinstance(sample_every, int)
            or not 1 <= sample_every <= MAX_STEP_INTERVAL
        ):
            raise ControlError(f"enable: sample_every must be an integer 1..{MAX_STEP_INTERVAL}")
        duration = req.get("duration_s")
        if duration is not None and (
            isinstance(duration, bool)
            or not isinstance(duration, (int, float))
            or not 0 < duration <= MAX_DURATION_S  # NaN fails this too
        ):
            raise ControlError(
                f"enable: duration_s must be a number of seconds in (0, {MAX_DURATION_S:g}]"
            )
        families = req.get("hooks")
        if families is not None:
            if (
                not isinstance(families, list)
                or len(families) > 64
                or not all(isinstance(f, str) for f in families)
            ):
                raise ControlError("enable: hooks must be a list of family names")
            known = self.host.known_families()
            unknown = sorted(set(families) - set(known))
            if unknown:
                raise ControlError(f"enable: unknown hook families {unknown}; known: {known}")
        if self.attached_by is not None:
            if self.attached_by == peer_pid:
                assert self.ring_path is not None
                return {"ring": self.ring_path.name, "already": True}
            if not self._reader_stale():
                raise ControlError(f"attached by pid {self.attached_by}")
            self._disable(f"taken over from stale reader pid {self.attached_by}", "takeover")
        elif self.host.enabled:
            raise ControlError("the probe is already on in this process (PROBE_ENABLE=1)")
        ring = self.run_dir / f"ring-{self.pid}.shm"
        self.host.enable(ring, gpu_timing, families, sample_every)
        self.ring_path = ring
        self.attached_by = peer_pid
        st = self.stat(peer_pid) if peer_pid > 0 else None
        self.reader_start = st[1] if st is not None else None
        self.enabled_at_ns = self.clock_ns()
        self.deadline_ns = None if duration is None else self.enabled_at_ns + int(duration * 1e9)
        self._wake.set()
        _log().info("vllm-graph-probe: enabled by pid %d, ring %s", peer_pid, ring)
        return {"ring": ring.name}

    def cmd_disable(self, req: Mapping[str, Any], peer_pid: int) -> dict[str, Any]:
        if self.attached_by is None:
            return {"was_enabled": False}
        self._disable(f"disable from pid {peer_pid}", "disable")
        return {"was_enabled": True}

    def cmd_snapshot(self, req: Mapping[str, Any], peer_pid: int) -> dict[str, Any]:
        snap = self.host.snapshot()
        if snap is not None:
            return {"snapshot": snap, "complete": True}
        return {"snapshot": self.host.static(), "complete": False}

    # -- watchdog -------------------------------------------------------------------------

    def _reader_stale(self) -> bool:
        """The attached reader is gone, or silent too long for what it is doing: a running
        (or sleeping) reader may wait ``live_silence_s`` for a CPU, a stopped one or one
        whose state cannot be read (another namespace's pid) ``heartbeat_timeout_s``."""
        pid = self.attached_by
        if pid is None:
            return False
        st = self.stat(pid) if pid > 0 else None
        if pid > 0 and (
            not self.alive(pid)
            or (st is not None and self.reader_start is not None and st[1] != self.reader_start)
        ):
            return True  # gone (or its pid taken by another process)
        running = st is not None and st[0] not in ("T", "t", "Z", "X")
        limit = self.live_silence_ns if running else self.heartbeat_timeout_ns
        last = max(self.host.heartbeat_ns(), self.enabled_at_ns)
        return self.clock_ns() - last > limit

    def watchdog(self) -> bool:
        """Disable at the deadline, or if the attached reader is gone or silent; True when
        it did.

        Never raises: it runs on the control thread, which must outlive any fault here.
        """
        try:
            with self._lock:
                if self.attached_by is None:
                    return False
                if self.deadline_ns is not None and self.clock_ns() >= self.deadline_ns:
                    self._disable(f"deadline of reader pid {self.attached_by}", "deadline")
                    return True
                if not self._reader_stale():
                    return False
                self.watchdog_trips += 1
                self._disable(f"watchdog: reader pid {self.attached_by} gone or silent", "watchdog")
                return True
        except Exception as exc:
            _log().warning("probe control: watchdog failed: %r", exc)
            return False

    def _disable(self, why: str, reason: str) -> None:
        _log().info("vllm-graph-probe: disabled (%s)", why)
        try:
            self.host.disable()
        finally:
            self.last_off = {
                "reason": reason,
                "at_ns": self.clock_ns(),
                "deadline_ns": self.deadline_ns,
            }
            self.attached_by = None
            self.ring_path = None
            self.enabled_at_ns = 0
            self.deadline_ns = None


def _send(conn: socket.socket, obj: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(obj, default=str).encode() + b"\n")


# -- the plugin's entry ----------------------------------------------------------------------

SERVER: ControlServer | None = None


def start_server(environ: Mapping[str, str] | None = None) -> ControlServer | None:
    """Open this process's control socket (called by the plugin; at most once)."""
    global SERVER
    if SERVER is not None and SERVER.pid == os.getpid():
        return SERVER
    env = os.environ if environ is None else environ
    rdir = run_dir(env)
    sweep_dead_sockets(rdir)
    server = ControlServer(rdir, environ=env, role_hint=role_from((), stack_modules()))
    server.open()
    SERVER = server
    _close_at_exit_everywhere(server)
    return server


def sweep_dead_sockets(d: Path) -> int:
    """Remove control sockets in ``d`` whose process is gone (killed without cleanup)."""
    n = 0
    with contextlib.suppress(OSError):
        for p in d.iterdir():
            m = SOCK_RE.match(p.name)
            if m and not pid_alive(int(m.group(1))):
                with contextlib.suppress(OSError):
                    p.unlink()
                    n += 1
    return n


def _close_at_exit_everywhere(server: ControlServer) -> None:
    """Close (and remove the socket) when this process exits, however Python exits.

    ``atexit`` does not run in a ``multiprocessing`` child (vLLM's engine core and
    workers): it ends with ``os._exit`` after running multiprocessing's own finalizers,
    so the socket of a worker stopped by SIGTERM stayed behind. Both are registered;
    ``close`` is idempotent.
    """
    import multiprocessing.util

    atexit.register(_close_at_exit, server)
    multiprocessing.util.Finalize(None, _close_at_exit, args=(server,), exitpriority=10)


def _close_at_exit(server: ControlServer) -> None:
    if os.getpid() == server.pid:
        server.close()


def _after_fork_in_child() -> None:
    # the listening socket and its thread belong to the parent; never unlink its file
    global SERVER
    server, SERVER = SERVER, None
    if server is not None:
        server._stopped = True
        sock, server._sock = server._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = [
    "COMMANDS",
    "MAX_LINE",
    "ControlError",
    "ControlServer",
    "PeerRefused",
    "candidate_run_dirs",
    "check_peer",
    "peer_cred",
    "role_from",
    "run_dir",
    "socket_path",
    "start_server",
    "sweep_dead_sockets",
]
