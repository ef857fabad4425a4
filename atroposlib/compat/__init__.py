"""Atropos 0.4 compatibility in one place.

* :mod:`atroposlib.compat.aliases`: the one table of Atropos 0.4 module paths whose code moved
  here (each old path is the same module object as its new home) and of the names upstream's
  modules only imported, served by one import hook that ``import atroposlib`` installs.
* :mod:`atroposlib.compat.managed_server_proxy`, :mod:`atroposlib.compat.proxy_client`:
  upstream's module layouts over our proxy.
"""
