"""A throwaway ``redis-server`` on 127.0.0.1 for tests: :class:`RedisServer`.

Standard library only (no redis client needed): readiness is checked by speaking RESP over a
plain socket, so importing ``latencykit.testing`` stays cheap.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import BinaryIO

HOST = "127.0.0.1"
INSTALL_HINT = "redis-server is not installed (Debian: apt-get install redis-server)"

# Debian puts the binary in /usr/bin; sbin covers other layouts and a PATH without it.
_FALLBACK_PATHS = ("/usr/bin/redis-server", "/usr/sbin/redis-server")
_LOG_NAME = "redis.log"  # what redis-server logs once its configuration is read
_OUTPUT_NAME = "redis-server.out"  # its stdout/stderr: configuration errors go there
_SHUTDOWN_WAIT = 1.0  # seconds stop() waits after SHUTDOWN NOSAVE before signalling
_PORT_ATTEMPTS = 5  # a free port picked for us may be taken by someone else before redis binds it


def _free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _read_reply(reader: BinaryIO) -> bytes:
    """One RESP reply, as the payload of its simple or bulk string."""
    head = reader.readline()
    if not head.endswith(b"\r\n"):
        raise ConnectionError("connection closed before a reply")
    if head[:1] == b"+":
        return head[1:-2]
    if head[:1] == b"$":
        size = int(head[1:-2])
        body = reader.read(size + 2)
        if len(body) < size + 2:
            raise ConnectionError("connection closed in the middle of a reply")
        return body[:size]
    raise ConnectionError(f"unexpected reply {head[:200]!r}")


def _serving_pid(port: int, timeout: float) -> int | None:
    """The pid of the Redis that answers PING on ``port``, or ``None`` if none answers yet."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            with sock.makefile("rb") as reader:
                if _read_reply(reader) != b"PONG":
                    return None
                info = _read_reply(reader)
    except (OSError, ValueError):  # refused, reset, timeout, garbage
        return None
    found = re.search(rb"^process_id:(\d+)", info, re.MULTILINE)
    return int(found.group(1)) if found else None


def _send(port: int, command: bytes) -> None:
    """Send one command and ignore what happens (best effort, bounded by a short timeout)."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(command)
            sock.recv(256)  # an error reply, or b"" when the server exits
    except OSError:
        pass


def _kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    """Last resort (garbage collection, interpreter exit): no orphan redis-server."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class RedisServer:
    """A ``redis-server`` child process on a free port of 127.0.0.1, in a temporary directory.

    It runs with no persistence (``--save ""``, ``--appendonly no``), ``--bind 127.0.0.1``,
    ``--protected-mode yes``, its working directory (``--dir``) in a fresh temporary directory
    and its log in ``redis.log`` there. It listens on 127.0.0.1 only, never on another address.
    Nothing it stores survives :meth:`stop` or :meth:`kill`.

    >>> with RedisServer() as server:  # doctest: +SKIP
    ...     client = redis.Redis.from_url(server.url)  # "redis://127.0.0.1:<port>/0"

    Args:
        executable: the ``redis-server`` binary, a path or a name looked up on ``PATH``.
            Default ``None``: :meth:`available` (``PATH``, then ``/usr/bin`` and ``/usr/sbin``).
        port: the TCP port. Default ``None``: a free port chosen by the kernel when the
            object is made (another one is tried if it is taken before Redis binds it).
        startup_timeout: seconds :meth:`start` waits for the server to answer PING.
            Default ``10.0``.

    Raises:
        FileNotFoundError: no such executable (the message says how to install Redis).
    """

    def __init__(
        self,
        executable: str | None = None,
        port: int | None = None,
        *,
        startup_timeout: float = 10.0,
    ) -> None:
        if executable is None:
            found = self.available()
            if found is None:
                raise FileNotFoundError(f"{INSTALL_HINT}; or pass executable=")
        else:
            found = shutil.which(executable)
            if found is None:
                raise FileNotFoundError(
                    f"redis-server executable {executable!r} not found or not executable "
                    f"({INSTALL_HINT})"
                )
        self._executable = found
        self._port_given = port is not None
        self._port = port if port is not None else _free_port()
        self._startup_timeout = startup_timeout
        self._dir: str | None = None
        self._started = False  # once started, the port is kept for restarts
        self._paused = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], RedisServer] | None = None
        self._dir_finalizer: weakref.finalize[..., RedisServer] | None = None

    @staticmethod
    def available() -> str | None:
        """The path of ``redis-server``: on ``PATH``, else ``/usr/bin`` or ``/usr/sbin``.
        ``None`` if it is not installed."""
        found = shutil.which("redis-server")
        if found is not None:
            return found
        for path in _FALLBACK_PATHS:
            if os.access(path, os.X_OK):
                return path
        return None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING. Returns ``self``.

        After :meth:`stop` or :meth:`kill` it starts a fresh, empty server on the **same port**
        (the first start may move to another free port if the one picked was taken meanwhile,
        unless the port was given).

        Raises:
            RuntimeError: already running, or the server exited or did not answer PING within
                ``startup_timeout`` (the message ends with the tail of its log).
        """
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="latencykit-redis-")
            # Removed by close(), or when this object is garbage (a failed start, a forgotten
            # close) or at interpreter exit.
            self._dir_finalizer = weakref.finalize(
                self, shutil.rmtree, self._dir, ignore_errors=True
            )
        attempts = 1 if self._port_given or self._started else _PORT_ATTEMPTS
        for attempt in range(attempts):
            try:
                self._launch()
                self._started = True
                return self
            except _PortTaken:
                if attempt == attempts - 1:
                    raise RuntimeError(self._failure("its port was taken")) from None
                self._port = _free_port()
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server and return once the process is gone. Safe to call when not running.

        It asks with ``SHUTDOWN NOSAVE`` first (a few milliseconds; a SIGTERM is handled on
        Redis's next 100 ms tick), then sends SIGTERM, and SIGKILL if the process is still
        there ``timeout`` seconds (default ``5.0``) later. A paused server (:meth:`pause`) gets
        SIGTERM and SIGCONT at once.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._reap()
            return
        if not self._paused:
            _send(self._port, b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(_SHUTDOWN_WAIT)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._reap()

    def pause(self) -> None:
        """Freeze the server with SIGSTOP, for "Redis hangs" tests: connections still open
        (the kernel accepts them) but nothing is answered until :meth:`resume`."""
        if not self.running or self._proc is None:
            raise RuntimeError(f"{self!r} is not running")
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Undo :meth:`pause` with SIGCONT. Safe to call when not paused."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash would, and wait for the process to be gone.
        Safe to call when not running."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._reap()

    def close(self) -> None:
        """:meth:`stop` the server and remove its temporary directory. Safe to call twice;
        a later :meth:`start` makes a new directory."""
        self.stop()
        if self._dir_finalizer is not None:
            self._dir_finalizer()  # removes the directory, once
            self._dir_finalizer = None
        self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1 (known before :meth:`start`)."""
        return self._port

    @property
    def host(self) -> str:
        """Always ``"127.0.0.1"``."""
        return HOST

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, for ``redis.Redis.from_url`` and friends."""
        return f"redis://{HOST}:{self._port}/0"

    @property
    def running(self) -> bool:
        """Whether the server process is alive (it may have died on its own)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """Whether the server is frozen by :meth:`pause`."""
        return self._paused

    @property
    def pid(self) -> int | None:
        """The process id of the running server, ``None`` when not running."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def directory(self) -> str | None:
        """The temporary working directory (with ``redis.log``), ``None`` after :meth:`close`."""
        return self._dir

    @property
    def executable(self) -> str:
        """The path of the ``redis-server`` binary used."""
        return self._executable

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines (default ``20``) of the server's output and log."""
        if self._dir is None:
            return ""
        text = []
        for name in (_OUTPUT_NAME, _LOG_NAME):
            try:
                with open(os.path.join(self._dir, name), errors="replace") as f:
                    text.extend(f.read().splitlines())
            except FileNotFoundError:
                pass
        return "\n".join(text[-lines:])

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "not running"
        return f"<RedisServer {HOST}:{self._port} {state}>"

    # ------------------------------------------------------------------ internals

    def _launch(self) -> None:
        assert self._dir is not None
        log = os.path.join(self._dir, _LOG_NAME)
        # A fresh log per start, so that a failure shows this start's reason.
        for name in (_LOG_NAME, _OUTPUT_NAME):
            with open(os.path.join(self._dir, name), "wb"):
                pass
        args = [
            self._executable,
            "--port", str(self._port),
            "--bind", HOST,
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir,
            "--logfile", log,
            "--daemonize", "no",
        ]  # fmt: skip
        with open(os.path.join(self._dir, _OUTPUT_NAME), "ab") as out:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _kill_quietly, proc)
        deadline = time.monotonic() + self._startup_timeout
        delay = 0.002
        while True:
            if proc.poll() is not None:
                taken = "Address already in use" in self.log_tail(50)
                self._reap()
                if taken:
                    raise _PortTaken
                raise RuntimeError(self._failure(f"it exited with status {proc.returncode}"))
            # Our own pid in INFO: a PONG from whatever else took the port does not count.
            if _serving_pid(self._port, timeout=1.0) == proc.pid:
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    self._failure(f"it did not answer PING within {self._startup_timeout} s")
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _reap(self) -> None:
        self._paused = False
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._proc = None

    def _failure(self, why: str) -> str:
        return (
            f"redis-server ({self._executable}) on {HOST}:{self._port} failed to start: {why}. "
            f"Its output and log ({self._dir}):\n{self.log_tail()}"
        )


class _PortTaken(Exception):
    """redis-server could not bind its port: someone else has it."""
