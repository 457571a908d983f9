"""A private `redis-server` for a while: on a free local port, in a folder of its own, with a password, nothing saved
to disk. For `fullgraph bench fleet` and the tests; a deployment runs its own Redis (docs/deploy.md)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fullgraph.deploy._common import DeployError
from fullgraph.deploy.remote import import_redis

START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RedisServer:
    url: str  # redis://127.0.0.1:PORT/0, no password in it
    password: str
    pid: int
    port: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing() -> str | None:
    """Why a server cannot be started here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    try:
        import_redis()
    except DeployError as e:
        return str(e)
    return None


@contextmanager
def redis_server(folder: str | None = None, password: str | None = None) -> Iterator[RedisServer]:
    """Start redis-server with `--requirepass`, no snapshots and no append-only file, wait until it answers, and
    stop it on leaving the block."""
    if why := missing():
        raise DeployError(why)
    password = password or secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="fullgraph-redis-", dir=folder) as work:
        port = free_port()
        argv = [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                "--requirepass", password, "--save", "", "--appendonly", "no", "--dir", work]  # fmt: skip
        with open(os.path.join(work, "redis.log"), "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            server = RedisServer(f"redis://127.0.0.1:{port}/0", password, proc.pid, port)
            _wait(server, proc, work)
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(server: RedisServer, proc: subprocess.Popen, work: str) -> None:
    redis = import_redis()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            with open(os.path.join(work, "redis.log"), encoding="utf-8", errors="replace") as f:
                tail = f.read()[-400:].strip()
            raise DeployError(f"redis-server exited with status {proc.returncode}: {tail}")
        try:
            with redis.Redis(port=server.port, password=server.password, socket_timeout=1) as c:
                c.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise DeployError(
                    f"redis-server did not answer on port {server.port} in {START_TIMEOUT_S:g} s"
                ) from None
            time.sleep(0.05)
