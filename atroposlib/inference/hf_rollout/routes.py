"""The in-process sampler's routes: completions, chat completions, models and health.

Answers have the shapes vLLM's OpenAI-compatible server gives (``token_id:N`` tokens with
``return_tokens_as_token_ids``, the sampled EOS among the tokens, stop strings cut from the
text), and every completion carries ``X-Atropos-Policy-Version``: the trainer step of the
weights that sampled it (the oldest, when one request held several prompts).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from atroposlib.errors import AtroposError
from atroposlib.inference.hf_rollout.engine import HFRollout
from atroposlib.inference.hf_rollout.generate import Sample, SamplingParams, completion_text
from atroposlib.inference.hf_rollout.wire import ChatCompletionRequest, CompletionRequest
from atroposlib.inference.policy_version import POLICY_VERSION_HEADER

completions = APIRouter(tags=["completions"])
chat = APIRouter(tags=["chat"])
models = APIRouter(tags=["models"])


class WrongModel(AtroposError, LookupError):
    """A request named a model this server does not serve (a 404, as vLLM answers it)."""


def engine_of(request: Request) -> HFRollout:
    """The :class:`HFRollout` the app was built for."""
    return request.app.state.engine


def sampling_params(req: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    """The request's sampling settings with vLLM's defaults (temperature 1, top-p 1, no top-k)."""
    return SamplingParams(
        n=req.n, max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p, top_k=-1 if req.top_k is None else req.top_k,
        stop=req.stop_strings(), seed=req.seed)


def check_model(engine: HFRollout, name: str | None) -> None:
    """Raise :class:`WrongModel` unless ``name`` is None or the served name."""
    if name is not None and name != engine.model_name:
        raise WrongModel(f"The model `{name}` does not exist: this trainer serves `{engine.model_name}`")


def token_label(engine: HFRollout, token: int, as_ids: bool) -> str:
    """A token as the answer names it: ``token_id:N`` or its decoded text."""
    return f"token_id:{token}" if as_ids else engine.tokenizer.decode([token])


async def run_generation(engine: HFRollout, prompt_ids: list[int],
                         params: SamplingParams) -> tuple[list[Sample], int]:
    """:meth:`HFRollout.generate` in a worker thread (the event loop keeps answering ``/health``)."""
    return await anyio.to_thread.run_sync(engine.generate, prompt_ids, params)


def usage(prompt_tokens: int, samples: list[Sample]) -> dict[str, int]:
    """OpenAI's ``usage`` block."""
    completion = sum(len(s.tokens) for s in samples)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


@completions.post("/v1/completions")
async def create_completion(req: CompletionRequest, request: Request) -> Response:
    """Sample ``n`` completions of each prompt (text or token ids)."""
    engine = engine_of(request)
    check_model(engine, req.model)
    prompts = [engine.text_prompt(p) if isinstance(p, str) else [int(t) for t in p] for p in req.prompts()]
    budgets = [engine.budget(ids, req.max_tokens or 16) for ids in prompts]  # all checked first
    # together, so the engine batches them into one generate call
    answers = await asyncio.gather(*(run_generation(engine, ids, sampling_params(req, budget))
                                     for ids, budget in zip(prompts, budgets, strict=True)))
    choices: list[dict[str, Any]] = []
    every: list[Sample] = []
    versions = [version for _, version in answers]
    prompt_tokens = sum(len(ids) for ids in prompts)
    for samples, _ in answers:
        every += samples
        for s in samples:
            logprobs = None
            if req.logprobs is not None:
                labels = [token_label(engine, t, req.return_tokens_as_token_ids) for t in s.tokens]
                offsets, at = [], 0
                for label in labels:
                    offsets.append(at)
                    at += len(label)
                logprobs = {"tokens": labels, "token_logprobs": s.logprobs,
                            "top_logprobs": [{lab: lp} for lab, lp in zip(labels, s.logprobs, strict=True)],
                            "text_offset": offsets}
            choices.append({"index": len(choices), "text": completion_text(engine.tokenizer, s),
                            "logprobs": logprobs, "finish_reason": s.finish_reason,
                            "stop_reason": s.stop_text})
    body = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": engine.model_name, "choices": choices, "usage": usage(prompt_tokens, every)}
    return JSONResponse(body, headers={POLICY_VERSION_HEADER: str(min(versions))})


@chat.post("/v1/chat/completions")
async def create_chat_completion(req: ChatCompletionRequest, request: Request) -> Response:
    """Sample ``n`` replies to a conversation rendered with the tokenizer's chat template."""
    engine = engine_of(request)
    check_model(engine, req.model)
    ids = engine.chat_prompt(req.messages, req.add_generation_prompt, req.chat_template_kwargs)
    params = sampling_params(req, engine.budget(ids, req.max_completion_tokens or req.max_tokens))
    samples, version = await run_generation(engine, ids, params)
    choices = []
    for i, s in enumerate(samples):
        logprobs = None
        if req.logprobs:
            labels = [token_label(engine, t, req.return_tokens_as_token_ids) for t in s.tokens]
            logprobs = {"content": [{"token": lab, "logprob": lp, "bytes": list(lab.encode()),
                                     "top_logprobs": []}
                                    for lab, lp in zip(labels, s.logprobs, strict=True)]}
        choices.append({"index": i, "message": {"role": "assistant",
                                                "content": completion_text(engine.tokenizer, s)},
                        "logprobs": logprobs, "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_text})
    body = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": engine.model_name, "choices": choices,
            "usage": usage(len(ids), samples)}
    return JSONResponse(body, headers={POLICY_VERSION_HEADER: str(version)})


@models.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The one model served: the policy being trained."""
    engine = engine_of(request)
    return {"object": "list", "data": [{"id": engine.model_name, "object": "model",
                                        "created": int(time.time()), "owned_by": "atroposlib",
                                        "max_model_len": engine.max_model_len}]}


@models.get("/health")
async def health() -> Response:
    """200 while the server runs (answered between generations too)."""
    return Response(status_code=200)


__all__ = ["WrongModel", "chat", "completions", "models", "sampling_params"]
