"""Blackjack (gymnasium ``Blackjack-v1``) played turn by turn in text: hit or stick."""

from __future__ import annotations

from typing import Any

from atroposlib.environments.gym_text import GymTextEnv


def _card(value: int) -> str:
    return "A" if value == 1 else str(value)


class BlackjackEnv(GymTextEnv):
    """Blackjack against the dealer; score = +1 win, -1 loss, 0 draw (+ invalid penalties)."""

    name = "blackjack"
    gym_id = "Blackjack-v1"
    gym_kwargs = {"natural": False, "sab": False}
    actions = {"stick": 0, "stand": 0, "hit": 1}

    config_defaults = {"max_turns": 6}

    def intro(self) -> str:
        return (
            "You are playing Blackjack against the dealer. Get a hand total closer to 21 than "
            "the dealer without going over. Face cards count 10, an ace counts 1 or 11. Each "
            "turn, think briefly, then end your reply with exactly one word: hit (take a card) "
            "or stick (stop and let the dealer play)."
        )

    def describe(self, game: Any, obs: Any) -> str:
        player_sum, dealer_card, usable_ace = obs
        hand = ", ".join(_card(c) for c in game.unwrapped.player)
        ace = " (one ace counts as 11)" if usable_ace else ""
        return (
            f"Your cards: {hand}; total {player_sum}{ace}. The dealer shows {_card(dealer_card)}. "
            "hit or stick?"
        )


if __name__ == "__main__":
    BlackjackEnv.cli()
