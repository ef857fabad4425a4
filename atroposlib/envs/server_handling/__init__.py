"""Atropos 0.4's package of inference clients; the code is :mod:`atroposlib.inference.clients`.

Its modules' old paths (``server_handling.vllm_server`` ...) resolve through
:mod:`atroposlib.compat.aliases`; this package holds no code.
"""
