"""vf-duel: two trainable seats of one model (self-play), verifiers 0.4 style.

Each seat is asked for a number in its own conversation; the larger number wins the hand:
the env's ``run`` records +1 for the winner and -1 for the loser (0 each on a tie). North
answering without a number forfeits before south plays.
"""

import re

import verifiers.v1 as vf

SEATS = ("north", "south")


def number(text: str | None) -> int:
    """The first integer in ``text``; -1 when there is none."""
    found = re.search(r"\d+", text or "")
    return int(found.group()) if found else -1


class DuelConfig(vf.EnvConfig):
    north: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    south: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})


class DuelTask(vf.Task[vf.TaskData]):
    pass


class DuelEnv(vf.Env[DuelConfig]):
    async def run(self, task, agents):
        seats = [vf.Task(vf.TaskData(idx=task.data.idx, prompt=None,
                                     system_prompt=f"You sit {seat}. Name a number."))
                 for seat in SEATS]
        async with (agents.north.interaction(seats[0]) as north,
                    agents.south.interaction(seats[1]) as south):
            a = number((await north.turn("Your number?")).last_reply)
            # north forfeits a hand without a number: south never plays
            b = number((await south.turn("Your number?")).last_reply) if a >= 0 else -1
        won = float((a > b) - (a < b)) if a >= 0 else -1.0
        north.trace.record_reward("won", won)
        south.trace.record_reward("won", -won)


class DuelTaskset(vf.Taskset[DuelTask, vf.TasksetConfig]):
    def load(self) -> list[DuelTask]:
        return [DuelTask(vf.TaskData(idx=i, name=f"hand#{i}", prompt=None)) for i in range(3)]
