"""Generate the configuration reference (every env config field, its type, default and description).

The docs site's "Configuration" page is this text, generated on every ``mkdocs build``
(``docs/hooks/config_reference.py``); ``python -m atroposlib.envs.config_docs`` prints it.
"""

from __future__ import annotations

from atroposlib.utils.config_docs import model_table


def generate() -> str:
    """Return the configuration reference as Markdown."""
    from atroposlib.envs.config import BaseEnvConfig
    from atroposlib.envs.item_filter import ItemFilterConfig
    from atroposlib.envs.teacher_distillation_env import TeacherDistillationConfig
    from atroposlib.inference.clients.config import APIServerConfig, ServerBaseline
    from atroposlib.inference.clients.manager import ServerManagerConfig

    sections = [
        "# Configuration reference",
        "",
        "<!-- Generated from the config models by `python -m atroposlib.envs.config_docs` "
        "on every docs build: edit the field descriptions in the code, not this page. -->",
        "",
        "Environments read their settings in layers, lowest to highest: the env's "
        "`config_init()` < `--config FILE.yaml` (keys `env:`, `openai:`, `slurm:`, `testing:`) "
        "< command-line flags. Flags take `--flag value` or `--flag=value` (write negative "
        "numbers as `--env.x=-1` or `--env.x -1`); a boolean flag alone means true; `None` "
        "means null. Unknown keys and flags are errors.",
        "",
        "## `BaseEnvConfig` (`env:` / `--env.*`)",
        "",
        "Subclass it to add env-specific fields; they get `--env.<field>` flags too.",
        "",
        model_table(BaseEnvConfig, "env"),
        "",
        "## `ItemFilterConfig` (`env: item_filter:` / `--env.item_filter.*`)",
        "",
        "The item filter's section of every env config (guide: Difficulty filtering). In YAML "
        "a mapping under `env: item_filter:`; in Python `item_filter=ItemFilterConfig(...)` or a "
        "dict. The earlier flat keys `difficulty_filter` and `difficulty_filter_<field>` "
        "(`--env.difficulty_filter_floor 0.1`) and `zero_variance_keep` (solved_keep = "
        "failed_keep = P, floor = P**4) are still accepted, with a deprecation line in the log.",
        "",
        model_table(ItemFilterConfig, "env.item_filter"),
        "",
        "## `APIServerConfig` (`openai:` / `--openai.*`)",
        "",
        "One inference server. `openai:` in YAML may be a mapping (one server) or a list "
        "(several servers; then `--openai.*` flags are refused). A single config is used as "
        "given (its `base_url` is honoured).",
        "",
        model_table(APIServerConfig, "openai"),
        "",
        "## `ServerBaseline`",
        "",
        "The settings shared by all servers, without a URL. A bare `ServerBaseline` returned by "
        "`config_init()` means: derive the servers from SLURM variables, else use "
        "`http://localhost:9004..9007/v1`.",
        "",
        model_table(ServerBaseline, "openai"),
        "",
        "## `ServerManagerConfig` (top-level YAML keys / unprefixed flags)",
        "",
        model_table(ServerManagerConfig, None),
        "",
        "## `TeacherDistillationConfig` (extra `--env.*` of `TeacherDistillationEnv`)",
        "",
        "Envs built on `TeacherDistillationEnv` add these fields to `BaseEnvConfig`. Their "
        "`serve` and `process` commands also take the teacher's servers as `--teacher.<field>` "
        "flags or a YAML `teacher:` key (mapping or list), with the same fields as "
        "`APIServerConfig` (use `--teacher.server_type vllm`).",
        "",
        model_table(TeacherDistillationConfig, "env", exclude=BaseEnvConfig),
        "",
    ]
    return "\n".join(sections)


def main() -> None:
    """Print the configuration reference to stdout."""
    print(generate(), end="")


if __name__ == "__main__":
    main()
