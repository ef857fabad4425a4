"""Sampling inside the trainer's process: an OpenAI-compatible server on the live policy.

With ``rollout_engine: hf`` the trainer starts no vLLM. It serves ``/v1/completions`` and
``/v1/chat/completions`` itself, from a thread of its own process, with transformers'
``generate`` on the very weights it trains: no second copy of the model, no weight sync, two
Python processes fewer. Sampling is slower than vLLM's (no continuous batching, no paged KV
cache); it is the mode for a machine where memory, not speed, is short (TRL's own CPU
generation works the same way).

Layout, as in :mod:`atroposlib.api`: :mod:`.wire` holds the request types, :mod:`.generate`
the pure sampling function, :mod:`.turns` the lock by which sampling and training take turns
on the weights, :mod:`.engine` what a request runs, :mod:`.app` the app factory and its
routes, :mod:`.server` the uvicorn thread.
"""
