"""The Task interface shared by every synthetic multi-strategy task.

A task turns an input x (text) into a trace y (text) by one of several strategies. All
strategies reach the same final answer, written at the end of y as `answer <tokens>`.
Text is word level: tokens are separated by single spaces, digits are separate tokens.

Subclasses define `name`, `strategies`, `sample_input(rng)`, `render(x, strategy)` and
`answer(x)`. The verifier and the matcher below parse free (possibly malformed) text and
never raise.
"""

from __future__ import annotations

import random

ANSWER = "answer"  # the token that introduces the final answer at the end of y
SEP = ";"  # separates trace steps
END_TOKENS = ("</y>", "<eos>")  # a decoded generation is cut at the first of these


def digits(n: int) -> str:
    """123 -> '1 2 3' (word-level digits)."""
    return " ".join(str(n))


def normalize(y_text) -> str | None:
    """Whitespace-normalized y, cut at the first end token; None if not text."""
    if not isinstance(y_text, str):
        return None
    words = y_text.split()
    for i, w in enumerate(words):
        if w in END_TOKENS:
            words = words[:i]
            break
    return " ".join(words)


def final_answer(y_text) -> str | None:
    """The tokens after the last `answer` token of y, or None if there is none."""
    y = normalize(y_text)
    if y is None:
        return None
    words = y.split()
    if ANSWER not in words:
        return None
    i = len(words) - 1 - words[::-1].index(ANSWER)
    return " ".join(words[i + 1 :])


class Task:
    name: str = ""
    strategies: tuple[str, ...] = ()

    def sample_input(self, rng: random.Random) -> str:
        """One input x, drawn with `rng` (a seeded `random.Random`)."""
        raise NotImplementedError

    def render(self, x: str, strategy: str) -> str:
        """The canonical trace + final answer of `strategy` on x."""
        raise NotImplementedError

    def answer(self, x: str) -> str:
        """The final answer tokens (what follows `answer` at the end of y)."""
        raise NotImplementedError

    def final_answer_correct(self, x: str, y_text) -> bool:
        """True iff y ends with `answer <the correct answer>`. Never raises on bad y."""
        got = final_answer(y_text)
        return got is not None and got == self.answer(x)

    def matching_strategies(self, x: str, y_text) -> set[str]:
        """Strategies whose canonical trace for x equals y (after normalization)."""
        y = normalize(y_text)
        if y is None:
            return set()
        return {s for s in self.strategies if self.render(x, s) == y}

    def check_strategy(self, strategy: str) -> None:
        if strategy not in self.strategies:
            raise ValueError(f"task {self.name}: unknown strategy {strategy!r} (known: {', '.join(self.strategies)})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, strategies={self.strategies})"
