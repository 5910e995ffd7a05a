"""Real Redis and Memcached servers for the tests: started on free loopback ports in temporary
folders, waited for with bounded retries, and stopped (terminate, wait, kill) when done.

Nothing here is mocked: the network backends are tested against the Debian programs
``redis-server``, ``redis-cli`` and ``memcached``. A missing program skips the tests that need it
with a message saying how to install it, or fails them when ``CI`` is set (there the README's test
command, ``./scripts/test.sh``, installs the servers, so a missing one is a broken set-up).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

INSTALL_HINT = "apt-get install redis-server redis-tools memcached"
READY_TIMEOUT = 10.0
START_ATTEMPTS = 3  # a free port can be taken between finding it and binding it: try again
STOP_TIMEOUT = 5.0
_FAILURES = (b"BUSY", b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")


def require(program: str) -> str:
    """The path of ``program``, or skip (fail under CI) the test that needs it."""
    path = shutil.which(program)
    if path is not None:
        return path
    if os.environ.get("CI"):
        pytest.fail(
            f"{program} is not installed, but CI is set: the README's test command "
            f"(./scripts/test.sh) installs it ({INSTALL_HINT})",
            pytrace=False,
        )
    pytest.skip(f"{program} is not installed; install it with: {INSTALL_HINT}")


def require_module(name: str, extra: str) -> Any:
    """Import the Python client ``name``, or skip (fail under CI) the test that needs it."""
    try:
        return __import__(name)
    except ImportError:
        message = f"the Python package {name} is missing: pip install 'arrowstash[{extra}]'"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_closed() -> int:
    """A loopback port nothing listens on (found free, and left unbound)."""
    return free_port()


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGCONT)  # a paused server handles SIGTERM only once resumed
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT)


def _wait(check: Any, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    """Call ``check()`` until it returns true; raise if the process dies or time runs out."""
    deadline = time.monotonic() + READY_TIMEOUT
    delay = 0.01
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {_tail(log)}")
        try:
            if check():
                return
        except Exception as exc:  # refused, reset, or a client error: not ready yet
            last = exc
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    raise RuntimeError(f"{what} not ready after {READY_TIMEOUT} s ({last!r}): {_tail(log)}")


def _tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-2000:]
    return "(no log)"


def _serves(proc: subprocess.Popen[bytes], port: int, request: bytes, marker: bytes) -> bool:
    """Whether the server answering on ``port`` is ``proc`` (by the process id it reports).

    Several test sessions share this machine: between finding a free port and our server
    binding it, another session's server may take it; ours then exits, but a mere ping would
    have been answered by theirs, and the test would go on against (and fail to pause) a server
    that is not its own."""
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
        sock.sendall(request)
        data = b""
        while True:
            at = data.find(marker)
            end = data.find(b"\r\n", at) if at >= 0 else -1
            if end >= 0:
                return int(data[at + len(marker) : end]) == proc.pid
            chunk = sock.recv(65536)
            if not chunk:
                return False
            data += chunk


class RedisServer:
    """One ``redis-server`` without persistence. ``port`` is kept across :meth:`restart`."""

    def __init__(self, directory: Path, *, unixsocket: Path | None = None,
                 cluster: bool = False) -> None:
        self.program = require("redis-server")
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.unixsocket = unixsocket
        self.cluster = cluster
        self.port = 0 if unixsocket is not None else free_port()
        self.bus_port = free_port() if cluster else 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = directory / "redis.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        if self.unixsocket is not None:
            return f"unix://{self.unixsocket}"
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        command = [self.program, "--save", "", "--appendonly", "no", "--port", str(self.port),
                   "--bind", "127.0.0.1", "--dir", str(self.directory), "--logfile",
                   str(self.log)]
        if self.unixsocket is not None:
            command += ["--unixsocket", str(self.unixsocket), "--unixsocketperm", "700"]
        if self.cluster:
            command += ["--cluster-enabled", "yes", "--cluster-config-file",
                        str(self.directory / "nodes.conf"), "--cluster-port",
                        str(self.bus_port), "--cluster-node-timeout", "2000"]
        return command

    def _ready(self) -> bool:
        if self.unixsocket is None:
            assert self.proc is not None
            return _serves(self.proc, self.port, b"INFO server\r\n", b"process_id:")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(str(self.unixsocket))
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")

    def start(self, *, same_port: bool = False) -> RedisServer:
        for attempt in range(START_ATTEMPTS):
            self.proc = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            try:
                _wait(self._ready, self.proc, f"redis-server {self.url}", self.log)
                return self
            except RuntimeError:
                _stop(self.proc)
                if same_port or self.unixsocket is not None or attempt == START_ATTEMPTS - 1:
                    raise
                self.port = free_port()
                if self.cluster:
                    self.bus_port = free_port()
        raise AssertionError("unreachable")

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed one does (no goodbye to its clients)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)

    def pause(self) -> None:
        """SIGSTOP: the server hangs (connections are accepted by the kernel, never answered)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start again on the same port (and socket) after :meth:`kill` or :meth:`stop`."""
        _stop(self.proc)
        self.start(same_port=True)

    def stop(self) -> None:
        _stop(self.proc)

    def cli(self, *args: str) -> str:
        """Run ``redis-cli`` against this server; its output."""
        target = (["-s", str(self.unixsocket)] if self.unixsocket is not None
                  else ["-h", "127.0.0.1", "-p", str(self.port)])
        done = subprocess.run([require("redis-cli"), *target, *args], capture_output=True,
                              text=True, timeout=30, check=True)
        return done.stdout


class RedisClusterServers:
    """Three cluster-enabled masters joined by ``redis-cli --cluster create``."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        require("redis-cli")
        self.nodes = [RedisServer(directory / f"node{i}", cluster=True) for i in range(masters)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(node.address for node in self.nodes)

    def start(self) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                [require("redis-cli"), "--cluster", "create",
                 *(node.address for node in self.nodes),
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=True,
            )
            for node in self.nodes:
                assert node.proc is not None
                _wait(lambda node=node: "cluster_state:ok" in node.cli("cluster", "info"),
                      node.proc, f"cluster node {node.address}", node.log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class MemcachedServer:
    """One ``memcached`` on loopback TCP (UDP off)."""

    def __init__(self, directory: Path, memory_mb: int = 256) -> None:
        self.program = require("memcached")
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.memory_mb = memory_mb
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = directory / "memcached.log"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"memcached://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        assert self.proc is not None
        return _serves(self.proc, self.port, b"stats\r\n", b"STAT pid ")

    def start(self, *, same_port: bool = False) -> MemcachedServer:
        for attempt in range(START_ATTEMPTS):
            command = [self.program, "-l", "127.0.0.1", "-p", str(self.port), "-U", "0",
                       "-m", str(self.memory_mb)]
            if os.geteuid() == 0:
                command += ["-u", "root"]  # memcached refuses to run as root without it
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             cwd=self.directory)
            try:
                _wait(self._ready, self.proc, f"memcached {self.url}", self.log)
                return self
            except RuntimeError:
                _stop(self.proc)
                if same_port or attempt == START_ATTEMPTS - 1:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        _stop(self.proc)
        self.start(same_port=True)

    def stop(self) -> None:
        _stop(self.proc)

    def command(self, line: str, end: bytes = b"\r\n") -> bytes:
        """Send one text-protocol command over a fresh socket; the reply up to ``end``."""
        with socket.create_connection(self.address, timeout=5.0) as sock:
            sock.sendall(line.encode() + b"\r\n")
            data = b""
            while not data.endswith(end):
                if data.startswith(_FAILURES) and data.endswith(b"\r\n"):
                    break  # a one-line refusal instead of the reply
                more = sock.recv(1 << 16)
                if not more:
                    raise ConnectionError(f"memcached closed the connection after {data!r}")
                data += more
        return data

    def stats(self) -> dict[str, str]:
        """The server's ``stats`` counters."""
        stats = {}
        for line in self.command("stats", b"END\r\n").decode().splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0] == "STAT":
                stats[parts[1]] = parts[2]
        return stats

    def keys(self, prefix: str = "", counters: bool = False) -> list[str]:
        """Every live key starting with ``prefix`` (``lru_crawler metadump``: memcached's SCAN),
        without arrowstash's generation counters (``<prefix>:g:...``) unless ``counters``."""
        for _ in range(100):  # the background LRU crawler may be busy: bounded retries
            dump = self.command("lru_crawler metadump all", b"END\r\n").decode()
            if not dump.startswith("BUSY"):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError(f"memcached crawler stayed busy: {dump!r}")
        if not dump.endswith("END\r\n"):
            raise RuntimeError(f"lru_crawler metadump failed: {dump!r}")
        names = []
        for line in dump.splitlines():
            if line.startswith("key="):
                name = unquote(line.split(" ", 1)[0][4:])
                if name.startswith(prefix) and (counters or ":g:" not in name):
                    names.append(name)
        return names

    def ttl(self, key: str) -> int | None:
        """Seconds ``key`` has left (-1: no expiry), None if it is absent (meta get ``t``)."""
        reply = self.command(f"mg {key} t").decode().split()
        if not reply or reply[0] != "HD":
            return None
        flag = next(f for f in reply[1:] if f.startswith("t"))
        return int(flag[1:])


class S3Server:
    """moto's S3-compatible server (``ThreadedMotoServer``) on a loopback port, with one bucket.

    It runs in this process's threads; :meth:`stop` and :meth:`restart` (same port, and a fresh,
    empty state, as moto keeps objects in memory) let tests cut the store off mid-run."""

    BUCKET = "arrowstash-test"
    REGION = "us-east-1"
    KEY_ID, SECRET = "test-key-id", "test-secret-key"

    def __init__(self) -> None:
        require_module("obstore", "s3")
        require_module("moto", "s3")
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.port = 0
        self.server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, prefix: str) -> str:
        return f"s3://{self.BUCKET}/{prefix}?endpoint={self.endpoint}&region={self.REGION}"

    @property
    def credentials(self) -> dict[str, str]:
        return {"access_key_id": self.KEY_ID, "secret_access_key": self.SECRET}

    @property
    def environment(self) -> dict[str, str]:
        """The standard variables that give these credentials to any S3 client."""
        return {"AWS_ACCESS_KEY_ID": self.KEY_ID, "AWS_SECRET_ACCESS_KEY": self.SECRET,
                "AWS_DEFAULT_REGION": self.REGION, "AWS_REGION": self.REGION}

    def start(self) -> S3Server:
        from moto.server import ThreadedMotoServer

        for attempt in range(START_ATTEMPTS):
            self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
            try:
                self.server.start()
                break
            except OSError:
                if attempt == START_ATTEMPTS - 1:
                    raise
        self.port = self.server.get_host_and_port()[1]
        self._make_bucket()
        return self

    def _make_bucket(self) -> None:
        import urllib.request

        # an anonymous PUT of the bucket: moto's server does not check signatures
        request = urllib.request.Request(f"{self.endpoint}/{self.BUCKET}", method="PUT")
        with urllib.request.urlopen(request, timeout=READY_TIMEOUT) as reply:
            assert reply.status == 200

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()
