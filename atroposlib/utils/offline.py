"""The environment switches that keep every process offline and free of telemetry."""

#: Set in child processes (``atropos-launch``) and in the test session unless already set.
OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
