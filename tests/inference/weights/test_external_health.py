"""Stock vLLM servers' health, as the trainer probes it: wait at start, then one probe at a time."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from atroposlib.errors import InferenceError
from atroposlib.inference.weights.external_vllm import ExternalVLLM


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(self.server.status if self.path == "/health" else 404)  # type: ignore[attr-defined]
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    httpd.status = 200  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_healthy_server_is_waited_for_and_then_reported_healthy(server, tmp_path):
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    target = ExternalVLLM([url], tmp_path)
    assert target.wait_healthy(10, fix="unused") < 10
    assert target.unhealthy() is None
    server.status = 503
    assert target.unhealthy() == f"{url.removesuffix('/v1')}/health answered 503"


def test_a_server_that_never_answers_fails_the_wait_with_the_fix(server, tmp_path):
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    target = ExternalVLLM([f"http://127.0.0.1:{port}/v1"], tmp_path)
    assert target.unhealthy().startswith(f"http://127.0.0.1:{port}/health did not answer (ConnectError")
    with pytest.raises(InferenceError, match=rf"no vLLM answers http://127.0.0.1:{port}/health after 1s; start it"):
        target.wait_healthy(1, fix="start it")
