"""Names of the env command line's option namespaces (``--env.group_size``, ``--openai.base_url``).

The env CLI and YAML use them; code written for Atropos 0.4 imports them from this path.
"""

#: Prefix of the env-config options: ``--env.<field>`` and the YAML ``env:`` section.
ENV_NAMESPACE = "env"
#: Prefix of the inference-server options: ``--openai.<field>`` and the YAML ``openai:`` section.
OPENAI_NAMESPACE = "openai"
#: Separator between a namespace and a field name in a flag (``env.group_size``).
NAMESPACE_SEP = "."
#: Atropos 0.4's prefix for server-manager options, kept for code that imports it. The env CLI
#: here takes those options without a prefix (``--slurm``, ``--testing``, ``--proxy_url``).
SERVER_MANAGER_NAMESPACE = "server"

__all__ = ["ENV_NAMESPACE", "NAMESPACE_SEP", "OPENAI_NAMESPACE", "SERVER_MANAGER_NAMESPACE"]
