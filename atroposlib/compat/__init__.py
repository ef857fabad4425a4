"""Atropos 0.4 compatibility in one place.

* :mod:`atroposlib.compat.paths`: the table of Atropos 0.4 import paths whose code moved here,
  and the stubs generated from it (each old path is the same module object as its new home).
* :mod:`atroposlib.compat.exports`: names upstream modules imported at module level (env code
  sometimes imports them from there), loaded lazily.
* :mod:`atroposlib.compat.managed_server_proxy`, :mod:`atroposlib.compat.proxy_client`:
  upstream's module layouts over our proxy.
"""
