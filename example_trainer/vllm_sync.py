"""Keep the sampling vLLM on the trainer's current weights: launch it, then reload or restart it."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.weights.background import BackgroundPush
from atroposlib.inference.weights.external_vllm import ExternalVLLM
from atroposlib.inference.weights.local_vllm import LocalVLLM
from example_trainer.adapter_push import AdapterPush
from example_trainer.weight_export import (
    PolicyTensors,
    adapter_tensors,
    merged_reload_note,
    reload_tensors,
)


def save_weights(model: Any, tokenizer: Any, out_dir: Path, with_tokenizer: bool,
                 state_dict: dict[str, Any] | None = None) -> float:
    """Write ``model`` as a HF directory (``model.safetensors`` + config) and return the seconds.

    Args:
        model: a ``transformers`` PreTrainedModel (any device/dtype; saved as is).
        tokenizer: its tokenizer (saved when ``with_tokenizer``; vLLM needs it to start).
        out_dir: target directory (created; files overwritten).
        with_tokenizer: also save the tokenizer files.
        state_dict: the weights to write instead of the model's own, e.g. the full state dict
            gathered from FSDP shards; None saves ``model`` as it is.

    Returns:
        Seconds spent saving.
    """
    begin = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True, state_dict=state_dict)
    if with_tokenizer:
        tokenizer.save_pretrained(out_dir)
    return time.perf_counter() - begin


class VLLMSync:
    """The inference server the environments sample from, and how it gets new weights.

    Modes (``TrainerConfig.weight_sync``):

    * ``reload``: save safetensors into ``<run_dir>/vllm_weights`` and ask the running vLLM to
      load them (``POST /collective_rpc reload_weights`` + ``/reset_prefix_cache``): ~1 s on CPU.
      Once vLLM holds the frozen weights (it was launched on the starting model, or got one
      full sync) only the trained tensors are written; vLLM keeps the others. Once it holds the
      version pushed last, only the elements that changed are sent (a delta applied in memory
      by atroposlib's worker extension; ``weight_sync_encoding``, default ``auto``).
    * ``restart``: save a full checkpoint there and restart vLLM on it (~30 s on CPU; the
      environments retry while it is down).
    * ``lora``: save only the LoRA adapter, each push into a new folder
      (:class:`~example_trainer.adapter_push.AdapterPush`), and hot-load it (``POST /v1/load_lora_adapter``, in place). The vLLM the trainer launches
      serves the base under ``<served_model_name>-base`` and the adapter under
      ``served_model_name`` from the start (``--lora-modules``, the starting adapter saved
      before launch), so rollouts asking for ``served_model_name`` sample the current policy.
      ``--vllm-url`` servers serve it as ``<served_model_name>-lora``.
    * ``none``: never touch vLLM.
    * ``auto`` (the default): ``lora`` or ``reload``, resolved once by :meth:`choose`
      (:func:`~example_trainer.sync_choice.choose_weight_sync`); :attr:`mode` holds the result.
      ``none`` with ``rollout_engine: hf``.

    With ``rollout_engine: hf`` there is no vLLM: :meth:`start_in_process` serves the policy
    from the trainer's own process (:mod:`atroposlib.inference.hf_rollout`), and the training
    step runs inside :meth:`training`, so sampling never sees weights mid-update.

    With LoRA, ``reload`` and ``restart`` save a merged copy (adapter folded into the weights).

    With ``vllm_url`` the server is external and ``reload``, ``lora`` and ``none`` work
    (``restart`` needs the trainer to own vLLM; the config refuses it). ``reload`` needs each
    server started with ``VLLM_SERVER_DEV_MODE=1``; ``lora`` needs ``--enable-lora
    --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. A comma-separated list
    updates every server (e.g. one per Slurm inference node), reading the weights or adapter
    from a filesystem they share with the trainer. URLs of ``atropos-inference-node`` nodes
    need no shared filesystem: :class:`~atroposlib.inference.weights.node_http.NodeFleet` sends them the
    weights (over HTTP, or as a local file when a node shares this host and directory). Otherwise
    :class:`~atroposlib.inference.vllm_process.VLLMProcess` launches it with the policy.

    This class only chooses: it turns the policy into tensors
    (:mod:`example_trainer.weight_export`) and hands them to one
    :class:`~atroposlib.inference.weights.base.WeightTarget` (:attr:`target`), which writes,
    sends and reloads.
    """

    def __init__(self, config: Any, run_dir: Path):
        """Describe the server; nothing starts until :meth:`start`.

        Args:
            config: the :class:`~example_trainer.config.TrainerConfig`.
            run_dir: the run directory (weights and the vLLM log go there).
        """
        self.config = config
        self.weights_dir = run_dir / "vllm_weights"
        self.log_path = run_dir / "logs" / "vllm.log"
        self.process: Any = None
        # several comma-separated URLs (e.g. one vLLM per Slurm inference node) all get reloaded
        self._external_urls = [u.strip().rstrip("/") for u in (config.vllm_url or "").split(",") if u.strip()]
        self._external_url = self._external_urls[0] if self._external_urls else None
        self._external = ExternalVLLM(self._external_urls, self.weights_dir,
                                      config.weight_sync_encoding) if self._external_urls else None
        # the WeightTarget the weights go to: stock vLLM servers, or (set by start) the nodes
        # among them or the vLLM the trainer launched
        self.target: Any = self._external
        self.fleet: Any = None  # the target when it is atropos-inference-node nodes (NodeFleet/NcclFleet)
        self.background = BackgroundPush()  # the sync in flight with background=True
        # whether vLLM holds the trainer's frozen weights: true when the trainer launches it on
        # the starting model (not when resuming: the checkpoint may differ), else after a full sync
        self._holds_frozen = not self._external_urls and not config.resume
        self._export = PolicyTensors()
        self._adapter_noted = False  # merged_reload_note printed
        self._chosen: str | None = None  # what choose() resolved weight_sync=auto to
        self.adapters = AdapterPush(self.weights_dir, config.lora_r)  # lora: one folder per push
        self.sampler: Any = None  # rollout_engine hf: the HFRollout serving the live policy

    @property
    def mode(self) -> str | None:
        """The weight-sync mode in force.

        ``config.weight_sync``, or what :meth:`choose` resolved ``auto`` to (None until then).
        """
        return self._chosen if self.config.weight_sync == "auto" else self.config.weight_sync

    def choose(self, model: Any, announce: bool = True) -> str:
        """Resolve ``weight_sync`` (``auto``) for ``model`` once and return :attr:`mode`.

        Every rank may call it (it reads parameter shapes only). ``auto`` picks ``lora`` only for
        a vLLM this object launches (:func:`~example_trainer.sync_choice.choose_weight_sync`); a
        process handed in without :meth:`start` gets ``reload``.

        Args:
            model: the policy.
            announce: print the choice, with both byte counts, to stdout (rank 0).
        """
        if self.mode is None and self.config.rollout_engine == "hf":
            self._chosen = "none"  # generation reads the live weights
        if self.mode is None:
            from example_trainer.sync_choice import choose_weight_sync

            choice = choose_weight_sync(self.config, model,
                                        managed=self._external is None and self.process is None)
            self._chosen = choice.mode
            if announce and choice.why:
                print(f"[grpo] weight sync (auto): {choice.why}", flush=True)
        return self.mode  # type: ignore[return-value]

    @property
    def serves_adapter_as_policy(self) -> bool:
        """Whether the launched vLLM serves the LoRA adapter under ``served_model_name``.

        True in ``lora`` mode without ``--vllm-url``: :meth:`start` then needs the starting adapter.
        """
        return self.mode == "lora" and self._external is None

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL (``http://127.0.0.1:PORT/v1``)."""
        if self._external_url:
            return self._external_url
        if self.process is None:
            raise RuntimeError("vLLM was not started; call start() first")
        return self.process.base_url

    def start(self, model: Any = None, state_dict: dict[str, Any] | None = None) -> float:
        """Launch vLLM on the starting policy, or wait for an external one; return seconds.

        Args:
            model: the policy; resolves ``auto`` (:meth:`choose`) and, in ``lora`` mode, gives
                the starting adapter the launched vLLM serves as ``served_model_name``.
            state_dict: its full state dict gathered from FSDP shards (None in one process).

        Raises:
            ValueError: ``lora`` mode launching vLLM without ``model``.
            InferenceError: vLLM did not become healthy (the message has its log tail).
        """
        if model is not None:
            self.choose(model)
        if self._external is not None:
            if self.mode == "none":
                return 0.0
            seconds = self._external.wait_healthy(
                self.config.vllm_start_timeout,
                fix="start it (with VLLM_SERVER_DEV_MODE=1 for weight reloads), fix --vllm-url, or "
                    "drop --vllm-url to let the trainer launch one")
            self.fleet = connect_nodes(self.config, self._external_urls, self.weights_dir,
                                       self.model_name if self.mode == "lora" else None)
            self.target = self.fleet or self.target
            return seconds
        adapter = None
        if self.serves_adapter_as_policy:
            if model is None:
                raise ValueError("weight_sync=lora: start(model) needs the LoRA model to save the "
                                 "starting adapter vLLM serves")
            adapter = self.adapters.save(model, state_dict)
        self.process = vllm_process(self.config, self.log_path, self.mode or "reload", adapter)
        begin = time.perf_counter()
        self.process.start(timeout=self.config.vllm_start_timeout)
        self.target = LocalVLLM(self.process, self.weights_dir, local_encoding(self.config.weight_sync_encoding))
        return time.perf_counter() - begin

    def start_in_process(self, model: Any, tokenizer: Any, version: int) -> float:
        """Serve ``model`` from this process (``rollout_engine: hf``) on ``vllm_port``; return seconds.

        Args:
            model: the policy being trained (sampled from as it trains).
            tokenizer: its tokenizer.
            version: the policy version of its weights now (the starting step).

        Raises:
            InferenceError: the port is taken.
        """
        import torch

        from atroposlib.inference.hf_rollout.engine import HFRollout
        from atroposlib.inference.hf_rollout.factory import create_app
        from atroposlib.inference.hf_rollout.server import InProcessServer

        self.choose(model)
        self.sampler = HFRollout(model, tokenizer, model_name=self.config.served_model_name,
                                 max_model_len=self.config.vllm_max_model_len, version=version,
                                 threads=self.config.torch_threads, seed=self.config.seed,
                                 autocast_dtype=torch.bfloat16
                                 if self.config.mixed_precision == "bf16" else None)
        self.process = InProcessServer(create_app(self.sampler), port=self.config.vllm_port)
        return self.process.start()

    @contextlib.contextmanager
    def training(self, version: int) -> Iterator[None]:
        """Hold the weights for one training step that makes policy ``version``.

        With the in-process sampler, no generation runs inside the block, and generations
        after it are tagged ``version``; otherwise it does nothing.
        """
        if self.sampler is None:
            yield
            return
        with self.sampler.turns.training():
            yield
            self.sampler.set_version(version)

    @property
    def model_name(self) -> str:
        """The model name rollouts and evaluations must request.

        ``<served_model_name>-lora`` for the adapter on ``--vllm-url`` servers in ``lora`` mode;
        ``served_model_name`` otherwise (the launched vLLM serves the adapter under it).
        """
        if self.mode == "lora" and self._external is not None:
            return f"{self.config.served_model_name}-lora"
        return self.config.served_model_name

    def health_problem(self) -> tuple[str, bool] | None:
        """Why vLLM cannot serve right now, for :class:`~example_trainer.health.HealthWatch`.

        Returns:
            None while it is healthy; ``(why, True)`` when the launched vLLM exited (exit code
            and log tail in ``why``); ``(why, False)`` when an external server did not answer
            ``GET /health`` with 200 within 5 s (it may come back). Never a problem for
            ``atropos-inference-node`` nodes: the fleet marks them stale instead.
        """
        if self.process is not None:
            died = self.process.death_report()
            return (died, True) if died is not None else None
        if self.fleet is not None or self._external is None:
            # Inference nodes: a down node is marked stale and re-synced by the fleet's own
            # watcher; training goes on (it never ends the run).
            return None
        why = self._external.unhealthy()
        return (why, False) if why is not None else None

    def sync(self, model: Any, tokenizer: Any, state_dict: dict[str, Any] | None = None,
             background: bool = False, version: int = 0) -> dict[str, float]:
        """Push the current weights to vLLM according to ``weight_sync``.

        Args:
            model: the policy being trained.
            tokenizer: its tokenizer (needed by ``restart``).
            state_dict: full weights to write instead of ``model``'s own (gathered FSDP shards).
            background: ``reload`` and inference nodes only: copy the trained weights now and
                push them (write + reload, or send) in a background thread, so the trainer's next step runs
                while vLLM loads this one. A sync first waits for the one before it, so at most
                one is in flight and vLLM's policy lags the trainer by at most one sync. Call
                :meth:`wait` before anything that needs vLLM on the newest weights (an
                evaluation, the end of training). Ignored (synchronous) in other modes.
            version: the policy version (trainer step) of these weights; inference nodes tag
                the completions they serve with it.

        Returns:
            ``{"sync/save_seconds", "sync/update_seconds"}`` (zeros for ``none``); in the
            background, those of the previous sync (zeros for the first) plus
            ``sync/wait_seconds``, how long this call waited for the previous one. A reload
            of the trainer's own vLLM adds ``sync/vllm_heap_released_mb``, the free heap it
            gave back after that reload.

        Raises:
            InferenceError: the server refused the update or did not come back (in the
                background: raised by the next ``sync`` or ``wait``).
        """
        mode = self.choose(model)
        if mode == "none":
            return {"sync/save_seconds": 0.0, "sync/update_seconds": 0.0}
        if mode == "lora" and self.fleet is None:
            return self.adapters.push(model, state_dict, self._external_urls or [self.process.base_url],
                                      self.model_name)
        background = background and (mode == "reload" or self.fleet is not None)
        begin = time.perf_counter()
        previous = self.wait() if background else {}
        waited = time.perf_counter() - begin
        metadata = None
        if mode == "lora":
            tensors, metadata = adapter_tensors(model, state_dict, self.weights_dir / "adapter")
        elif self.fleet is not None:
            tensors = self._export.changed_blocks(model, state_dict, copy=background)
        else:
            # once vLLM holds the frozen weights, only what training changed is written;
            # bf16/fp16 vLLM: half the bytes of fp32
            hf_model, tensors = reload_tensors(
                model, state_dict, only_trained=mode == "reload" and self._holds_frozen,
                dtype_name=self.config.vllm_dtype if mode == "reload" and
                self.config.vllm_dtype in ("bfloat16", "float16") else None, snapshot=background)
            self._holds_frozen = self._holds_frozen or mode == "reload"
            if mode == "restart":
                save_s = save_weights(hf_model, tokenizer, self.weights_dir, True, state_dict=tensors)
                update_s = self.process.restart(model=self.weights_dir, timeout=self.config.vllm_start_timeout)
                return {"sync/save_seconds": save_s, "sync/update_seconds": update_s}
            if not (self.weights_dir / "config.json").exists():
                hf_model.config.save_pretrained(self.weights_dir)
        if self.target is None:  # a process handed in without start() (tests, benchmarks)
            self.target = LocalVLLM(self.process, self.weights_dir,
                                    local_encoding(self.config.weight_sync_encoding))
        if mode == "reload" and not self._adapter_noted and self.config.weight_sync == "reload":
            # (auto logged its choice with both sizes already)
            self._adapter_noted = True
            if note := merged_reload_note(model, self.config.served_model_name):
                print(f"[grpo] {note}", flush=True)
        if not background:
            return self.target.push(tensors, version, metadata)
        self.background.submit(self.target, tensors, version, metadata)
        zeros = {"sync/update_seconds": 0.0} if self.fleet is not None else \
            {"sync/save_seconds": 0.0, "sync/update_seconds": 0.0}
        return {**zeros, **previous, "sync/wait_seconds": waited}

    def summary(self) -> dict[str, Any]:
        """Weight-sync fields for the run summary (inference nodes only; ``{}`` otherwise)."""
        return self.target.summary() if self.target is not None else {}

    def wait(self) -> dict[str, float]:
        """Wait for the background sync in flight, if any; return its metrics (``{}`` if none).

        Raises:
            InferenceError: that sync failed (the server refused the update or died).
        """
        return self.background.wait()

    def cleanup(self) -> None:
        """Delete the weights written for syncing (call after :meth:`stop`)."""
        import shutil

        shutil.rmtree(self.weights_dir, ignore_errors=True)

    def stop(self) -> None:
        """Stop the launched vLLM (its own process group only); no-op for an external server.

        A background sync still in flight is waited for first; its error, if any, is printed
        to stderr and not raised (the server is going away, and nothing waits for that sync).
        """
        error = self.background.close()
        if error is not None:
            print(f"[grpo] the last background weight sync failed while stopping: {error}",
                  file=sys.stderr, flush=True)
        if self.target is not None:
            self.target.close()
        if self.process is not None:
            self.process.stop()


def vllm_process(config: Any, log_path: Path, mode: str | None = None, adapter: Path | None = None) -> Any:
    """The :class:`~atroposlib.inference.vllm_process.VLLMProcess` the trainer launches (not started).

    It serves ``config.model`` under ``served_model_name`` in dev mode (weight reloads), sized
    for this run's batches (:func:`vllm_sizing`). In ``lora`` mode it runs with
    ``--enable-lora`` (``--max-lora-rank``: the smallest rank vLLM accepts that holds
    ``lora_r``) and runtime adapter updates, serves the base model as
    ``<served_model_name>-base`` and the adapter in ``adapter`` as ``served_model_name``
    (``--lora-modules``). Its log goes to ``log_path`` (the folder is created).

    Args:
        config: the :class:`~example_trainer.config.TrainerConfig`.
        log_path: where vLLM's output goes.
        mode: the resolved ``weight_sync`` (default: ``config.weight_sync``).
        adapter: ``lora`` mode: the starting adapter's folder (``save_pretrained`` output).

    Raises:
        ConfigError: the model's ``config.json`` cannot size a KV cache.
        ValueError: ``lora`` mode without ``adapter``, or ``lora_r`` above vLLM's largest rank.
    """
    from atroposlib.inference.vllm_process import VLLMProcess
    from example_trainer.sync_choice import lora_rank_slot

    log_path.parent.mkdir(parents=True, exist_ok=True)
    sizing = vllm_sizing(config)
    lora = (mode or config.weight_sync) == "lora"
    name, lora_args = config.served_model_name, []
    if lora:
        if adapter is None:
            raise ValueError("weight_sync=lora: the launched vLLM needs the starting adapter's folder")
        name = f"{config.served_model_name}-base"
        lora_args = ["--enable-lora", "--max-lora-rank", str(lora_rank_slot(config.lora_r)),
                     "--max-loras", "1", "--lora-modules", f"{config.served_model_name}={adapter}"]
    return VLLMProcess(
        config.model, served_model_name=name, port=config.vllm_port,
        dtype=config.vllm_dtype, max_model_len=config.vllm_max_model_len,
        max_num_seqs=sizing.max_num_seqs, kv_cache_bytes=sizing.kv_cache_bytes,
        extra_args=[*lora_args, *config.vllm_extra_args], log_path=log_path,
        dev_mode=True, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if lora else None,
    )


def connect_nodes(config: Any, urls: list[str], weights_dir: Path, lora_name: str | None = None) -> Any:
    """The inference nodes among the trainer's ``--vllm-url`` servers, ready to push to (None: none).

    Args:
        config: the :class:`~example_trainer.config.TrainerConfig`.
        urls: the ``--vllm-url`` list.
        weights_dir: the trainer's weights directory.
        lora_name: ``--weight-sync lora``: the served adapter name.

    Raises:
        InferenceError: the list mixes nodes and plain vLLM servers, or a node refused the key.
    """
    import os

    from atroposlib.utils.api_key import API_KEY_ENV
    from example_trainer.sync_choice import lora_rank_slot

    api_key = config.vllm_api_key or os.environ.get(API_KEY_ENV) or None
    if config.weight_transport == "nccl":
        from atroposlib.inference.weights.nccl import NcclFleet

        return NcclFleet.connect(urls, api_key, config.weight_sync_timeout,  # type: ignore[return-value]
                                 config.weight_sync_encoding)
    from atroposlib.inference.weights.node_http import NodeFleet

    fleet, plain = NodeFleet.discover(urls, api_key, config.weight_sync_timeout, weights_dir,
                                      config.weight_transport, lora_name, config.weight_sync_encoding)
    if fleet is not None and lora_name is not None:
        without = [n.url for n in fleet.nodes if not n.lora_enabled]
        if without:
            raise InferenceError(
                f"--weight-sync lora: the nodes {', '.join(without)} run vLLM without LoRA; start "
                f"them with `atropos-inference-node ... -- --enable-lora --max-lora-rank "
                f"{lora_rank_slot(config.lora_r)}`, or use --weight-sync reload (the adapter merged in)")
    if fleet is not None and plain:
        raise InferenceError(
            f"--vllm-url mixes atropos-inference-node nodes ({', '.join(n.url for n in fleet.nodes)})"
            f" and plain vLLM servers ({', '.join(plain)}): run every server as "
            "atropos-inference-node (no shared disk needed), or none")
    return fleet


def local_encoding(encoding: str) -> str:
    """``weight_sync_encoding`` for the trainer's own vLLM: ``auto`` means ``full`` there.

    On one host a reload is a memory copy, and a delta ends with the same in-place load after
    comparing, encoding, hashing and decoding: 5.1x the reload's seconds for the quickstart's
    LoRA blocks and 9.0x for a full fine-tune on 2 CPU cores (``benchmarks/bench_delta_sync.py``).
    Deltas pay where bytes cross a network (``--vllm-url`` servers, inference nodes); ``index``
    or ``xor`` asks for them here too.
    """
    return "full" if encoding == "auto" else encoding


def vllm_sizing(config: Any) -> Any:
    """The launched vLLM's ``--max-num-seqs`` and CPU KV cache for this run's batches.

    :func:`~atroposlib.inference.sizing.size_for_training` with the trainer's settings, the
    served dtype and the KV block size (a ``--block-size`` in ``vllm_extra_args`` wins).

    Raises:
        ConfigError: the model's ``config.json`` cannot size a KV cache (the message says to
            set ``--vllm-kv-cache-gib``).
    """
    from atroposlib.errors import ConfigError
    from atroposlib.inference.sizing import size_for_training
    from atroposlib.inference.vllm_process import DEFAULT_CPU_BLOCK_SIZE, vllm_is_cpu_build

    args = list(config.vllm_extra_args)
    block = next((int(args[i + 1]) for i, a in enumerate(args[:-1]) if a == "--block-size"),
                 next((int(a.split("=", 1)[1]) for a in args if a.startswith("--block-size=")),
                      DEFAULT_CPU_BLOCK_SIZE))
    dtype = config.vllm_dtype
    if dtype == "auto":  # what VLLMProcess serves: fp32 on CPU, the model's (bf16 assumed) on GPU
        dtype = "float32" if vllm_is_cpu_build() else "bfloat16"
    try:
        return size_for_training(config.model, dtype, config.batch_size, config.max_token_len,
                                 config.vllm_max_model_len, block, config.vllm_max_num_seqs,
                                 config.vllm_kv_cache_gib)
    except ValueError as exc:
        raise ConfigError(f"{exc} (--vllm-kv-cache-gib)") from exc
