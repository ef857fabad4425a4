"""Root pytest configuration: offline switches and the shared fixture plugins."""

import os

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

pytest_plugins = ["tests.fixtures.api_server", "tests.fixtures.inference"]
