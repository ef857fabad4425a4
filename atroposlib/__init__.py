"""atroposlib: an async RL framework for LLMs (trajectory API, environments, GRPO trainer).

Wire- and import-compatible with Atropos 0.4. Heavy dependencies (torch, vllm, gradio, wandb)
are imported lazily by the modules that need them, so ``import atroposlib`` stays fast.
Atropos 0.4's module paths whose code lives elsewhere here resolve through one import hook
(:mod:`atroposlib.compat.aliases`), installed here.
"""

from atroposlib.compat.aliases import install as _install_aliases

_install_aliases()

__version__ = "0.5.0"

__all__ = ["__version__"]
