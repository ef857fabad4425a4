"""Taxi (gymnasium ``Taxi-v4``) driven turn by turn in text: move, pick up, drop off."""

from __future__ import annotations

import re
from typing import Any

from atroposlib.environments.gym_text import GymTextEnv

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TAXI_CELL = re.compile(r"\x1b\[4[0-9]m(.)\x1b\[0m")  # the highlighted cell is the taxi
_STOPS = ["R", "G", "Y", "B"]
_STOP_CELLS = [(0, 0), (0, 4), (4, 0), (4, 3)]


class TaxiEnv(GymTextEnv):
    """Taxi-v4: -1 per step, +20 for a delivery, -10 for an illegal pick-up/drop-off.

    Score = the return over at most ``max_turns`` moves (episodes are usually cut off long
    before the 200-step limit, so shorter routes and avoiding illegal actions score higher).
    """

    name = "taxi"
    gym_id = "Taxi-v4"
    gym_kwargs = {"render_mode": "ansi"}
    actions = {"south": 0, "down": 0, "north": 1, "up": 1, "east": 2, "right": 2,
               "west": 3, "left": 3, "pickup": 4, "dropoff": 5}

    config_defaults = {"max_turns": 20}

    def intro(self) -> str:
        return (
            "You drive a taxi on a 5x5 grid (row 0 is the top, column 0 the left; '|' are "
            "walls, T is the taxi). Pick up the passenger at their stop and drop them off at the destination. "
            "Each move costs 1 point, a delivery earns 20, a wrong pickup or dropoff costs 10. "
            "Each turn, end your reply with exactly one action: north, south, east, west, "
            "pickup or dropoff."
        )

    def describe(self, game: Any, obs: Any) -> str:
        row, col, passenger, destination = game.unwrapped.decode(int(obs))
        board = _ANSI.sub("", _TAXI_CELL.sub("T", game.render() or "")).rstrip()
        if passenger == 4:
            where = "in the taxi"
        else:
            r, c = _STOP_CELLS[passenger]
            where = f"waiting at stop {_STOPS[passenger]} (row {r}, column {c})"
        dr, dc = _STOP_CELLS[destination]
        return (
            f"{board}\nThe taxi is at row {row}, column {col}. The passenger is {where}. "
            f"The destination is stop {_STOPS[destination]} (row {dr}, column {dc}). "
            "Your action?"
        )


if __name__ == "__main__":
    TaxiEnv.cli()
