"""``atropos-launch CONFIG --ray ADDRESS``: every part of the run as a Ray actor on a Ray cluster.

Each part (run-api, each inference node, each trainer node, each environment) is one
:class:`~atroposlib.launch.part_host.PartHost` actor. Ray's scheduler places it by the
resources the part's ``placement`` asks for (``num_cpus``, ``num_gpus``, ``memory``, custom
``resources``, node ``labels``); a trainer over several nodes is one placement group with one
bundle per node (``STRICT_SPREAD``: all nodes at once, each on a different node). The actor
starts the part's command on its node, in a run directory of that node, and the launcher:

* streams its output lines back (long-polling the actor) to the console with the same ``[part]``
  prefixes as a local run, and into ``<run_dir>/logs/<part>.log`` on the launching host;
* polls it, so a part that exits (or whose node is lost) stops the run as locally;
* copies the trainer's run files back through Ray's object store when it ends (chunks of
  :data:`CHUNK_BYTES`), so no filesystem is shared between the nodes and the launching host.

Ray is an optional dependency (``pip install 'atroposlib[ray]'``); this module is imported only
for a ``--ray`` run.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, TextIO

from atroposlib.api.settings import API_KEY_ENV
from atroposlib.launch.config import Placement, RaySection
from atroposlib.launch.part_host import PartHost
from atroposlib.launch.supervision import Backend, LaunchError, Site

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ModuleNotFoundError(f"atropos-launch --ray needs Ray ({exc}): pip install 'atroposlib[ray]'",
                              name="ray") from exc

#: Bytes of a file fetched per actor call when copying run files back.
CHUNK_BYTES = 32 * 1024 * 1024
#: Seconds a quick question to a part's actor (its port, its exit code) may take.
CALL_TIMEOUT = 60.0

_PartHostActor = ray.remote(max_concurrency=4)(PartHost)


class RayPart:
    """A part running in a :class:`PartHost` actor, watched from the launching host."""

    def __init__(self, name: str, actor: Any, log_dir: Path, console: TextIO, lock: threading.Lock):
        """Start streaming the part's output (it was just started on the actor).

        Args:
            name: the part's name (the ``[name]`` prefix its lines carry).
            actor: the part's :class:`PartHost` actor handle.
            log_dir: the launching host's ``<run_dir>/logs``; ``<name>.log`` gets a copy.
            console: where the prefixed lines go.
            lock: serialises console lines from all parts.
        """
        self.name = name
        self._actor = actor
        self._log_path = log_dir / f"{name}.log"
        self._lost: str | None = None
        self._code: int | None = None
        self._closing = threading.Event()
        self._pump_thread = threading.Thread(target=self._pump, args=(console, lock), daemon=True,
                                             name=f"ray-log-{name}")
        self._pump_thread.start()

    @property
    def log_path(self) -> Path:
        """The copy of the part's log on the launching host."""
        return self._log_path

    def _pump(self, console: TextIO, lock: threading.Lock) -> None:
        prefix = f"[{self.name}] "
        cursor = 0
        with open(self._log_path, "a", encoding="utf-8") as log:
            while True:
                try:
                    cursor, lines, finished = ray.get(self._actor.read_lines.remote(cursor, 1.0),
                                                      timeout=CALL_TIMEOUT)
                except (RayActorError, GetTimeoutError) as exc:
                    self._lost = self._lost or f"its Ray actor is gone ({type(exc).__name__})"
                    return
                for line in lines:
                    log.write(line.removeprefix(prefix) + "\n")
                    with lock:
                        console.write(line + "\n")
                    console.flush()
                log.flush()
                if finished or (self._closing.is_set() and not lines):
                    return

    def poll(self) -> int | None:
        """The exit code; -1 when the actor (or its node) is gone, None while it runs."""
        if self._code is not None:
            return self._code
        if self._lost is not None:
            return -1
        try:
            self._code = ray.get(self._actor.poll.remote(), timeout=CALL_TIMEOUT)
        except (RayActorError, GetTimeoutError) as exc:
            self._lost = f"its Ray actor is gone ({type(exc).__name__}: the node left the cluster?)"
            return -1
        return self._code

    def tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of the log copy here (and why, if the actor is gone)."""
        try:
            text = self._log_path.read_text(errors="replace")[-chars:]
        except OSError:
            text = ""
        return text + (f"\n[{self.name}: {self._lost}]" if self._lost else "")

    def remember_descendants(self) -> None:
        """Ask the actor to record what the part spawned (not waited for)."""
        if self._lost is None:
            self._actor.remember_descendants.remote()

    def stop(self, timeout: float) -> int | None:
        """Stop the part on its node (SIGTERM, SIGKILL after ``timeout``); its exit code."""
        code = None
        if self._lost is None:
            try:
                code = ray.get(self._actor.stop.remote(timeout), timeout=2 * timeout + CALL_TIMEOUT)
            except (RayActorError, GetTimeoutError) as exc:
                self._lost = f"its Ray actor is gone ({type(exc).__name__})"
        self._closing.set()
        self._pump_thread.join(CALL_TIMEOUT)
        return code


class RaySite(Site):
    """A node of the Ray cluster, held by one :class:`PartHost` actor."""

    def __init__(self, name: str, actor: Any, where: dict[str, Any], log_dir: Path,
                 console: TextIO, lock: threading.Lock):
        """Wrap a placed actor; ``where`` is what its ``where()`` answered."""
        self.name = name
        self.actor = actor
        self.host = where["ip"]
        self.python = where["python"]
        self.run_dir = where["run_dir"]
        self.node_id = where["node_id"]
        self.node = f"node {self.node_id[:12]} ({where['hostname']}, {self.host})"
        self._log_dir, self._console, self._lock = log_dir, console, lock

    def free_port(self) -> int:
        """A port free on the node's address."""
        return ray.get(self.actor.free_port.remote(self.host), timeout=CALL_TIMEOUT)

    def start(self, argv: list[str], name: str | None = None,
              files: dict[str, str] | None = None) -> RayPart:
        """Write ``files`` and start ``argv`` on the node; its output streams here from now on."""
        name = name or self.name
        ray.get(self.actor.start.remote(argv, name, files), timeout=CALL_TIMEOUT)
        return RayPart(name, self.actor, self._log_dir, self._console, self._lock)


class RayBackend(Backend):
    """Places each part as a Ray actor on a running Ray cluster."""

    def __init__(self, section: RaySection, run_dir: Path, console: TextIO, lock: threading.Lock):
        """Connect to the cluster at ``section.address`` (unless this process already is).

        Raises:
            LaunchError: no Ray cluster answers at that address.
        """
        self.section = section
        self.run_dir = run_dir
        self._console, self._lock = console, lock
        self._actors: list[Any] = []
        self._groups: list[Any] = []
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            _check_reachable(section.address)
            try:
                # the parts' output is streamed with [part] prefixes, not through Ray's log monitor
                ray.init(address=section.address, namespace=section.namespace,
                         log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise LaunchError(f"no Ray cluster at {section.address!r} ({exc}); start one "
                                  "(`ray start --head`) or pass its address: --ray HOST:6379",
                                  part="launch", reason="could not connect to Ray") from exc

    def describe_cluster(self) -> str:
        """The live nodes and their resources, in one line."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        parts = []
        for node in nodes:
            res = {k: v for k, v in node.get("Resources", {}).items()
                   if not k.startswith("node:") and k not in ("memory", "object_store_memory")}
            parts.append(f"{node['NodeID'][:12]} ({node.get('NodeManagerAddress')}, {res})")
        return f"{len(nodes)} node(s): " + "; ".join(parts)

    def place(self, name: str, placement: Placement, count: int = 1) -> list[Site]:
        """One actor per site, placed by Ray; several at once in a ``STRICT_SPREAD`` group.

        Raises:
            LaunchError: the actors were not placed within ``ray.place_timeout`` seconds (no
                node fits), or an actor failed to start.
        """
        runtime_env = dict(self.section.runtime_env)
        key = os.environ.get(API_KEY_ENV)
        if key:  # as locally, every part gets the launching host's key (the config's wins)
            runtime_env["env_vars"] = {API_KEY_ENV: key, **runtime_env.get("env_vars", {})}
        options = placement.actor_options(runtime_env)
        run_name = self.run_dir.resolve().name
        actors = []
        if count == 1:
            actors.append(_PartHostActor.options(**options).remote(name, run_name, self.section.node_run_dir))
        else:
            bundle = {"CPU": options["num_cpus"], "GPU": options["num_gpus"],
                      **options.get("resources", {})}
            if "memory" in options:
                bundle["memory"] = options["memory"]
            bundle = {k: v for k, v in bundle.items() if v}
            group = placement_group([bundle] * count, strategy="STRICT_SPREAD",
                                    bundle_label_selector=[placement.labels] * count if placement.labels else None)
            self._groups.append(group)
            try:
                ray.get(group.ready(), timeout=self.section.place_timeout)
            except GetTimeoutError as exc:
                raise self._unplaced(name, placement, count) from exc
            options.pop("label_selector", None)  # the bundles carry it
            for index in range(count):
                strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
                actors.append(_PartHostActor.options(**options, scheduling_strategy=strategy).remote(
                    name if index == 0 else f"{name}.{index}", run_name, self.section.node_run_dir))
        self._actors.extend(actors)
        try:
            answers = ray.get([a.where.remote() for a in actors], timeout=self.section.place_timeout)
        except GetTimeoutError as exc:
            raise self._unplaced(name, placement, count) from exc
        except RayActorError as exc:
            raise LaunchError(f"{name}'s Ray actor failed to start: {exc}", part=name,
                              reason="could not start its Ray actor") from exc
        log_dir = self.run_dir / "logs"
        return [RaySite(name if i == 0 else f"{name}.{i}", actor, where, log_dir, self._console, self._lock)
                for i, (actor, where) in enumerate(zip(actors, answers, strict=True))]

    def _unplaced(self, name: str, placement: Placement, count: int) -> LaunchError:
        asked = placement.model_dump(exclude_defaults=True, exclude={"runtime_env"}) or "the defaults"
        where = f"{count} different nodes" if count > 1 else "a node"
        return LaunchError(
            f"Ray found no room for {name} on {where} within {self.section.place_timeout:.0f}s: it "
            f"asks for {asked} (placement: in its YAML section). The cluster has "
            f"{self.describe_cluster()}. Start a node that has it (e.g. `ray start --address ... "
            "--resources '{\"NAME\": 1}'`), or change the placement", part=name,
            reason="could not be placed on the Ray cluster")

    def collect(self, site: Site, into: Path, paths: list[str]) -> list[str]:
        """Copy ``paths`` (under the node's run dir) into ``into``, in chunks through Ray.

        A file lands under a temporary name and is renamed when whole. A node that is gone
        copies nothing.
        """
        actor = site.actor  # type: ignore[attr-defined]
        copied = []
        for rel in paths:
            try:
                files = ray.get(actor.list_files.remote(rel), timeout=CALL_TIMEOUT)
                for file_rel, size in files:
                    target = into / file_rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    partial = target.with_name(target.name + ".partial")
                    with open(partial, "wb") as out:
                        for offset in range(0, max(size, 1), CHUNK_BYTES):
                            out.write(ray.get(actor.read_file.remote(file_rel, offset, CHUNK_BYTES),
                                              timeout=10 * CALL_TIMEOUT))
                    partial.replace(target)
            except (RayActorError, GetTimeoutError):
                break
            if files:
                copied.append(rel)
        return copied

    def close(self) -> None:
        """End every actor and placement group of the run; disconnect if this connected."""
        for actor in self._actors:
            ray.kill(actor)
        for group in self._groups:
            remove_placement_group(group)
        self._actors, self._groups = [], []
        if self._owns_connection:
            ray.shutdown()


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in seconds when nothing listens at a ``HOST:PORT`` (or ``ray://HOST:PORT``) address.

    ``ray.init`` retries an unreachable head for minutes; this turns that into one clear error.
    ``auto`` is left to Ray (it fails at once when this host belongs to no cluster).

    Raises:
        LaunchError: the address does not parse, or a TCP connection to it fails.
    """
    import socket

    if address == "auto":
        return
    hostport = address.removeprefix("ray://").rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"Ray address {address!r} is not HOST:PORT, ray://HOST:PORT or auto",
                          part="launch", reason="bad Ray address")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        what = "Ray Client server (ray start --head runs it on 10001)" if address.startswith("ray://") \
            else "Ray head's GCS (ray start --head --port, 6379 by default)"
        raise LaunchError(f"nothing answers at {hostport} ({exc}): it should be the {what}; start "
                          "the cluster or fix --ray / ray.address", part="launch",
                          reason="could not reach the Ray cluster") from exc
