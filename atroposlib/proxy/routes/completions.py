"""Tracked generation routes of one session.

``POST /{uuid}/v1/chat/completions``, ``POST /{uuid}/v1/completions`` and
``POST /{uuid}/v1/chat/completions/render``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Response

from atroposlib.errors import InferenceUnavailableError
from atroposlib.proxy.deps import ProxyStateDep
from atroposlib.proxy.errors import ProxyHTTPError
from atroposlib.proxy.models import (
    ChatCompletionRequest,
    CompletionRequest,
    RenderResponse,
)
from atroposlib.proxy.state import Session
from atroposlib.proxy.streaming import chat_completion_events

logger = logging.getLogger(__name__)
router = APIRouter(tags=["completions"])


async def generate(session: Session, call: str, kwargs: dict[str, Any]) -> Any:
    """Run ``session.managed.<call>(**kwargs)`` under the session's lock; the JSON answer.

    Raises:
        ProxyHTTPError: 400 bad input (a ``ValueError`` of the tracker), 503 backend
            unavailable, 500 any other backend failure.
    """
    async with session.lock:
        try:
            result = await getattr(session.managed, call)(**kwargs)
        except ValueError as exc:
            raise ProxyHTTPError(400, str(exc), "invalid_request_error", "invalid_request") from exc
        except InferenceUnavailableError as exc:
            raise ProxyHTTPError(503, str(exc), "server_error", "backend_unavailable") from exc
        except Exception as exc:  # noqa: BLE001 - any backend failure is a 500 in OpenAI format
            logger.exception("session %s: %s failed", session.uuid, call)
            raise ProxyHTTPError(
                500, f"inference failed: {type(exc).__name__}: {exc}", "server_error",
                "inference_failed",
            ) from exc
        finally:
            session.last_used_at = time.time()
    return result.model_dump(mode="json", exclude_none=True)


@router.post("/{session_id}/v1/chat/completions")
async def chat_completions(session_id: str, body: ChatCompletionRequest,
                           state: ProxyStateDep) -> Any:
    """OpenAI chat completion; one tracked node per choice.

    ``stream=true`` gets the same whole response as server-sent events.
    """
    session = await state.get(session_id)
    result = await generate(session, "chat_completion", body.sampling_kwargs())
    if not body.stream:
        return result
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    return Response(chat_completion_events(result, include_usage), media_type="text/event-stream")


@router.post("/{session_id}/v1/completions")
async def completions(session_id: str, body: CompletionRequest, state: ProxyStateDep) -> Any:
    """OpenAI text completion from a raw prompt; one tracked node per choice."""
    session = await state.get(session_id)
    if body.stream:
        raise ProxyHTTPError(400, "stream=true is not supported; send stream=false",
                             "invalid_request_error", "unsupported")
    kwargs = body.model_dump(exclude={"model", "stream"}, exclude_none=True)
    return await generate(session, "completion", kwargs)


@router.post("/{session_id}/v1/chat/completions/render")
async def render(session_id: str, body: ChatCompletionRequest,
                 state: ProxyStateDep) -> RenderResponse:
    """The prompt text and token ids a chat completion would send (no generation)."""
    session = await state.get(session_id)
    try:
        prompt, ids = session.managed.render_prompt(body.messages, body.tools)
    except Exception as exc:  # noqa: BLE001 - template errors are the caller's input
        raise ProxyHTTPError(400, f"chat template failed on these messages: {exc}",
                             "invalid_request_error", "template_error") from exc
    return RenderResponse(prompt_text=prompt, token_ids=ids, num_tokens=len(ids))
