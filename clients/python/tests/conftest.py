"""A real `agora serve` on a fresh Postgres database per test module, its four GPUs on two
simulated GPU hosts (`agora worker --gpu-backend simulated`, two GPUs each) that register over
HTTP and heartbeat as real hosts do.

AGORA_BIN (default target/debug/agora) and AGORA_TEST_POSTGRES (default
postgres://postgres@127.0.0.1:5432) override. Databases are named agora_test_py_*; each is
dropped when its module's tests end (`scripts/test` drops leftovers of a failed run).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agora_client import Client

ROOT = Path(__file__).resolve().parents[3]
BINARY = Path(os.environ.get("AGORA_BIN", ROOT / "target" / "debug" / "agora"))
POSTGRES = os.environ.get("AGORA_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432")
HOSTS = 2
GPUS_PER_HOST = 2
HOST_TOPOLOGY = f"""gpus = {GPUS_PER_HOST}
gpu_name = "NVIDIA A100-SXM4-80GB"
compute_capability = "8.0"
memory_gib = 80
default_ancestor = "node"
"""
# The service keeps time in whole milliseconds, truncated (services/agora-server/src/clock.rs):
# a moment it records reads up to this much before the instant it stands for.
SERVER_CLOCK_RESOLUTION = 0.001
DEFAULT_SETTINGS = {
    "lease_seconds": 60,
    "round_deadline_ms": 1_000,
    "revocation_grace_seconds": 30,
    "tick_ms": 20,
}


def within_lease(lease_start: float, lease_stop: float, started: float, stopped: float) -> bool:
    """Whether a run the client timed lies within a lease the server recorded. A run that ends
    in the lease's last millisecond may read a fraction of a millisecond past the recorded end
    (see `SERVER_CLOCK_RESOLUTION`); a recorded start can only read early, never late."""
    return lease_start <= started <= stopped <= lease_stop + SERVER_CLOCK_RESOLUTION


def psql(database: str, sql: str) -> str:
    result = subprocess.run(
        ["psql", f"{POSTGRES}/{database}", "-v", "ON_ERROR_STOP=1", "-Atqc", sql],
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout


def spawn(arguments: list[str], env: dict[str, str], stderr: int) -> subprocess.Popen:
    """`agora ARGUMENTS...` in the background, from the repository's root."""
    return subprocess.Popen(
        [str(BINARY), *arguments],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


class Server:
    """A running `agora serve`: its address, admin token and database."""

    def __init__(self, folder: Path, settings: dict[str, int]) -> None:
        self.database = f"agora_test_py_{os.getpid()}_{secrets.token_hex(4)}"
        self.admin_token = f"admin-{secrets.token_hex(16)}"
        worker_token = f"worker-{secrets.token_hex(16)}"
        config = folder / "agora.toml"
        lines = [
            'listen = "127.0.0.1:0"',
            f'database_url = "{POSTGRES}/{self.database}"',
            f'admin_token = "{self.admin_token}"',
            'gpus = "workers"',
            f'worker_token = "{worker_token}"',
            *(f"{name} = {value}" for name, value in {**DEFAULT_SETTINGS, **settings}.items()),
        ]
        config.write_text("\n".join(lines) + "\n")
        psql("postgres", f'CREATE DATABASE "{self.database}"')
        env = {**os.environ, "NO_COLOR": "1", "RUST_LOG": "info,sqlx=warn,actix_server=warn,agora::http=warn"}
        self.log: list[str] = []
        self._listening = threading.Event()
        self.url = ""
        self.process = spawn(["serve", "--config", str(config)], env, stderr=subprocess.PIPE)
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(60) or not self.url:
            self.stop()
            raise RuntimeError("agora serve did not start; its log:\n" + "".join(self.log))
        topology = folder / "host.toml"
        topology.write_text(HOST_TOPOLOGY)
        self.hosts = [self._start_host(topology, index, worker_token, env) for index in range(HOSTS)]
        self._wait_for_gpus(HOSTS * GPUS_PER_HOST)

    def _start_host(self, topology: Path, index: int, token: str, env: dict[str, str]) -> subprocess.Popen:
        arguments = ["worker", "--gpu-backend", "simulated", "--topology", str(topology)]
        arguments += ["--arbiter", self.url, "--token", token, "--host", f"host-{index}"]
        return spawn(arguments, env, stderr=subprocess.DEVNULL)

    def _wait_for_gpus(self, count: int) -> None:
        """Until the hosts' GPUs are all in the cluster (they register within a second)."""
        deadline = time.monotonic() + 60
        with self.client() as admin:
            while len(admin.cluster()) < count:
                if time.monotonic() > deadline or any(host.poll() is not None for host in self.hosts):
                    self.stop()
                    raise RuntimeError(f"the simulated hosts did not register {count} GPUs")
                time.sleep(0.1)

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)
            self.log.append(line)
            match = re.search(r"address=(\S+).*listening|listening.*address=(\S+)", line)
            if match and not self.url:
                self.url = "http://" + (match.group(1) or match.group(2))
                self._listening.set()
        self._listening.set()

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token or self.admin_token)

    def query(self, sql: str) -> list[dict]:
        """Rows of `sql` from the arbiter's database, as dicts."""
        text = psql(self.database, f"SELECT coalesce(json_agg(row_to_json(q)), '[]') FROM ({sql}) q")
        return json.loads(text)

    def stop(self) -> None:
        for host in getattr(self, "hosts", []):
            if host.poll() is None:
                host.terminate()
                host.wait(30)
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        psql("postgres", f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One arbiter per test module, with the module's `SERVER_SETTINGS` over the defaults."""
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: build it with `cargo build -p agora-cli` or set AGORA_BIN")
    settings = getattr(request.module, "SERVER_SETTINGS", {})
    running = Server(tmp_path_factory.mktemp("agora"), settings)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def admin(server: Server) -> Iterator[Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def tenant_token(admin: Client, request: pytest.FixtureRequest) -> str:
    """The token of a fresh tenant named after the test."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40] + "-" + secrets.token_hex(3)
    return admin.create_tenant(name).token


@pytest.fixture
def tenant(server: Server, tenant_token: str) -> Iterator[Client]:
    """A client of a fresh tenant; its apps are finished afterwards, so that their GPUs go to
    the next test's apps."""
    with server.client(tenant_token) as client:
        yield client
        for app in client.list_apps():
            if app.finished_at is None:
                client.finish_app(app.id)
