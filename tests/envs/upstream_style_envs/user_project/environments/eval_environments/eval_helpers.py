"""Shared helpers other env files import as environments.eval_environments.eval_helpers."""

import re
from typing import Optional

ANSWER_PROMPT = "Think briefly, then give the final answer inside <answer></answer> tags."


def extract_answer(text: str) -> Optional[str]:
    match = re.search(r"<answer>\s*(.*?)\s*</answer>", text, re.DOTALL)
    return match.group(1).strip().lower() if match else None
