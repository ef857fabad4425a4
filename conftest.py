"""Root pytest configuration: offline switches and the shared fixture plugins."""

import os
import signal

from atroposlib.utils.offline import OFFLINE_ENV

for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

# A shell that starts pytest in the background (`cmd &` without job control) leaves SIGINT
# ignored, children inherit that, and then the Ctrl-C tests' SIGINT never reaches the tools they
# start. A Python handler here is reset to the default in every child at exec, so each child
# Python turns SIGINT into KeyboardInterrupt as it would under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# skip_policy: a skip whose reason is not "no CUDA GPU" or "no chromium" is an error, and the
# run ends with a list of every skip (tests/fixtures/skip_policy.py).
pytest_plugins = [
    "tests.fixtures.api_server",
    "tests.fixtures.inference",
    "tests.fixtures.skip_policy",
    "tests.fixtures.tiny_tokenizer",
]
