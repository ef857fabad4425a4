"""The vf-reverse verifiers taskset as an env script, for atropos-launch (which starts scripts).

``python tests/adapters/vf_reverse_env.py serve ...`` is ``atropos-env
verifiers:tests.adapters.vf_reverse serve ...``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: `tests` imports

from atroposlib.adapters.verifiers import verifiers_env_class  # noqa: E402


class ReverseEnv(verifiers_env_class("tests.adapters.vf_reverse")):
    """vf-reverse (a verifiers 0.4 taskset) served by Atropos."""


if __name__ == "__main__":
    ReverseEnv.cli()
