"""Data for environments: dataset rows from the hub or local files, and synthetic words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atroposlib.errors import ConfigError

_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_rows(
    name_or_path: str,
    split: str = "train",
    config_name: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Load a dataset split as a list of row dicts, from the HF hub or a local path.

    Args:
        name_or_path: a local ``.jsonl``/``.json``/``.csv``/``.parquet`` file, a local
            directory (a ``save_to_disk`` dataset, one file per split such as
            ``train.jsonl``/``test.jsonl``, or files ``datasets`` can read), or a hub id such
            as ``"cais/mmlu"``. A name starting with ``.``, ``/`` or ``~`` is a path.
        split: split to read (ignored for single local files, which are one split).
        config_name: hub dataset configuration (e.g. ``"all"`` for MMLU).
        limit: keep at most this many rows.

    Returns:
        The rows.

    Raises:
        ConfigError: the dataset cannot be loaded; the message names it and how to fix it
            (offline runs need a local path or a cached hub dataset).
    """
    import datasets

    path = Path(name_or_path).expanduser()
    try:
        if path.is_file():
            fmt = _LOCAL_FORMATS.get(path.suffix.lower())
            if fmt is None:
                raise ConfigError(
                    f"dataset file {path} has an unknown extension; use one of "
                    f"{', '.join(_LOCAL_FORMATS)}"
                )
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
        elif path.is_dir() and (path / "dataset_info.json").exists():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split]
        elif path.is_dir() and (split_file := _split_file(path, split)) is not None:
            if split_file.stat().st_size == 0:
                return []
            ds = datasets.load_dataset(
                _LOCAL_FORMATS[split_file.suffix.lower()], data_files=str(split_file), split="train"
            )
        elif path.is_dir():
            ds = datasets.load_dataset(str(path), split=split)
        elif name_or_path.startswith((".", "/", "~")):
            raise ConfigError(
                f"dataset path {name_or_path!r} does not exist (resolved to {path.resolve()}); "
                "pass an existing file or directory with --env.dataset_name PATH (relative "
                "paths are taken from the current directory)"
            )
        else:
            ds = datasets.load_dataset(name_or_path, config_name, split=split)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the fix
        hint = (
            f"A local directory needs {split}.jsonl (or .json/.csv/.parquet) or a save_to_disk "
            "dataset"
            if path.is_dir()
            else "Pass a local JSONL file with --env.dataset_name PATH, or make the hub dataset "
            "available (it is not cached while HF_DATASETS_OFFLINE=1)"
        )
        raise ConfigError(
            f"cannot load dataset {name_or_path!r} (split {split!r}): {type(exc).__name__}: "
            f"{exc}. {hint}"
        ) from exc
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return [dict(row) for row in ds]


def _split_file(directory: Path, split: str) -> Path | None:
    """``directory/<split>.jsonl`` (or another local format), when it exists."""
    for suffix in _LOCAL_FORMATS:
        candidate = directory / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def maybe_json(value: Any) -> Any:
    """Decode ``value`` when it is a JSON string (hub datasets often store lists as text)."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("[", "{"):
            return json.loads(stripped)
    return value


_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t",
           "v", "w", "z", "br", "cr", "dr", "st", "str", "tr", "pl", "gr", "sh", "ch", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "y", "ee", "oo", "ai", "ea"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "rr", "ss", "ll", "ck", "st", "nd"]


def make_word(rng: Any, min_len: int, max_len: int) -> str:
    """A pronounceable pseudo-word of ``min_len..max_len`` letters (no word list needed)."""
    target = rng.randint(min_len, max_len)
    word = ""
    while len(word) < target:
        word += rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
    return word[:target]


__all__ = ["load_rows", "make_word", "maybe_json"]
