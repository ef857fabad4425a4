"""Multi-turn episodes: a conversation played turn by turn inside one ``managed_server`` context."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atroposlib.type_definitions import Message


@dataclass
class Episode:
    """One multi-turn rollout through ``managed_server``.

    Attributes:
        messages: the whole conversation (system/user/assistant/tool turns).
        node: the managed sequence covering every assistant turn (masks train them all).
        turns: assistant turns taken.
        finish_reasons: ``finish_reason`` of each assistant turn.
        contiguous: True when every turn extended the previous sequence (False means the chat
            template re-rendered earlier turns differently; then only the last turn's node is
            returned and earlier turns are masked).
        out_of_context: the episode stopped early because the next turn would not fit in
            ``max_seq_len``.
        truncated: the episode used all ``max_turns`` turns and the env still had an answer
            for the last one; that answer is left out of ``messages``, since no turn of the
            trained sequence follows it.
    """

    messages: list[Message]
    node: Any
    turns: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    contiguous: bool = True
    out_of_context: bool = False
    truncated: bool = False


#: ``on_reply(text, turn) -> messages to append (the env's answer), or None to end``.
ReplyHandler = Callable[[str, int], Awaitable[list[Message] | None] | list[Message] | None]


async def run_episode(
    server: Any,
    tokenizer: Any,
    messages: Sequence[Message],
    on_reply: ReplyHandler,
    *,
    max_turns: int,
    max_tokens: int,
    temperature: float = 1.0,
    split: str = "train",
    max_seq_len: int | None = None,
) -> Episode:
    """Play a conversation turn by turn: sample, let the env answer, repeat.

    Each assistant turn is sampled with ``n=1`` inside ONE ``managed_server`` context, so the
    next prompt (previous sequence + the env's reply) extends the tracked sequence and the
    final node's masks train every assistant turn.

    Args:
        server: the env's ``ServerManager``.
        tokenizer: the policy's tokenizer.
        messages: the opening messages (system, user).
        on_reply: called with each assistant text and the 0-based turn (the last one too, so
            the env can score it); returns the messages to append (e.g. the next observation
            or a tool result), or None when the episode is over. May be async. What it
            returns for the last allowed turn is dropped (``Episode.truncated``).
        max_turns: assistant turns at most (the episode is truncated after it).
        max_tokens: tokens per assistant turn.
        temperature: sampling temperature.
        split: ``"train"`` or ``"eval"`` (which request pool and metrics to use).
        max_seq_len: stop (``Episode.out_of_context``) before a turn whose prompt plus
            ``max_tokens`` would reach this many tokens (the env's ``max_seq_len``); None = no
            check.

    Returns:
        The :class:`Episode`.
    """
    import inspect

    chat: list[Message] = [dict(m) for m in messages]  # type: ignore[misc]
    episode = Episode(messages=chat, node=None)
    async with server.managed_server(tokenizer=tokenizer) as managed:
        for turn in range(max_turns):
            if turn > 0 and max_seq_len is not None:
                prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                if len(tokenizer.encode(prompt, add_special_tokens=False)) + max_tokens >= max_seq_len:
                    episode.out_of_context = True
                    break
            completion = await managed.chat_completion(
                messages=chat, n=1, max_tokens=max_tokens, temperature=temperature,
                split=split,
            )
            choice = completion.choices[0]
            text = choice.message.content or ""
            chat.append({"role": "assistant", "content": text})
            episode.turns += 1
            episode.finish_reasons.append(str(choice.finish_reason))
            reply = on_reply(text, turn)
            if inspect.isawaitable(reply):
                reply = await reply
            if not reply:
                break
            if turn == max_turns - 1:
                # the env's answer to the last turn is never sampled against, so it is not in
                # the tokens; keeping it in the messages would make them disagree
                episode.truncated = True
                break
            chat.extend(reply)
        nodes = managed.get_state()["nodes"]
    episode.contiguous = len(nodes) == 1
    episode.node = nodes[-1]
    return episode


__all__ = ["Episode", "ReplyHandler", "run_episode"]
