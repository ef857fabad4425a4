"""The environment collection: runnable ``BaseEnv`` scripts (``python environments/X.py serve``)."""
