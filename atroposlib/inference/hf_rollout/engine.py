"""What one request runs: prompt checks, a turn on the weights, an isolated RNG, generation."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from atroposlib.errors import AtroposError
from atroposlib.inference.hf_rollout.generate import (
    Sample,
    SamplingParams,
    eos_token_ids,
    sample_batch,
)
from atroposlib.inference.hf_rollout.turns import Turns


class BadPrompt(AtroposError, ValueError):
    """A prompt this server cannot sample from (a 400, as vLLM answers it); the message says why."""


class PromptTooLong(BadPrompt):
    """The prompt plus ``max_tokens`` exceed the context."""


#: Most rows (completions) one ``generate`` call runs: the batch's KV cache and one step's
#: log-softmax grow with it (64 rows of SmolLM2-135M: about 13 MB a step).
MAX_BATCH_ROWS = 64


@dataclass
class _Request:
    """A request waiting for its completions."""

    prompt_ids: list[int]
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    samples: list[Sample] | None = None
    version: int = 0
    error: BaseException | None = None

    def batch_key(self) -> tuple[Any, ...] | None:
        """Requests with equal keys can share one ``generate`` call (None: this one runs alone)."""
        p = self.params
        return None if p.seed is not None else (p.temperature, p.top_p, p.top_k, p.stop)

    def rows(self) -> int:
        """Rows it takes in a batch (greedy: one, repeated)."""
        return 1 if self.params.temperature == 0 else self.params.n


class HFRollout:
    """Samples from the trainer's live policy, one generation at a time, between training steps.

    The trainer holds :attr:`turns` ``.training()`` around each optimizer step and then calls
    :meth:`set_version`; every generation holds ``.sampling()``, so a completion comes from
    one policy version, the one :meth:`generate` returns with it.

    Requests that arrive while a generation runs are batched: the next thread to get the
    sampling turn runs every waiting request with the same temperature, top-p, top-k and stop
    strings (up to :data:`MAX_BATCH_ROWS` rows) in one ``generate`` call, and hands each its
    completions: the groups an environment keeps in flight share one pass over the weights per
    generated token.

    Sampling draws from a random stream of its own (``seed`` in the constructor; a request's
    ``seed`` starts a stream of its own for that request). It never draws from, or moves,
    torch's global generator, which the training step (and its replay) own.
    """

    def __init__(self, model: Any, tokenizer: Any, *, model_name: str, max_model_len: int,
                 version: int = 0, threads: int | None = None, seed: int = 0,
                 autocast_dtype: Any = None):
        """Wrap a loaded policy; nothing is served until :func:`~atroposlib.inference.hf_rollout.factory.create_app`.

        Args:
            model: the transformers causal LM being trained (peft-wrapped too).
            tokenizer: its tokenizer (the chat template renders chat requests).
            model_name: the name requests must ask for (``served_model_name``).
            max_model_len: prompt plus completion tokens allowed, as vLLM's ``--max-model-len``.
            version: the policy version of the weights now (the trainer's starting step).
            threads: torch intra-op threads for generation (None: leave torch's setting).
            seed: seed of the sampler's own random stream.
            autocast_dtype: run generation under ``torch.autocast`` with this dtype, as the
                training step does (``mixed_precision: bf16`` keeps frozen weights in bf16
                and trained ones in fp32); None runs the weights as they are.
        """
        import torch

        self.model, self.tokenizer = model, tokenizer
        self.model_name, self.max_model_len = model_name, max_model_len
        self.turns = Turns()
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.threads = threads
        self.autocast_dtype = autocast_dtype
        self._version = version
        self._version_lock = threading.Lock()
        self._seed = seed
        self._rng_state = torch.Generator().manual_seed(seed).get_state()
        self._cuda_rng_state: Any = None  # the stream's CUDA half, once a CUDA model sampled
        self._waiting: list[_Request] = []  # requests no generation has taken yet
        self._waiting_lock = threading.Lock()

    @property
    def version(self) -> int:
        """The policy version (trainer step) of the weights generation uses now."""
        with self._version_lock:
            return self._version

    def set_version(self, version: int) -> None:
        """Record the trainer step the weights now hold (call inside ``turns.training()``)."""
        with self._version_lock:
            self._version = version

    def chat_prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids of ``messages`` rendered with the tokenizer's chat template.

        Raises:
            BadPrompt: the tokenizer has no chat template, or the messages do not fit it.
        """
        try:
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                **(template_kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - jinja, KeyError, ValueError: all the caller's input
            raise BadPrompt(f"the messages could not be rendered with the tokenizer's chat "
                            f"template: {exc}") from exc
        if hasattr(rendered, "keys"):  # a BatchEncoding in recent transformers
            rendered = rendered["input_ids"]
        return [int(t) for t in rendered]

    def text_prompt(self, text: str) -> list[int]:
        """Token ids of a text prompt, as vLLM encodes one (special tokens such as BOS added)."""
        return [int(t) for t in self.tokenizer.encode(text)]

    def budget(self, prompt_ids: list[int], max_tokens: int | None) -> int:
        """``max_tokens`` for this prompt (None: what the context leaves).

        Raises:
            PromptTooLong: the prompt is empty, or prompt plus ``max_tokens`` exceed the context.
            BadPrompt: a token id lies outside the model's vocabulary.
        """
        if not prompt_ids:
            raise PromptTooLong("the prompt is empty; send at least one token")
        outside = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if outside:
            raise BadPrompt(f"token ids {outside[:5]} are outside this model's vocabulary "
                            f"(0..{self.vocab_size - 1}); tokenize with the served model's tokenizer")
        room = self.max_model_len - len(prompt_ids)
        if max_tokens is None:
            max_tokens = room
        if room < 1 or max_tokens > room:
            raise PromptTooLong(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {len(prompt_ids)} and {max_tokens} more were asked for: shorten the prompt, "
                "lower max_tokens, or raise the trainer's vllm_max_model_len")
        return max_tokens

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> tuple[list[Sample], int]:
        """Sample ``params.n`` completions (in the calling thread, or batched into another's).

        Blocks while a training step holds the weights.

        Returns:
            The completions and the policy version of the weights that sampled them.
        """
        request = _Request(prompt_ids, params)
        with self._waiting_lock:
            self._waiting.append(request)
        while not request.done.is_set():
            with self.turns.sampling():
                if not request.done.is_set():  # nobody took it along: run it, with company
                    self._run(self._take(request))
        if request.error is not None:
            raise request.error
        assert request.samples is not None
        return request.samples, request.version

    def _take(self, own: _Request) -> list[_Request]:
        """``own`` and the waiting requests that can share its ``generate`` call, removed from the queue."""
        key, taken, rows = own.batch_key(), [own], own.rows()
        with self._waiting_lock:
            self._waiting.remove(own)
            if key is not None:
                for other in list(self._waiting):
                    if other.batch_key() == key and rows + other.rows() <= MAX_BATCH_ROWS:
                        self._waiting.remove(other)
                        taken.append(other)
                        rows += other.rows()
        return taken

    def _run(self, batch: list[_Request]) -> None:
        """Generate for ``batch`` (holding the sampling turn) and wake each request's thread.

        Puts the model in eval mode for the generation (the KV cache is off in train mode under
        gradient checkpointing) and back afterwards; samples from this object's own random
        stream (or a request's seed) under ``torch.random.fork_rng``.
        """
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        training = self.model.training
        device = next(self.model.parameters()).device
        cuda = [device] if device.type == "cuda" else []
        seed = batch[0].params.seed
        self.model.eval()
        try:
            autocast = torch.autocast(device.type, dtype=self.autocast_dtype,
                                      enabled=self.autocast_dtype is not None)
            with torch.random.fork_rng(devices=cuda), torch.inference_mode(), autocast:
                if seed is not None:
                    torch.manual_seed(seed)  # every device's generator
                else:
                    torch.set_rng_state(self._rng_state)
                    if cuda:
                        if self._cuda_rng_state is None:
                            torch.cuda.manual_seed(self._seed)
                        else:
                            torch.cuda.set_rng_state(self._cuda_rng_state, device)
                results = sample_batch(self.model, self.tokenizer, [r.prompt_ids for r in batch],
                                       [r.params for r in batch], self.eos_ids)
                if seed is None:
                    self._rng_state = torch.get_rng_state()
                    if cuda:
                        self._cuda_rng_state = torch.cuda.get_rng_state(device)
            version = self.version
            for request, samples in zip(batch, results, strict=True):
                request.samples, request.version = samples, version
        except BaseException as exc:  # noqa: BLE001 - every waiting request hears of it
            for request in batch:
                request.error = exc
        finally:
            self.model.train(training)
            for request in batch:
                request.done.set()


__all__ = ["BadPrompt", "HFRollout", "PromptTooLong"]
