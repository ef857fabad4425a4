"""Data for the word games (a plain module next to the env, imported by its dotted path)."""

WORDS = ["amber", "bridge", "candle", "dune", "ember", "fjord", "glacier", "harbor"]
