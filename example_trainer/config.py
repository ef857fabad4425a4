"""``TrainerConfig``: every setting of the GRPO example trainer (CLI flags, YAML, env vars)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from atroposlib.defaults import DEFAULT_API_URL, DEFAULT_INFERENCE_MODEL
from example_trainer.checkpointing import CheckpointMode
from example_trainer.optimizer import LRSchedulerName, OptimizerName


def default_model_dir() -> str:
    """The bundled SmolLM2-135M-Instruct directory (``atropos-bundled-model`` prepares it)."""
    from atroposlib.inference.bundled import bundled_model_dir

    return str(bundled_model_dir())


class TrainerConfig(BaseSettings):
    """Settings of atropos-grpo, the GRPO example trainer.

    Each setting is a kebab-case flag (--training-steps 20), a key under trainer: in an
    atropos-launch YAML file, or an environment variable ATROPOS_GRPO_<FIELD>. Precedence:
    defaults < environment variables < YAML and flags. Pass null for "unset".
    """

    #: The module atropos-launch runs with these settings as flags (``python -m`` or torchrun).
    #: A class variable, not a setting: no flag, no YAML key.
    run_module: ClassVar[str] = "example_trainer.grpo"

    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix="ATROPOS_GRPO_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="atropos-grpo",
        cli_hide_none_type=True,
        validate_assignment=True,
    )

    # ---------------------------------------------------------------- model and run
    model: str = Field(default=None, validate_default=True,
                       description="Policy to train: a local HF model directory or hub id; "
                       "null: the bundled SmolLM2-135M-Instruct (atropos-bundled-model prints "
                       "its path).")
    run_dir: str | None = Field(default=None, description="Directory for checkpoints, logs, "
                                "metrics.jsonl, plot.png and summary.json; null: "
                                "a new runs/<UTC timestamp> (-2, -3, ... appended when a run of "
                                "the same second has that name).")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Training device; "
                                                   "auto = cuda when available.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(default="auto", description="Training "
                                                          "dtype; auto = float32 on CPU, bfloat16 "
                                                          "on CUDA.")
    mixed_precision: Literal["no", "bf16", "bf16_if_native"] = Field(
        default="no", description="bf16: run forward and backward under torch.autocast in "
        "bfloat16 while weights, gradients and optimizer state stay in the training dtype "
        "(faster steps on CPUs with AVX512_BF16 or AMX; the log-probs then carry "
        "bf16 rounding, as the sampler's already do). bf16_if_native: bf16 on a GPU or a CPU "
        "with native bf16, no elsewhere (emulated bf16 is slower than fp32).")
    seed: int = Field(default=0, description="Torch seed.")
    resume: str | None = Field(default=None, description="Continue the run in this run "
                               "directory from its latest complete checkpoint: weights (or "
                               "LoRA adapter), optimizer, RNG and step are restored, run-api "
                               "continues at that step and metrics.jsonl is appended to. "
                               "run_dir defaults to it.")
    torch_threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads "
                                      "(null: torch's choice).")
    train_last_layers: int | None = Field(default=None, ge=1, description="Train only the last "
                                          "N decoder layers and the final norm (embeddings and "
                                          "the LM head frozen); null trains everything. Cuts "
                                          "backward time on CPU.")
    lora_r: int = Field(default=0, ge=0, description="LoRA rank; 0 trains the full model. With "
                        "train_last_layers only those layers get adapters.")
    lora_alpha: float = Field(default=16.0, gt=0, description="LoRA alpha (the update is scaled "
                              "by alpha / r).")
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the LoRA input.")
    lora_target_modules: list[str] = Field(
        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Module names that get LoRA adapters (the default: every attention and MLP "
        "projection of Llama-style models); a JSON list or comma-separated names.")
    gradient_checkpointing: bool = Field(default=False, description="Recompute the decoder "
                                         "layers' activations in backward instead of keeping "
                                         "them: less memory, slower steps.")
    gradient_checkpointing_mode: CheckpointMode = Field(
        default="full", description="With gradient_checkpointing: full keeps only each decoder "
        "layer's input and reruns the layer (Hugging Face's); selective keeps the matmul and "
        "attention outputs and recomputes the cheap ops between them (torch's selective "
        "activation checkpointing; on a small model on CPU full saves more, see docs/benchmarks.md).")
    shared_prefix: bool = Field(default=False, description="Run the prompt that a group's "
                                "rollouts share through the policy once per micro-batch (KV "
                                "cache repeated for the group) instead of once per rollout: "
                                "same loss and gradients, fewer tokens, but more and smaller "
                                "forwards, so whether steps get faster depends on the shapes "
                                "(see docs/benchmarks.md). The plain forward is used under FSDP "
                                "(ranks must run equal forwards) and with gradient checkpointing "
                                "(no KV cache).")
    round_frozen_embeddings: bool = Field(default=True, description="With mixed_precision bf16 "
                                          "(no LoRA, no FSDP): store a frozen input embedding "
                                          "table in bf16, as vLLM holds it, and return its "
                                          "lookups in fp32. A tied LM head computes the same "
                                          "logits as before; the residual stream starts from "
                                          "bf16-rounded embeddings. Halves the table's "
                                          "memory.")
    release_free_heap: bool = Field(default=True, description="After every step, give glibc's "
                                    "free heap pages back to the OS (malloc_trim): the step's "
                                    "freed gradients, activations and weight-sync copies stay "
                                    "resident otherwise. Logged as "
                                    "memory/heap_released_mb and memory/heap_release_seconds; a no-op outside glibc.")
    attn_implementation: str | None = Field(default=None, description="HF attention kernel; "
                                            "default eager on CPU (fast for short padded "
                                            "batches), sdpa on CUDA.")

    # ---------------------------------------------------------------- trajectory API
    api_url: str = Field(default=DEFAULT_API_URL, description="run-api base URL.")
    api_key: str | None = Field(default=None, min_length=1, description="Bearer token for "
                                "run-api (null: the ATROPOS_API_KEY environment variable; an "
                                "empty token is refused).")
    batch_timeout: float = Field(default=900.0, gt=0, description="Seconds to wait for one "
                                 "batch before failing with a hint (are the envs running?).")
    wandb_project: str | None = Field(default=None, description="W&B project (also sent to "
                                      "the envs through /register).")
    wandb_group: str | None = Field(default=None, description="W&B group.")
    use_wandb: bool = Field(default=False, description="Log to Weights & Biases (lazy import; "
                            "set WANDB_MODE=offline to stay off the network).")
    tensorboard: bool = Field(default=False, description="Also log every metric to TensorBoard "
                              "event files in <run_dir>/tensorboard (view with `tensorboard "
                              "--logdir runs`).")
    tensorboard_dir: str | None = Field(default=None, description="TensorBoard log directory "
                                        "instead of <run_dir>/tensorboard (implies --tensorboard).")
    plot_every: int = Field(default=5, ge=0, description="Redraw <run_dir>/plot.png (reward, "
                            "eval accuracy, loss, KL, clip fraction, completion length, step "
                            "time) every N steps during training (0: only at the end).")
    max_staleness: int | None = Field(default=None, ge=0, description="Sent with /register: "
                                      "run-api drops groups whose policy_version is more than "
                                      "this many steps behind the current step (overrides "
                                      "run-api --max-staleness). null: run-api's setting.")

    metrics_port: int | None = Field(default=None, ge=0, le=65535, description="Serve "
                                     "Prometheus metrics at http://<metrics_host>:PORT/metrics "
                                     "(0: a free port, printed at start; null: off). Names in "
                                     "docs/metrics-trainer.md.")
    metrics_host: str = Field(default="127.0.0.1", description="Interface the metrics endpoint "
                              "binds (0.0.0.0 lets a scraper on another machine in).")

    # ---------------------------------------------------------------- optimisation
    training_steps: int = Field(default=20, ge=1, description="Optimizer steps; each consumes "
                                "exactly one GET /batch.")
    max_train_seconds: float | None = Field(default=None, gt=0, description="Time budget of the "
                                            "training loop (from registration to the last step): "
                                            "no step starts that would end past it, judged by the "
                                            "previous step's duration. null: no limit.")
    batch_size: int = Field(default=32, ge=1, description="Sequences per step (registered with "
                            "the API; a multiple of the envs' group_size).")
    micro_batch_size: int = Field(default=8, ge=1, description="Sequences per forward/backward "
                                  "(gradient accumulation over batch_size / micro_batch_size).")
    max_token_len: int = Field(default=2048, ge=2, description="Longest sequence accepted, in "
                               "tokens (registered with the API).")
    pad_multiple: int = Field(default=32, ge=1, description="Pad each micro-batch's length to a "
                              "multiple of this.")
    lr: float = Field(default=1e-5, gt=0, description="AdamW learning rate.")
    optim: OptimizerName = Field(
        default="adamw_torch", description="adamw_torch: torch's AdamW, moments in fp32 (8 bytes "
        "per trained parameter). adamw_bnb_8bit: bitsandbytes' 8-bit AdamW (about 2 bytes, but "
        "a slower optimizer step on a CPU; see docs/benchmarks.md); single-rank runs only. "
        "Names as in Hugging Face's TrainingArguments.optim.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field(default=(0.9, 0.99), description="AdamW betas.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear LR warm-up steps.")
    lr_scheduler_type: LRSchedulerName = Field(
        default="constant", description="The learning rate after warm-up (Hugging Face's "
        "names): constant; linear or cosine decay to 0 at the end of the run, which is "
        "--training-steps or --max-train-seconds, whichever comes first.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient-norm clip.")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="PPO ratio clip range.")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo"] = Field(
        default="grpo", description="Policy objective (TRL's names): grpo = token mean per "
        "sequence, then mean over sequences; dr_grpo = token sum / (dr_grpo_length * sequences), "
        "no std scaling; dapo = token mean over the step; gspo = one length-normalised ratio per "
        "sequence, clipped per sequence; cispo = clipped stop-gradient IS weight times log-prob, "
        "token mean over the step. Formulas and papers in example_trainer/loss.py.")
    clip_eps_low: float | None = Field(default=None, gt=0, description="Lower clip range (ratio "
                                       "clipped at 1 - clip_eps_low; for cispo >= 1 means no "
                                       "lower bound); null: clip_eps.")
    clip_eps_high: float | None = Field(default=None, gt=0, description="Upper clip range (ratio "
                                        "clipped at 1 + clip_eps_high; DAPO uses 0.28 with 0.2 "
                                        "below); null: clip_eps.")
    dr_grpo_length: int | None = Field(default=None, ge=1, description="The constant L that "
                                       "dr_grpo divides each sequence's token-loss sum by; "
                                       "null: max_token_len.")
    scale_rewards: Literal["auto", "group", "none"] = Field(
        default="auto", description="Advantages from scores: group = (s - mean) / std within the "
        "group; none = s - mean (Dr. GRPO); auto = none for dr_grpo, group otherwise. Per-token "
        "advantages sent by the env are used as sent.")
    is_correction: Literal["none", "tis", "mis"] = Field(
        default="none", description="Sampler/trainer mismatch correction with rho = pi_old / "
        "pi_sampler per token: tis weights the policy loss by min(rho, is_cap); mis weights it "
        "by rho inside [1/is_cap, is_cap] and drops tokens outside (IcePop's token mask, "
        "arXiv:2510.18855); none: the PPO ratio is taken against the sampler's log-probs instead.")
    is_cap: float = Field(default=2.0, gt=1, description="C of --is-correction (tis cap, mis "
                          "range [1/C, C]); also the range of the logged sampler_out_of_range.")
    kl_coef: float = Field(default=0.0, ge=0, description="k3 KL penalty coefficient (0 = off). "
                           "Uses the batch's ref_logprobs where sent, else a frozen copy of the "
                           "starting model.")
    distill_coef: float = Field(default=0.0, ge=0, description="Teacher-distillation coefficient "
                                "(0 = off): adds the forward KL from the teacher's top-K "
                                "candidates (distill_token_ids/distill_logprobs, sent by "
                                "TeacherDistillationEnv) to the student on trained tokens.")

    # ---------------------------------------------------------------- checkpoints
    checkpoint_interval: int = Field(
        default=10, ge=0, description="Save checkpoints/step_<k> every N steps (0: only the "
        "final one and one on exit). A save costs a fraction of one step "
        "(benchmarks/bench_checkpoint.py measures it), so a small interval costs little of the "
        "run and bounds what a crash loses. The trainer also saves on any exit it can handle (an error in a step, Ctrl-C, "
        "SIGTERM, a dead vLLM).")
    checkpoint_keep: int = Field(
        default=2, ge=0, description="Keep the newest N step_<k> checkpoints and delete older "
        "ones once a newer one is complete (checkpoints/final is always kept); 0 keeps all. A "
        "full checkpoint holds the weights and the optimizer state: about 1.5 GiB for "
        "SmolLM2-135M.")

    replay_bundles: int | None = Field(
        default=100, ge=0, description="Write each consumed batch, with its advantages, sampler "
        "log-probs, RNG state, loss and grad norm, to <run_dir>/bundles/ as a checksummed "
        "bundle (atropos-replay verifies and re-drives steps from them) and keep the newest N; "
        "0 keeps all, null writes none. A bundle is about the size of the batch's JSON (tens "
        "of KiB to a few MiB). Keep at least checkpoint_interval x checkpoint_keep so every "
        "kept step can be re-driven from a kept checkpoint.")

    # ---------------------------------------------------------------- vLLM
    rollout_engine: Literal["vllm", "hf"] = Field(
        default="vllm", description="What the environments sample from. vllm: a vLLM server "
        "(launched by the trainer, or --vllm-url) that gets the trained weights after each step; "
        "hf: the trainer's own process serves an OpenAI-compatible API (on --vllm-port, as "
        "served_model_name) with transformers' generate on the very weights it trains: no vLLM, "
        "no weight sync, no second copy of the model, slower sampling (one generation at a time, "
        "taking turns with the training step). Single process only (no torchrun); vllm_* "
        "settings but vllm_port and vllm_max_model_len do not apply.")
    vllm_url: str | None = Field(default=None, description="Use this already-running vLLM "
                                 "(e.g. http://127.0.0.1:9100/v1) instead of launching one; "
                                 "weight_sync reload needs it in dev mode, lora with "
                                 "--enable-lora, restart is refused. Comma-separated URLs: "
                                 "update all of them (multi-node).")
    vllm_port: int | None = Field(default=None, description="Port of the vLLM the trainer "
                                  "launches (null: a free one).")
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16", "bfloat16_if_native"] = Field(
        default="auto", description="dtype of the launched vLLM (auto: float32 on CPU; "
        "bfloat16_if_native: bfloat16 on a GPU or a CPU with native bf16, float32 elsewhere).")
    vllm_max_model_len: int = Field(default=2048, ge=1, description="Context of the launched vLLM.")
    vllm_max_num_seqs: int | None = Field(default=None, ge=1, description="Sequences the "
                                          "launched vLLM runs at once (--max-num-seqs); null: 4 x "
                                          "batch_size (what the envs keep in flight), at most 256.")
    vllm_kv_cache_gib: float | None = Field(default=None, gt=0, description="KV cache of the "
                                            "launched vLLM on CPU, in GiB; null: room for "
                                            "vllm_max_num_seqs sequences of min(max_token_len, "
                                            "vllm_max_model_len) tokens, at most 2 GiB. A "
                                            "VLLM_CPU_KVCACHE_SPACE in the environment wins.")
    vllm_extra_args: list[str] = Field(default=[], description="Extra `vllm serve` "
                                       "flags for the launched server (a JSON list).")
    vllm_start_timeout: float = Field(default=600.0, gt=0, description="Seconds to wait for "
                                      "the launched vLLM to become healthy.")
    served_model_name: str = Field(default=DEFAULT_INFERENCE_MODEL, description="Model name vLLM serves.")
    weight_sync: Literal["auto", "reload", "restart", "lora", "none"] = Field(
        default="auto", description="auto: lora for a LoRA run whose adapter is smaller than "
        "the merged weights of the modules it adapts, when the trainer launches vLLM (logged "
        "once with both byte counts), else reload; reload: save safetensors (LoRA merged in) "
        "and hot-reload them in the running vLLM (no restart); restart: save a checkpoint and "
        "restart vLLM on it (the upstream way); lora: hot-load the LoRA adapter through vLLM's "
        "LoRA loading. The vLLM the trainer launches then serves the adapter as "
        "served_model_name (the base as <served_model_name>-base), so envs need no change; "
        "--vllm-url servers (started with --enable-lora) serve it as <served_model_name>-lora "
        "(point the envs at that name); none: never update vLLM.")
    weight_sync_encoding: Literal["auto", "index", "xor", "full"] = Field(
        default="auto", description="What a weight sync sends a server that holds the version "
        "the trainer pushed last: auto = only the elements that changed (a delta, index/value or "
        "XOR+zlib per tensor, whichever fits) to servers in --vllm-url and atropos-inference-node "
        "nodes, and the full tensors to the trainer's own vLLM on this host (there a delta costs "
        "more than the copy it saves: docs/benchmarks.md); index / xor = that delta format for "
        "every tensor and every server, the trainer's own vLLM included; full = the whole "
        "tensors every time. Deltas are applied inside vLLM by atroposlib's worker extension and "
        "checked by sha-256; a server at another version, or whose checksum differs, gets a "
        "full sync.")
    weight_sync_interval: int = Field(default=1, ge=1, description="Sync vLLM every N steps "
                                      "(and always after the last step).")
    weight_sync_timeout: float = Field(default=120.0, gt=0, description="Seconds one weight "
                                       "sync may take per atropos-inference-node (upload, "
                                       "drain, load). A node that misses it is marked stale, "
                                       "named in one warning and counted (sync/nodes_failed, "
                                       "summary weight_sync_failures); training goes on and the "
                                       "node is sent the current weights once it answers again.")
    weight_transport: Literal["auto", "http", "nccl"] = Field(
        default="auto", description="How weights reach atropos-inference-node nodes in "
        "--vllm-url: auto = the node reads them from this run directory when it runs on this "
        "host and sees it, else they are pushed over HTTP; http = always push; nccl = vLLM's "
        "NCCL weight transfer (CUDA, nodes started with --weight-transfer nccl, or nccl-sparse "
        "for deltas; never run in this project's tests).")
    vllm_api_key: str | None = Field(default=None, description="Bearer token of the inference "
                                     "servers in --vllm-url (null: the ATROPOS_API_KEY "
                                     "environment variable).")
    weight_sync_overlap: bool = Field(default=False, description="reload only: copy the weights "
                                      "and write + reload them in a background thread while the "
                                      "next step trains (vLLM's policy then lags the trainer by at "
                                      "most one sync; evaluations wait for it).")

    # ---------------------------------------------------------------- evaluation
    eval_command: str | None = Field(default=None, description="Shell command run before "
                                     "training, every eval_interval steps and after the last "
                                     "step; it must write {out_dir}/metrics.json (BaseEnv "
                                     "evaluate format). Placeholders: {base_url}, {model_name}, "
                                     "{out_dir}, {step}.")
    eval_interval: int = Field(default=0, ge=0, description="Evaluate every N steps (0: only "
                               "before and after training).")
    eval_metric: str = Field(default="eval/accuracy", description="Key in metrics.json "
                             "results.all reported as eval accuracy.")
    eval_timeout: float = Field(default=600.0, gt=0, description="Seconds one evaluation may take.")

    # ---------------------------------------------------------------- several processes
    fsdp: Literal["auto", "on", "off"] = Field(
        default="auto", description="Shard the policy over the processes torchrun starts "
        "(FSDP2): auto = on when WORLD_SIZE > 1; off = the single-process trainer. batch_size "
        "must be a multiple of processes x micro_batch_size.")
    collective_timeout: float = Field(default=300.0, gt=0, description="Seconds a training "
                                      "collective waits for the other ranks before failing "
                                      "(a dead or hung rank ends the run with an error, never "
                                      "a hang).")

    @property
    def scale_advantages(self) -> bool:
        """Whether score advantages are divided by the group's std (``scale_rewards`` resolved)."""
        if self.scale_rewards == "auto":
            return self.loss_type != "dr_grpo"
        return self.scale_rewards == "group"

    @field_validator("model", mode="before")
    @classmethod
    def _default_model(cls, value: str | None) -> str:
        return default_model_dir() if value is None else value

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no(cls, value: Any) -> Any:
        # YAML 1.1 (PyYAML) reads an unquoted ``mixed_precision: no`` as False
        return "no" if value is False else value

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.micro_batch_size > self.batch_size:
            raise ValueError(
                f"micro_batch_size ({self.micro_batch_size}) is larger than batch_size "
                f"({self.batch_size}); lower micro_batch_size or raise batch_size")
        low = self.clip_eps if self.clip_eps_low is None else self.clip_eps_low
        if low >= 1 and self.loss_type != "cispo":
            raise ValueError(
                f"clip_eps_low ({low}) must be < 1 (the ratio is clipped at 1 - clip_eps_low); "
                "only --loss-type cispo accepts >= 1 (no lower bound)")
        if self.vllm_url is not None and self.weight_sync == "restart":
            raise ValueError(
                "weight_sync=restart needs the trainer to own vLLM; drop --vllm-url or use "
                "--weight-sync reload")
        if self.weight_transport == "nccl" and (self.vllm_url is None
                                                or self.weight_sync not in ("auto", "reload")):
            raise ValueError("weight_transport=nccl sends weights to atropos-inference-node nodes "
                             "started with --weight-transfer nccl: set --vllm-url to them and "
                             "--weight-sync reload")
        if self.rollout_engine == "hf" and (self.vllm_url is not None
                                            or self.weight_sync not in ("auto", "none")):
            raise ValueError("rollout_engine=hf samples from the trainer's own weights: it needs "
                             "no vLLM and no weight sync; drop --vllm-url and --weight-sync, or "
                             "use --rollout-engine vllm")
        if self.weight_sync == "lora" and not self.lora_r:
            raise ValueError("weight_sync=lora needs a LoRA run; set --lora-r (e.g. 16) or use "
                             "--weight-sync reload")
        if self.resume and self.run_dir and Path(self.resume).resolve() != Path(self.run_dir).resolve():
            raise ValueError(f"resume ({self.resume}) and run_dir ({self.run_dir}) differ; a "
                             "resumed run continues in its own directory, drop --run-dir")
        return self
