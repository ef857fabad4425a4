"""The bundled environment collection: one runnable ``BaseEnv`` per module.

Installed, each runs by name (``atropos-env gsm8k serve``; ``atropos-env list`` shows them). From a
checkout, ``python environments/gsm8k_server.py serve`` runs the same class (the Atropos way).
"""
