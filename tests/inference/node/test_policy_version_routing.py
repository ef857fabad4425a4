"""Env side of honest policy versions: groups carry the version that served them; lagging nodes are routed around.

Real ``VLLMServer`` clients and the real ``ServerManager`` talk over HTTP to nodes (the node
middleware and routes under uvicorn, around the stand-in engine of ``conftest.py``).
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import numpy as np
import pytest

from atroposlib.env_runtime.delivery import write_groups
from atroposlib.envs.run_state import ROLLOUT_POLICY_VERSION, RunState
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.inference.clients.manager import ServerManager
from atroposlib.inference.policy_version import (
    collect_served_versions,
    oldest_served_version,
    record_served_version,
)
from tests.fixtures.app_thread import AppThread
from tests.inference.node.conftest import FakeServer, push_body


def push(server: FakeServer, version: int) -> None:
    body, headers = push_body({"model.layers.1.w": np.full((2, 3), float(version), np.float32)})
    answer = httpx.put(f"{server.thread.url}/atropos/weights?version={version}", content=body,
                       headers=headers)
    assert answer.status_code == 200, answer.text


@pytest.fixture
def nodes(tmp_path):
    servers = []
    for i in range(2):
        (tmp_path / f"n{i}").mkdir()
        server = FakeServer(tmp_path / f"n{i}")
        server.thread = AppThread(server.app)
        servers.append(server)
    yield servers
    for server in servers:
        server.thread.stop()


def manager_for(servers) -> ServerManager:
    from tests.inference.node.conftest import KEY

    return ServerManager([APIServerConfig(model_name="m", base_url=f"{s.thread.url}/v1", api_key=KEY,
                                          server_type="vllm", timeout=30) for s in servers])


async def test_a_rollout_records_the_version_that_served_it(nodes):
    push(nodes[0], 4)
    push(nodes[1], 4)
    manager = manager_for(nodes)
    try:
        collect_served_versions()
        await manager.completion(prompt="1 + 1 =", max_tokens=1)
        assert oldest_served_version() == 4
    finally:
        await manager.aclose()


async def test_a_group_carries_the_oldest_version_among_its_rollouts():
    class Outbox:
        def __init__(self):
            self.groups = []

        async def write(self, group, item):
            self.groups.append(group)

    state = RunState(curr_step=9)
    state.outbox = Outbox()
    ROLLOUT_POLICY_VERSION.set(8)
    collect_served_versions()
    for version in (7, 5, 7):  # one rollout of the group came from a node that lagged
        record_served_version(version)
    await write_groups(state, [{"scores": [1.0]}], item=None, send_to_api=True)
    collect_served_versions()  # no node reported a version: the step the rollout started at
    await write_groups(state, [{"scores": [0.0]}], item=None, send_to_api=True)
    assert [g["policy_version"] for g in state.outbox.groups] == [5, 8]


async def test_a_node_behind_the_others_or_without_weights_is_routed_around_until_it_catches_up(nodes, caplog):
    caplog.set_level(logging.INFO, logger="atroposlib.inference.clients.manager")
    fresh, lagging = nodes
    push(fresh, 2)
    push(lagging, 1)  # missed the sync to version 2
    manager = manager_for(nodes)
    try:
        for server in manager.servers:
            assert await server.check_health()
        for _ in range(4):
            await manager.completion(prompt="x", max_tokens=1)
        assert (fresh.started, lagging.started) == (4, 0)
        assert "serves policy version 1 while others serve 2: routing around it" in caplog.text

        push(lagging, 2)  # the trainer re-sent it the current weights
        for _ in range(100):  # the manager re-probes the node it routes around, about every second
            await manager.completion(prompt="x", max_tokens=1)
            if "serves policy version 2 again: routing to it" in caplog.text:
                break
            await asyncio.sleep(0.1)
        assert "serves policy version 2 again: routing to it" in caplog.text
        assert manager._current(manager.servers) == manager.servers
    finally:
        await manager.aclose()


async def test_a_node_awaiting_weights_is_unhealthy(nodes):
    push(nodes[0], 3)
    manager = manager_for(nodes)
    try:
        healthy = [await server.check_health() for server in manager.servers]
    finally:
        await manager.aclose()
    assert healthy == [True, False]  # the second one restarted and awaits the trainer's push


async def test_a_dead_node_is_routed_around_though_no_request_went_to_the_other_one_yet(nodes):
    for node in nodes:
        push(node, 1)
    manager = manager_for(nodes)  # requests wait up to 30 s for a server's health
    try:
        await manager.completion(prompt="x", max_tokens=1)
        assert (nodes[0].started, nodes[1].started) == (1, 0)  # equal slots: the first one
        nodes[0].thread.stop()  # it dies
        begin = asyncio.get_running_loop().time()
        served = failed = 0
        while served < 3:
            assert asyncio.get_running_loop().time() - begin < 20, (served, failed)
            try:  # a request that was on its way to the dead node fails; the env re-queues it
                await asyncio.wait_for(manager.completion(prompt="x", max_tokens=1), 10)
                served += 1
            except Exception:  # noqa: BLE001 - counted: at most the first one
                failed += 1
        assert failed <= 1 and nodes[1].started == 3
    finally:
        await manager.aclose()
