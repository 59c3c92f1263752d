"""``latencykit.testing.RedisServer`` and the ``redis_server`` fixture: a real ``redis-server``
on 127.0.0.1, started, killed, restarted on its port, stopped without leftovers."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
import redis

from latencykit.testing import RedisServer, pytest_plugin
from latencykit.testing import _redis as redis_module

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A RedisServer made but not started (started by the test), closed after it."""
    if RedisServer.available() is None:
        pytest_plugin._skip_or_fail(redis_module.INSTALL_HINT)
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


def client(server: RedisServer) -> redis.Redis:
    # Short timeouts and no retries: a dead server must fail the call at once.
    return redis.Redis.from_url(
        server.url, socket_timeout=5.0, socket_connect_timeout=5.0, retry=None
    )


def process_gone(pid: int) -> bool:
    """No such process, not even a zombie: it exited and was reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_start_ping_and_url(server: RedisServer) -> None:
    assert not server.running
    assert server.pid is None
    assert server.start() is server
    assert server.running
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    with client(server) as c:
        assert c.ping() is True
        assert c.set("k", "v") is True
        assert c.get("k") == b"v"
        config = c.config_get("*")
    # What it promised: loopback only, protected, no persistence, its own directory.
    assert config["bind"] == "127.0.0.1"
    assert config["protected-mode"] == "yes"
    assert config["save"] == ""
    assert config["appendonly"] == "no"
    assert config["dir"] == os.path.realpath(str(server.directory))
    assert "Ready to accept connections" in server.log_tail()
    with pytest.raises(RuntimeError, match="already running"):
        server.start()


def test_kill_then_restart_on_the_same_port_loses_the_data(server: RedisServer) -> None:
    server.start()
    port, pid = server.port, server.pid
    assert pid is not None
    with client(server) as c:
        c.set("k", "v")
        server.kill()
        assert not server.running
        assert process_gone(pid)
        with pytest.raises(redis.ConnectionError):
            c.get("k")
        server.start()
        assert server.port == port
        assert server.pid != pid
        # The client reconnects to the new server, which starts empty: nothing was persisted.
        assert c.get("k") is None
        assert c.dbsize() == 0
    # Only the logs in its directory: no dump.rdb, no appendonly file.
    assert set(os.listdir(str(server.directory))) <= {"redis.log", "redis-server.out"}


def test_stop_leaves_no_process_and_no_files(server: RedisServer) -> None:
    server.start()
    pid = server.pid
    assert pid is not None
    with client(server) as c:
        c.set("k", "v")
    server.stop()
    assert not server.running
    assert server.pid is None
    assert process_gone(pid)
    # No dump.rdb or appendonly file: a graceful stop does not save either.
    assert set(os.listdir(str(server.directory))) <= {"redis.log", "redis-server.out"}
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", server.port), timeout=5.0),
    ):
        pass
    server.stop()  # twice is fine
    server.start()  # and it comes back on the same port, empty
    with client(server) as c:
        assert c.get("k") is None
    directory = server.directory
    assert directory is not None
    server.close()
    assert not os.path.exists(directory)
    server.close()  # twice is fine


def test_pause_freezes_then_resume_and_stop_a_paused_server(server: RedisServer) -> None:
    server.start()
    server.pause()
    assert server.paused
    with (
        redis.Redis.from_url(server.url, socket_timeout=0.3, retry=None) as c,
        pytest.raises(redis.TimeoutError),
    ):
        c.ping()
    server.resume()
    with client(server) as c:
        assert c.ping() is True
    server.pause()
    pid = server.pid
    assert pid is not None
    server.stop()  # SIGTERM + SIGCONT: a frozen server still stops promptly
    assert process_gone(pid)
    assert not server.paused


def test_context_manager() -> None:
    if RedisServer.available() is None:
        pytest_plugin._skip_or_fail(redis_module.INSTALL_HINT)
    with RedisServer() as server:
        pid, directory = server.pid, server.directory
        assert pid is not None
        assert directory is not None
        with client(server) as c:
            assert c.ping() is True
    assert process_gone(pid)
    assert not os.path.exists(directory)


def test_the_fixture(redis_server: RedisServer) -> None:
    assert redis_server.running
    with client(redis_server) as c:
        assert c.dbsize() == 0  # fresh for every test
        c.set("k", "v")
        assert c.get("k") == b"v"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # redis.asyncio runs on asyncio only
async def test_the_fixture_with_the_asyncio_client(redis_server: RedisServer) -> None:
    import redis.asyncio

    c = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5.0)
    try:
        assert await c.ping() is True
        assert await c.incr("n") == 1
    finally:
        await c.aclose()


def test_a_port_in_use_fails_with_the_log(server: RedisServer) -> None:
    server.start()
    second = RedisServer(port=server.port)
    with pytest.raises(RuntimeError) as info:
        second.start()
    message = str(info.value)
    directory = second.directory
    assert directory is not None
    second.close()
    assert not os.path.exists(directory)
    assert f"127.0.0.1:{server.port} failed to start" in message
    assert "Address already in use" in message  # the log's tail says why


def test_a_server_that_is_not_redis_fails_with_its_output(tmp_path: os.PathLike[str]) -> None:
    fake = os.path.join(tmp_path, "not-redis")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho 'this is not redis' >&2\nexit 3\n")
    os.chmod(fake, 0o755)
    server = RedisServer(executable=fake)
    try:
        with pytest.raises(RuntimeError, match="exited with status 3") as info:
            server.start()
        assert "this is not redis" in str(info.value)
        assert not server.running
    finally:
        server.close()


def test_a_missing_executable_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="'/nonexistent/redis-server' not found") as info:
        RedisServer(executable="/nonexistent/redis-server")
    assert "apt-get install redis-server" in str(info.value)


def test_available_looks_beyond_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(redis_module, "_FALLBACK_PATHS", ("/nonexistent/redis-server",))
    assert RedisServer.available() is None
    with pytest.raises(FileNotFoundError, match="apt-get install redis-server"):
        RedisServer()
    if os.access("/usr/bin/redis-server", os.X_OK):
        monkeypatch.setattr(redis_module, "_FALLBACK_PATHS", ("/usr/bin/redis-server",))
        assert RedisServer.available() == "/usr/bin/redis-server"


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [
        (None, pytest.skip.Exception),
        ("", pytest.skip.Exception),
        ("false", pytest.skip.Exception),
        ("true", pytest.fail.Exception),
        ("TRUE", pytest.fail.Exception),
        ("1", pytest.fail.Exception),
    ],
)
def test_missing_redis_skips_but_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str | None, outcome: type[BaseException]
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    # What the fixture does when redis-server is not installed.
    monkeypatch.setattr(RedisServer, "available", staticmethod(lambda: None))
    with pytest.raises(outcome, match=r"redis-server is not installed \(Debian: apt-get"):
        pytest_plugin._start_redis_server()
