"""vf-echo-chat: a scripted user asks for one word per turn (multi-turn), verifiers 0.4 style.

Each task is a short conversation: the user's turns come from the task row, the assistant
answers each; the reward is the fraction of turns whose reply contains the requested word.
"""

import verifiers.v1 as vf

WORDS = [["red", "blue", "green"], ["one", "two"], ["sun", "moon", "star"], ["dog", "cat"]]


class EchoData(vf.TaskData):
    info: dict
    """{"words": [...]} — the word each user turn asks for, in order."""


def ask(word: str) -> str:
    return f"Reply with the single word: {word}"


class EchoTask(vf.Task[EchoData]):
    @vf.reward(weight=1.0)
    async def echoed(self, trace: vf.Trace) -> float:
        words = self.data.info["words"]
        replies = [m.content or "" for m in trace.assistant_messages]
        hits = sum(w in (replies[i].lower() if i < len(replies) else "") for i, w in enumerate(words))
        return hits / len(words)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(len(trace.assistant_messages))


class EchoChatEnv(vf.SingleAgentEnv):
    """The scripted user: one turn per word of the task."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            for word in task.data.info["words"]:
                if (await interaction.turn(ask(word))).terminated:
                    break


class EchoChatTaskset(vf.Taskset[EchoTask, vf.TasksetConfig]):
    def load(self) -> list[EchoTask]:
        return [
            EchoTask(EchoData(idx=i, prompt=None, info={"words": words}), self.config.task)
            for i, words in enumerate(WORDS)
        ]
