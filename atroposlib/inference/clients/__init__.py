"""Inference clients: how environments reach OpenAI-compatible servers.

* :mod:`.base`: the client base class (retries, semaphores, health) and its config models.
* :mod:`.openai_client`, :mod:`.vllm_client`, :mod:`.sglang_client`, :mod:`.trl_vllm_client`:
  one client per server type.
* :mod:`.manager`: ``ServerManager``, the load balancer across servers; :mod:`.routing`:
  which server a request goes to.
* :mod:`.managed`: ``ManagedServer``, exact token ids and logprobs across turns;
  :mod:`.chat_template` renders its prompts, :mod:`.sequence_node` holds its nodes.
* :mod:`.resolve`: building server configs from flags and config files.
* :mod:`.tool_call_translator`: tool calls between OpenAI messages and raw text.
"""
