"""vf-reverse: reverse one word (single turn), written with verifiers 0.4 as its users do.

Local data (words.jsonl beside this file); the reward is the similarity of the tagged answer to
the reversed word, so partial answers earn partial credit.
"""

import re
from difflib import SequenceMatcher
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).with_name("words.jsonl")
SYSTEM = "Reverse the word letter by letter. Answer inside <answer></answer> tags."
TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract(reply: str | None) -> str:
    """The tagged answer, else the whole reply, stripped."""
    match = TAG.search(reply or "")
    return (match.group(1) if match else reply or "").strip()


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def similarity(self, trace: vf.Trace) -> float:
        return SequenceMatcher(None, extract(trace.last_reply), self.data.answer).ratio()

    @vf.metric
    async def tagged(self, trace: vf.Trace) -> float:
        return float(bool(TAG.search(trace.last_reply or "")))


class ReverseConfig(vf.TasksetConfig):
    data_file: str = str(DATA)
    """JSONL file with one {"word": ...} per line."""


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self) -> list[ReverseTask]:
        from datasets import load_dataset

        rows = load_dataset("json", data_files=self.config.data_file, split="train")
        return [
            ReverseTask(
                ReverseData(idx=i, prompt=f"Reverse: {row['word']}", system_prompt=SYSTEM,
                            answer=row["word"][::-1]),
                self.config.task,
            )
            for i, row in enumerate(rows)
        ]
