"""The lookup tool of vf-lookup: a verifiers Toolset, served over MCP to the harness."""

import verifiers.v1 as vf

CODES = {"red": "7431", "blue": "2286", "green": "5904"}


class CodeToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "codes"

    @vf.tool
    def lookup(self, color: str) -> str:
        """The secret code of a color."""
        return CODES.get(color.strip().lower(), "no such color")


if __name__ == "__main__":
    CodeToolset.run()
