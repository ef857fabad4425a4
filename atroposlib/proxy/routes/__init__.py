"""The proxy's routers, one per resource.

``service`` (health, models, backends), ``sessions`` (open, list, read nodes, delete) and
``completions`` (tracked OpenAI generation).
"""
