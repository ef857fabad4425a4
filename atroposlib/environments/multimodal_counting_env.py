"""Multimodal counting: "how many red circles?" about Pillow-drawn images sent as data URIs."""

from __future__ import annotations

import base64
import io
import random
import re
from typing import Any

from pydantic import Field

from atroposlib.envs.groups import new_group
from atroposlib.envs.scoring import extract_answer_tag
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

COLORS = {"red": (220, 30, 30), "green": (30, 160, 60), "blue": (40, 70, 220),
          "yellow": (235, 200, 20)}
SHAPES = ("circle", "square", "triangle")
BACKGROUND = (255, 255, 255)
#: Placeholder for the image in the text-only transcript used for tokens/masks.
IMAGE_PLACEHOLDER = "<image>"


def draw_scene(rng: random.Random, image_size: int, grid: int, max_objects: int):
    """Draw shapes on a ``grid x grid`` board, at most one per cell, without overlap.

    Returns:
        ``(PIL.Image, objects)`` with objects as ``[(row, col, color, shape)]``.
    """
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    pen = ImageDraw.Draw(image)
    cell = image_size // grid
    cells = rng.sample([(r, c) for r in range(grid) for c in range(grid)],
                       rng.randint(1, min(max_objects, grid * grid)))
    objects = []
    for row, col in cells:
        color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
        pad = max(2, cell // 6)
        box = (col * cell + pad, row * cell + pad, (col + 1) * cell - pad, (row + 1) * cell - pad)
        if shape == "circle":
            pen.ellipse(box, fill=COLORS[color])
        elif shape == "square":
            pen.rectangle(box, fill=COLORS[color])
        else:
            pen.polygon([((box[0] + box[2]) // 2, box[1]), (box[0], box[3]), (box[2], box[3])],
                        fill=COLORS[color])
        objects.append((row, col, color, shape))
    return image, objects


def to_data_uri(image: Any) -> str:
    """PNG-encode a PIL image as a ``data:image/png;base64,...`` URI."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def make_item(rng: random.Random, image_size: int, grid: int, max_objects: int) -> dict[str, Any]:
    """One question: ``{"image", "question", "answer", "color", "shape"}``.

    The asked-about (color, shape) is usually present; sometimes any (count may be 0).
    """
    image, objects = draw_scene(rng, image_size, grid, max_objects)
    if rng.random() < 0.8:
        _, _, color, shape = rng.choice(objects)
    else:
        color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
    answer = sum(1 for _, _, c, s in objects if c == color and s == shape)
    question = (f"How many {color} {shape}s are in the image? Give only the number inside "
                "<answer></answer>.")
    return {"image": to_data_uri(image), "question": question, "answer": answer,
            "color": color, "shape": shape}


def score_count(text: str, answer: int) -> float:
    """1.0 when the number in ``<answer>`` equals the true count, else 0.0."""
    tagged = extract_answer_tag(text)
    numbers = re.findall(r"\d+", tagged or "")
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0


class MultimodalCountingConfig(SingleTurnEnvConfig):
    """Settings of :class:`MultimodalCountingEnv`."""

    image_size: int = Field(default=256, ge=32, description="Image width = height, pixels.")
    grid: int = Field(default=4, ge=2, le=10, description="Board cells per side.")
    max_objects: int = Field(default=8, ge=1, description="Shapes per image at most.")
    max_tokens: int = Field(default=64, ge=1, description="Completion budget per rollout.")
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")
    seed: int = Field(default=0, description="Seed of the scene generator.")
    eval_size: int = Field(default=30, ge=1, description="Questions in evaluate.")


class MultimodalCountingEnv(SingleTurnEnv):
    """Image + text questions via OpenAI ``image_url`` parts; images posted with the group.

    Needs a vision-language model behind an OpenAI-compatible server (e.g. vLLM serving
    Qwen2-VL); the bundled SmolLM2 is text-only. Completions come through plain
    ``chat_completion`` (image tokens are the server's), so groups carry ``tokens``/``masks``
    of the text transcript with the image replaced by ``<image>``, ``images`` (one data URI per
    sequence) and no ``inference_logprobs``.
    """

    name = "multimodal_counting"
    env_config_cls = MultimodalCountingConfig
    server_defaults = {"server_type": "openai"}

    def train_item(self, index: int, rng: random.Random | None = None) -> dict[str, Any]:
        """A fresh scene from ``rng`` (default the seeded ``self.rng``)."""
        c = self.config
        return make_item(rng or self.rng, c.image_size, c.grid, c.max_objects)

    async def setup(self) -> None:
        eval_rng = random.Random(self.config.seed + 1_000_003)
        self.eval_items = [self.train_item(i, eval_rng) for i in range(self.config.eval_size)]

    def prompt(self, item):
        return [{"role": "user", "content": [
            {"type": "text", "text": item["question"]},
            {"type": "image_url", "image_url": {"url": item["image"]}},
        ]}]

    def score(self, item, completion: str) -> float:
        """:func:`score_count`: 1.0 for the right count in ``<answer>``, else 0.0."""
        return score_count(completion, item["answer"])

    def answer(self, item):
        return item["answer"]

    async def collect_trajectories(self, item):
        """Plain ``chat_completion`` (the image tokens are the server's); text-only tokens."""
        messages = self.prompt(item)
        completion = await self.server.chat_completion(
            messages=messages, n=self.config.group_size,
            max_tokens=self.config.max_tokens, temperature=self.config.temperature,
        )
        group = new_group(with_logprobs=False)
        group["images"] = []
        text_prompt = [{"role": "user", "content": f"{IMAGE_PLACEHOLDER}\n{item['question']}"}]
        for choice in completion.choices:
            text = choice.message.content or ""
            tokenized = tokenize_for_trainer(
                self.tokenizer, text_prompt + [{"role": "assistant", "content": text}],
                finish_reason=str(choice.finish_reason))
            score, _ = await self.reward_for(item, text, choice.finish_reason)
            self.train_correct.append(score)
            self.train_scores.append(score)
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(score)
            group["messages"].append(messages + [{"role": "assistant", "content": text}])
            group["images"].append(item["image"])
        return group, []


if __name__ == "__main__":
    MultimodalCountingEnv.cli()
