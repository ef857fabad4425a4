"""Atropos 0.4 import paths of the inference clients; the code is :mod:`atroposlib.inference.clients`."""
