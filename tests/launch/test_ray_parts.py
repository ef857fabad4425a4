"""atropos-launch --ray without a cluster: the part host on its node, placements, the config and the flag."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from atroposlib.cli import launch as launch_cli
from atroposlib.errors import ConfigError
from atroposlib.launch.commands import trainer_command
from atroposlib.launch.config import Placement, load_config
from atroposlib.launch.part_host import LineBuffer, PartHost

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = str(REPO / "environments/arithmetic_server.py")


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_line_buffer_keeps_lines_until_read_and_holds_partial_lines_back():
    buffer = LineBuffer()
    buffer.write("[x] one\n[x] tw")
    assert buffer.read(0) == (1, ["[x] one"])
    buffer.write("o\n[x] three\n")
    assert buffer.read(1) == (3, ["[x] two", "[x] three"])
    assert buffer.read(3, wait=0.05) == (3, [])
    assert buffer._lines == []  # everything read was dropped
    assert buffer.read(1) == (3, [])  # a stale cursor gets nothing twice


def test_part_host_runs_the_part_on_its_node_and_serves_what_it_wrote(tmp_path):
    host = PartHost("trainer", "run-1", str(tmp_path / "node"))
    run_dir = tmp_path / "node" / "run-1"
    assert host.run_dir == run_dir.resolve() and (run_dir / "logs").is_dir()
    assert host.poll() is None and host.stop(1) is None  # nothing started yet
    payload = bytes(range(256)) * 1000
    script = ("import pathlib, sys; d = pathlib.Path(sys.argv[1]); (d / 'checkpoints/final').mkdir(parents=True); "
              "(d / 'checkpoints/final/model.bin').write_bytes(bytes(range(256)) * 1000); "
              "(d / 'summary.json').write_text('{}'); print('hello from the node'); print('bye')")
    host.start([sys.executable, "-c", script, str(run_dir)])
    lines, cursor, finished = [], 0, False
    deadline = time.monotonic() + 60
    while not finished:
        assert time.monotonic() < deadline
        cursor, new, finished = host.read_lines(cursor, 0.5)
        lines += new
    assert lines == ["[trainer] hello from the node", "[trainer] bye"]
    assert host.poll() == 0
    assert "hello from the node" in (run_dir / "logs" / "trainer.log").read_text()
    assert host.list_files("checkpoints/final") == [("checkpoints/final/model.bin", len(payload))]
    assert host.list_files("summary.json") == [("summary.json", 2)]
    assert host.list_files("plot.png") == []
    chunks = [host.read_file("checkpoints/final/model.bin", offset, 100_000) for offset in range(0, len(payload), 100_000)]
    assert b"".join(chunks) == payload
    for bad in ("../outside", "/etc/passwd", "logs/../../x"):
        with pytest.raises(ValueError, match="outside the run directory"):
            host.list_files(bad)
        with pytest.raises(ValueError, match="outside the run directory"):
            host.read_file(bad, 0, 10)


def test_part_host_stop_ends_the_whole_process_group(tmp_path):
    host = PartHost("env", "run", str(tmp_path))
    host.start([sys.executable, "-c", "import subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
                "print('up', flush=True); time.sleep(600)"])
    cursor, lines = 0, []
    while not lines:
        cursor, lines, _ = host.read_lines(cursor, 1.0)
    host.remember_descendants()
    child = next(iter(host._part._descendants.values()))
    assert host.stop(5) is not None
    assert not child.is_running() or child.status() == "zombie"


def test_placement_becomes_rays_actor_options():
    assert Placement().actor_options() == {"num_cpus": 1, "num_gpus": 0}
    placement = Placement(num_cpus=4, num_gpus=1, memory=2**30, resources={"node_b": 1},
                          labels={"zone": "a"}, runtime_env={"env_vars": {"B": "2"}, "pip": ["x"]})
    assert placement.actor_options({"env_vars": {"A": "1", "B": "1"}, "working_dir": "."}) == {
        "num_cpus": 4, "num_gpus": 1, "memory": 2**30, "resources": {"node_b": 1},
        "label_selector": {"zone": "a"},
        "runtime_env": {"env_vars": {"A": "1", "B": "2"}, "working_dir": ".", "pip": ["x"]}}


@pytest.mark.parametrize(("data", "match"), [
    ({"envs": [{"name": "a", "script": ENV_SCRIPT, "placement": {"num_cpu": 2}}]},
     r"envs\.0\.placement\.num_cpu: unknown key; did you mean envs\.0\.placement\.num_cpus"),
    ({"api": {"placement": {"num_gpus": -1}}, "envs": [{"name": "a", "script": ENV_SCRIPT}]},
     r"api\.placement\.num_gpus"),
    ({"trainer": {"placement": {"gpus": 1}}, "envs": [{"name": "a", "script": ENV_SCRIPT}]},
     r"trainer\.placement: gpus: Extra inputs"),
    ({"trainer": {"nnodes": 0}, "envs": [{"name": "a", "script": ENV_SCRIPT}]}, "trainer.nnodes must be"),
    ({"ray": {"adress": "x"}, "envs": [{"name": "a", "script": ENV_SCRIPT}]},
     r"ray\.adress: unknown key; did you mean ray\.address"),
])
def test_bad_ray_settings_name_the_key(tmp_path, data, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path, data))


def test_launcher_keys_are_not_passed_to_the_trainer(tmp_path):
    config = load_config(_write(tmp_path, {
        "trainer": {"lr": 1e-5, "nnodes": 2, "nproc_per_node": 2, "placement": {"num_gpus": 8}},
        "ray": {"address": "127.0.0.1:6379"},
        "envs": [{"name": "a", "script": ENV_SCRIPT, "placement": {"resources": {"env_node": 1}}}]}))
    assert config.trainer_settings == {"lr": 1e-5}
    assert config.trainer_placement.num_gpus == 8
    assert config.envs[0].placement.resources == {"env_node": 1}
    assert config.ray is not None and config.ray.address == "127.0.0.1:6379"


def test_ray_flag_sets_the_address_and_several_trainer_nodes_need_it(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(launch_cli.Launcher, "run", lambda self: seen.append(self.config) or 0)
    path = _write(tmp_path, {"trainer": {"nnodes": 2}, "envs": [{"name": "a", "script": ENV_SCRIPT}]})
    assert launch_cli.main([str(path)]) == 2
    assert "trainer.nnodes: 2 spreads the trainer over several nodes" in capsys.readouterr().err
    assert launch_cli.main([str(path), "--ray"]) == 0
    assert seen[-1].ray.address == "auto"
    assert launch_cli.main([str(path), "--ray", "10.0.0.1:6379", "--run-dir", str(tmp_path / "r")]) == 0
    assert seen[-1].ray.address == "10.0.0.1:6379"


def test_trainer_command_over_several_nodes_uses_a_static_rendezvous():
    assert trainer_command("m", 2, python="/py", nnodes=2, node_rank=1, master=("10.0.0.1", 29500)) == [
        "/py", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
        "--master-addr", "10.0.0.1", "--master-port", "29500", "-m", "m"]
    assert trainer_command("m", 1, python="/py") == ["/py", "-m", "m"]
    with pytest.raises(ValueError, match="master"):
        trainer_command("m", 1, nnodes=2)


def test_the_ray_quickstart_is_the_quickstart_placed_on_two_nodes():
    placed = load_config(REPO / "configs/quickstart-ray.yaml")
    plain = load_config(REPO / "configs/quickstart-cpu.yaml")
    assert placed.ray is not None and placed.ray.address == "auto"
    assert placed.trainer_settings == plain.trainer_settings
    assert [e.model_dump(exclude={"placement"}) for e in placed.envs] == [e.model_dump(exclude={"placement"}) for e in plain.envs]
    assert placed.api.placement.resources == placed.envs[0].placement.resources == {"node_a": 0.1}
    assert placed.trainer_placement.resources == {"node_b": 0.1}


@pytest.mark.timeout(120)  # without the reachability check ray.init retries for minutes
def test_an_unreachable_ray_head_fails_at_once_naming_the_address(tmp_path, capsys):
    pytest.importorskip("ray", reason="pip install 'atroposlib[ray]'")
    from atroposlib.launch.commands import free_port

    port = free_port()  # nothing listens there
    path = _write(tmp_path, {"run_dir": str(tmp_path / "run"),
                             "envs": [{"name": "a", "script": str(REPO / "tests/fixtures/idle_env.py")}]})
    assert launch_cli.main([str(path), "--ray", f"127.0.0.1:{port}"]) == 1
    out = capsys.readouterr().out
    assert f"nothing answers at 127.0.0.1:{port}" in out and "ray start --head" in out
    # a new run directory: the first launch claimed "run" (a directory is used by one run only)
    path = _write(tmp_path, {"run_dir": str(tmp_path / "run2"),
                             "envs": [{"name": "a", "script": str(REPO / "tests/fixtures/idle_env.py")}]})
    assert launch_cli.main([str(path), "--ray", "no-port-here"]) == 1
    assert "is not HOST:PORT, ray://HOST:PORT or auto" in capsys.readouterr().out


@pytest.mark.parametrize(("data", "match"), [
    ({"inference": [{"count": 2}, {"name": "inference.1"}]}, r"\['inference\.1'\] is used twice"),
    ({"inference": [{"name": "a"}]}, r"\['a'\] is used twice"),
    ({"inference": [{}], "trainer": {"vllm_url": "http://x:1/v1"}}, "keep one"),
    ({"inference": [{"placement": {"num_gpu": 1}}]},
     r"inference\.0\.placement\.num_gpu: unknown key; did you mean inference\.0\.placement\.num_gpus"),
])
def test_bad_inference_sections_name_the_problem(tmp_path, data, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path, {"envs": [{"name": "a", "script": ENV_SCRIPT}], **data}))


def test_envs_get_every_inference_node_with_the_key_in_a_private_file(tmp_path, monkeypatch):
    from atroposlib.launch.wiring import servers_yaml

    config = load_config(_write(tmp_path, {
        "run_dir": str(tmp_path / "run"), "trainer": {"served_model_name": "policy"},
        "inference": [{"count": 2}], "envs": [{"name": "a", "script": ENV_SCRIPT}]}))
    assert config.inference[0].names == ["inference.0", "inference.1"]
    monkeypatch.setenv("ATROPOS_API_KEY", "k3y")
    text = servers_yaml(config, ["http://h:1/v1", "http://h:2/v1"], "vllm")
    assert yaml.safe_load(text) == {"openai": [
        {"base_url": "http://h:1/v1", "model_name": "policy", "server_type": "vllm", "api_key": "k3y"},
        {"base_url": "http://h:2/v1", "model_name": "policy", "server_type": "vllm", "api_key": "k3y"}]}
    from atroposlib.launch.supervision import write_private_files

    write_private_files(tmp_path, {"a-servers.yaml": text})
    assert (tmp_path / "a-servers.yaml").stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="outside the run directory"):
        write_private_files(tmp_path / "run", {"../x": "y"})


def test_envs_get_every_server_a_trainer_vllm_url_lists_with_the_trainers_key(tmp_path, monkeypatch):
    from atroposlib.launch.wiring import env_servers, servers_yaml

    def launcher(vllm_url: str):  # the config a launcher with this trainer.vllm_url gets
        run_dir = tmp_path / f"run{vllm_url.count(',')}"
        return load_config(_write(tmp_path, {
            "run_dir": str(run_dir), "envs": [{"name": "a", "script": ENV_SCRIPT}],
            "trainer": {"vllm_url": vllm_url, "vllm_api_key": "tr41ner"}}))

    monkeypatch.setenv("ATROPOS_API_KEY", "other")
    one = launcher("http://h:1/v1")
    assert env_servers(one, []) == []  # one server: the envs get it as --openai.base_url
    two = launcher("http://h:1/v1, http://h:2/v1")
    assert env_servers(two, []) == ["http://h:1/v1", "http://h:2/v1"]
    servers = yaml.safe_load(servers_yaml(two, env_servers(two, []), "vllm"))["openai"]
    assert [(s["base_url"], s["api_key"]) for s in servers] == [("http://h:1/v1", "tr41ner"),
                                                                 ("http://h:2/v1", "tr41ner")]
