"""Inference infrastructure: the bundled model and local vLLM process control."""
