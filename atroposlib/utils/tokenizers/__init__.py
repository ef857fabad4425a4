"""Tokenizer wrappers (Atropos 0.4 path): :mod:`.qwen_fixed_tokenizer`."""
