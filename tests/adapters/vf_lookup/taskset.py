"""vf-lookup: answer with a code only a tool knows (a tool environment), verifiers 0.4 style."""

import verifiers.v1 as vf

from tests.adapters.vf_lookup.tools import CODES, CodeToolset


class LookupTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class LookupData(vf.TaskData):
    answer: str


class LookupTask(vf.Task[LookupData, vf.State, LookupTaskConfig]):
    @classmethod
    def toolsets(cls, config: LookupTaskConfig) -> list[vf.Toolset]:
        return [CodeToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))


class LookupConfig(vf.TasksetConfig):
    task: LookupTaskConfig = LookupTaskConfig()


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self) -> list[LookupTask]:
        return [
            LookupTask(
                LookupData(idx=i, prompt=f"Use the codes_lookup tool to find the code of {color}, "
                           "then reply with the code.", answer=code),
                self.config.task,
            )
            for i, (color, code) in enumerate(CODES.items())
        ]
