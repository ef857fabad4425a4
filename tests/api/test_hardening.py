"""Resource limits and web attacks: gzip bombs, slow clients, cross-site bodies, foreign Hosts,
and the API key kept out of the process list."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from pydantic import ValidationError

from atroposlib.api.middleware import INFLATE_STEP_BYTES, GzipInflater, HostGuard, gunzip
from atroposlib.api.settings import ApiSettings
from tests.fixtures.api_server import RunApi, start_run_api

from .conftest import make_app, make_group

JSON = {"Content-Type": "application/json"}


def zeros_gzip(mib: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(2**20)
    return b"".join([*(packer.compress(block) for _ in range(mib)), packer.flush()])


# ------------------------------------------------------------------ gzip bombs
def test_inflater_stops_as_soon_as_the_cap_is_passed() -> None:
    bomb = zeros_gzip(64)
    inflater = GzipInflater(limit=2**20)
    produced = 0
    with pytest.raises(OverflowError):
        for piece in inflater.feed(bomb):
            assert len(piece) <= INFLATE_STEP_BYTES
            produced += len(piece)
    # it never inflated more than the cap plus one step of the 64 MiB
    assert inflater.size <= 2**20 + INFLATE_STEP_BYTES
    assert produced <= 2**20


def test_inflater_streams_members_and_rejects_bad_or_truncated_data() -> None:
    data = b'{"a": 1}' * 1000
    packed = gzip.compress(data[:3000]) + gzip.compress(data[3000:])
    inflater = GzipInflater(limit=len(data))
    out = b"".join(piece for i in range(0, len(packed), 7) for piece in inflater.feed(packed[i:i + 7]))
    inflater.finish()
    assert out == data and inflater.size == len(data)
    assert gunzip(b"", 10) == b""
    with pytest.raises(ValueError):
        gunzip(gzip.compress(data)[:-10], 10**6)
    with pytest.raises(ValueError):
        gunzip(b"not gzip at all", 10**6)
    with pytest.raises(OverflowError):
        gunzip(gzip.compress(data), len(data) - 1)


# ------------------------------------------------------------------ JSON-only bodies
async def test_non_json_post_bodies_get_415() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        body = orjson.dumps(make_group(2))
        for content_type in ("text/plain", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x"):
            response = await c.post("/scored_data", content=body,
                                    headers={"Content-Type": content_type})
            assert response.status_code == 415, content_type
            detail = response.json()["detail"]
            assert "Content-Type: application/json" in detail and content_type in detail
        missing = await c.post("/scored_data", content=body)
        assert missing.status_code == 415 and "got 'none'" in missing.json()["detail"]
        assert (await c.get("/status")).json()["queue_size"] == 0  # nothing was injected
        ok = await c.post("/scored_data", content=body,
                          headers={"Content-Type": "Application/JSON; charset=utf-8"})
        assert ok.json() == {"status": "received"}
        assert (await c.post("/scored_data", json=make_group(2, seed=1))).status_code == 200
        # a body-less POST /reset_data from a script still works; a text/plain one does not
        assert (await c.post("/reset_data")).status_code == 200
        assert (await c.post("/reset_data", headers={"Content-Type": "text/plain"})).status_code == 415


# ------------------------------------------------------------------ Host header
def test_host_guard_matching() -> None:
    guard = HostGuard(lambda *a: None, ["localhost", "127.0.0.1", "::1", "node7", "*.lab.org"])
    for ok in ("localhost", "LOCALHOST:8000", "127.0.0.1:1234", "[::1]:80", "[::1]", "node7:9",
               "a.lab.org", "x.y.lab.org:80", "lab.org"):
        assert guard.allows(ok), ok
    for bad in ("evil.com", "evil.com:8000", "127.0.0.1.evil.com", "node7.evil.com", "[::2]:80",
                "[::1", "", "lab.org.evil.com"):
        assert not guard.allows(bad), bad
    assert HostGuard(lambda *a: None, ["*"]).allows("anything.example:1")


async def test_foreign_host_gets_400_naming_the_flag() -> None:
    app = make_app(allowed_hosts=["trainer-node"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost:8000") as c:
        assert (await c.get("/status")).status_code == 200
        assert (await c.get("/status", headers={"Host": "trainer-node:8000"})).status_code == 200
        response = await c.get("/status", headers={"Host": "rebind.attacker.example:8000"})
        assert response.status_code == 400
        assert "--allowed-hosts rebind.attacker.example" in response.json()["detail"]


def test_bound_host_and_hostname_are_allowed_by_default() -> None:
    names = ApiSettings(host="10.1.2.3").host_names()
    assert {"localhost", "127.0.0.1", "::1", "10.1.2.3", socket.gethostname()} <= set(names)
    assert "0.0.0.0" not in ApiSettings(host="0.0.0.0").host_names()


# ------------------------------------------------------------------ API key file
def test_api_key_file_settings(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  s3cret\n")
    assert ApiSettings(api_key_file=key_file).api_key_value() == "s3cret"
    with pytest.raises(ValidationError, match="not both"):
        ApiSettings(api_key="x", api_key_file=key_file)
    key_file.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        ApiSettings(api_key_file=key_file).api_key_value()
    with pytest.raises(ValueError, match="missing"):
        ApiSettings(api_key_file=tmp_path / "missing").api_key_value()


def test_api_key_file_over_http_keeps_the_key_out_of_the_process_list(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-secret-123\n")
    key_file.chmod(0o600)
    api = start_run_api("--api-key-file", str(key_file))
    try:
        assert httpx.get(api.url + "/status").status_code == 401
        good = httpx.get(api.url + "/status", headers={"Authorization": "Bearer file-secret-123"})
        assert good.status_code == 200
        cmdline = Path(f"/proc/{api.proc.pid}/cmdline").read_bytes()
        assert b"file-secret-123" not in cmdline and b"--api-key-file" in cmdline
    finally:
        assert api.stop() == 0


def test_api_key_file_errors_exit_2(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "atroposlib.cli.run_api", "--port", "0"]
    missing = subprocess.run([*run, "--api-key-file", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--api-key-file" in missing.stderr
    (tmp_path / "k").write_text("k")
    both = subprocess.run([*run, "--api-key", "x", "--api-key-file", str(tmp_path / "k")],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "not both" in both.stderr
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--api-key-file" in helped and "ATROPOS_API_KEY" in helped


# ------------------------------------------------------------------ live server: slow clients
@pytest.fixture(scope="module")
def strict_api() -> Iterator[RunApi]:
    api = start_run_api("--header-timeout-s", "1", "--timeout-keep-alive-s", "1",
                        "--max-header-bytes", "8192", "--max-decompressed-bytes", "1048576")
    yield api
    assert api.stop() == 0


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes the connection (True) or 20 s pass without that (False)."""
    sock.settimeout(20)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_idle_and_slow_header_connections_are_closed(strict_api: RunApi) -> None:
    idle = socket.create_connection(("127.0.0.1", strict_api.port))
    slow = socket.create_connection(("127.0.0.1", strict_api.port))
    with idle, slow:
        slow.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finish
        assert _closed_by_server(idle)
        assert _closed_by_server(slow)
    # a normal request on a kept-alive connection still works, twice
    with httpx.Client(base_url=strict_api.url) as client:
        assert client.get("/status").status_code == 200
        assert client.get("/status").status_code == 200


def test_oversized_headers_are_refused(strict_api: RunApi) -> None:
    with socket.create_connection(("127.0.0.1", strict_api.port)) as sock:
        sock.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
        sock.settimeout(20)
        assert sock.recv(100).startswith(b"HTTP/1.1 400")


def test_live_gzip_bomb_cross_site_post_and_foreign_host(strict_api: RunApi) -> None:
    bomb = httpx.post(strict_api.url + "/scored_data", content=zeros_gzip(64),
                      headers={**JSON, "Content-Encoding": "gzip"}, timeout=60)
    assert bomb.status_code == 413 and "--max-decompressed-bytes" in bomb.json()["detail"]
    # what a web page's fetch(..., {mode: "no-cors", body: JSON.stringify(group)}) sends
    page = httpx.post(strict_api.url + "/scored_data", content=orjson.dumps(make_group(2)),
                      headers={"Content-Type": "text/plain;charset=UTF-8",
                               "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert page.status_code == 415
    rebound = httpx.get(strict_api.url + "/status", headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and "--allowed-hosts evil.example" in rebound.json()["detail"]
    assert httpx.get(strict_api.url + "/status").json()["queue_size"] == 0
    assert httpx.get(f"http://localhost:{strict_api.port}/status").status_code == 200


def test_env_variable_documented_in_the_api_guide() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "trajectory-api.md").read_text()
    assert "--api-key-file" in guide and "ATROPOS_API_KEY" in guide
