"""Root pytest configuration: offline switches and the shared fixture plugins."""

import os

from atroposlib.utils.offline import OFFLINE_ENV

for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

pytest_plugins = ["tests.fixtures.api_server", "tests.fixtures.inference"]
