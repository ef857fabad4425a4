"""Advantage and return helpers for GRPO-style training (pure numpy; shapes in docstrings).

GRPO (Shao et al. 2024, arXiv:2402.03300, section 4.1.3) normalises rewards within a group;
its process-supervision variant (section 4.1.3, "process supervision") normalises step rewards
across the group and sums the normalised rewards of the remaining steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atroposlib.type_definitions import number  # noqa: F401 - Atropos 0.4 import path

#: What the helpers accept as an array (Atropos 0.4 type names): an array, a sequence of arrays
#: or a nested sequence of numbers.
NumpyArrayLike = np.ndarray | Sequence[np.ndarray] | Sequence[Sequence]
#: A boolean vector, as returned by ``allclose_to_first(..., return_vector=True)``.
BoolVector = np.ndarray


def allclose_to_first(
    values: Any,
    rtol: float = 1e-05,
    atol: float = 1e-08,
    equal_nan: bool = False,
    return_vector: bool = False,
) -> bool | np.ndarray:
    """Compare every entry of ``values`` with ``values[0]`` using ``np.isclose``.

    Args:
        values: ``[N, ...]`` array-like (list, numpy array, tensor).
        rtol: relative tolerance.
        atol: absolute tolerance.
        equal_nan: treat NaN as equal to NaN.
        return_vector: return the per-entry result instead of a single bool.

    Returns:
        ``[N]`` numpy bool vector (first element True) when ``return_vector``, else a Python
        ``bool`` (``True``/``False`` exactly).
    """
    array = np.asarray(values)
    if array.ndim == 0:
        array = array.reshape(1)
    close = np.isclose(array, array[0], rtol=rtol, atol=atol, equal_nan=equal_nan)
    vector = close.reshape(close.shape[0], -1).all(axis=1) if close.ndim > 1 else close
    if return_vector:
        return vector
    return bool(vector.all())


def compute_stats(data: Sequence[Any]) -> dict[str, float]:
    """Mean and population variance of every number in a jagged nested list.

    ``var = E[x^2] - mean^2`` over all leaves.

    Args:
        data: nested lists of int/float of any depth and raggedness.

    Returns:
        ``{"mean": float, "var": float}``.

    Raises:
        ValueError: ``data`` holds no numbers, or holds something that is not a number/list.
    """
    total = 0.0
    total_sq = 0.0
    count = 0

    def walk(node: Any) -> None:
        nonlocal total, total_sq, count
        if isinstance(node, (list, tuple)):
            for child in node:
                walk(child)
        elif isinstance(node, (int, float, np.integer, np.floating)) and not isinstance(node, bool):
            total += float(node)
            total_sq += float(node) ** 2
            count += 1
        else:
            raise ValueError(f"compute_stats expects nested lists of numbers, found {node!r}")

    walk(data)
    if count == 0:
        raise ValueError("compute_stats got no numbers (empty input)")
    mean = total / count
    return {"mean": mean, "var": total_sq / count - mean**2}


def compute_discounted_returns(rewards: Any, gamma: float) -> Any:
    """Discounted returns ``G_t = r_t + gamma * G_{t+1}`` (backward recursion).

    Args:
        rewards: ``[T]`` rewards (list -> float32 numpy; numpy array or torch tensor kept).
        gamma: discount factor in [0, 1].

    Returns:
        ``[T]`` returns, same type and dtype as a numpy/tensor input, float32 numpy for a list.
    """
    is_tensor = hasattr(rewards, "detach") and hasattr(rewards, "numpy")
    if is_tensor:
        array = rewards.detach().cpu().numpy()
    elif isinstance(rewards, np.ndarray):
        array = rewards
    else:
        array = np.asarray(rewards, dtype=np.float32)
    returns = np.zeros_like(array)
    running = array.dtype.type(0)
    for t in range(len(array) - 1, -1, -1):
        running = array[t] + gamma * running
        returns[t] = running
    if is_tensor:
        import torch

        return torch.from_numpy(returns).to(rewards.device)
    return returns


def compute_grpo_process_supervision_advantages(
    rewards: Sequence[Sequence[float]], gamma: float | None = None, std_tol: float = 1e-8
) -> list[np.ndarray]:
    """GRPO process-supervision advantages (Shao et al. 2024, arXiv:2402.03300, sec. 4.1.3).

    Every step reward is normalised with the mean and population std of ALL step rewards in
    the group; the advantage of step t is the sum of normalised rewards from t to the end
    (``gamma=None``) or their discounted return.

    Args:
        rewards: ``[G][T_i]`` step rewards per trajectory (ragged).
        gamma: discount factor, or None for an undiscounted reverse cumulative sum.
        std_tol: minimum std; below it the rewards carry no signal.

    Returns:
        ``G`` numpy arrays, the i-th of shape ``[T_i]``.

    Raises:
        ValueError: the std of all rewards is below ``std_tol`` (e.g. all equal).
    """
    flat = np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r in rewards])
    mean, std = flat.mean(), flat.std()
    if std < std_tol:
        raise ValueError(
            f"reward std {std:.3g} < std_tol {std_tol}: all step rewards are (nearly) equal, so "
            "there is no advantage signal; drop this group"
        )
    out = []
    for trajectory in rewards:
        normalised = (np.asarray(trajectory, dtype=np.float64) - mean) / std
        if gamma is None:
            out.append(np.cumsum(normalised[::-1])[::-1].copy())
        else:
            out.append(compute_discounted_returns(normalised, gamma))
    return out


__all__ = [
    "BoolVector",
    "NumpyArrayLike",
    "allclose_to_first",
    "compute_discounted_returns",
    "compute_grpo_process_supervision_advantages",
    "compute_stats",
]
