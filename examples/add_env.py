"""examples/add_env.py: reward a model for adding two numbers."""
import random
import re

from atroposlib.envs import SingleTurnEnv


class AddEnv(SingleTurnEnv):
    """What is a + b? Reward 1 for the right sum, else 0."""

    name = "add"

    async def setup(self):
        rng = random.Random(0)
        problems = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(1000)]
        self.train_items, self.eval_items = problems[:900], problems[900:]

    def prompt(self, item):
        a, b = item
        return [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]

    def score(self, item, completion):
        numbers = re.findall(r"-?\d+", completion)
        return 1.0 if numbers and int(numbers[-1]) == sum(item) else 0.0

    def answer(self, item):  # optional: the reference answer, kept in eval samples
        return sum(item)


if __name__ == "__main__":
    AddEnv.cli()
