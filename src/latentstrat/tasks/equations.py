"""linear_equations: solve a x + b = c x + d (a > c >= 1, b in 1..12, integer solution 1..9).

x: `solve 5 x + 3 = 2 x + 1 2`. `x_terms_first` collects the x terms, then the constants:
`5 x - 2 x + 3 = 1 2 ; 3 x + 3 = 1 2 ; 3 x = 1 2 - 3 ; 3 x = 9 ; x = 9 / 3 ; answer 3`.
`constants_first` moves the constant first:
`5 x = 2 x + 1 2 - 3 ; 5 x = 2 x + 9 ; 5 x - 2 x = 9 ; 3 x = 9 ; x = 9 / 3 ; answer 3`.
The third token (`-` vs `=`) decides the strategy; traces never coincide.
"""
from __future__ import annotations

from latentstrat.tasks.base import ANSWER, SEP, Task, digits


class LinearEquations(Task):
    name = "linear_equations"
    strategies = ("x_terms_first", "constants_first")

    def sample_input(self, rng):
        a = rng.randint(2, 9)
        c = rng.randint(1, a - 1)
        b, sol = rng.randint(1, 12), rng.randint(1, 9)
        d = b + (a - c) * sol
        return f"solve {digits(a)} x + {digits(b)} = {digits(c)} x + {digits(d)}"

    def _parse(self, x: str) -> tuple[int, int, int, int]:
        w = x.split()
        try:
            k = w.index("=")
            left, right = w[1:k], w[k + 1:]
            a, b = _side(left)
            c, d = _side(right)
        except ValueError:
            raise ValueError(f"{self.name}: malformed input {x!r}") from None
        if w[0] != "solve" or a <= c:
            raise ValueError(f"{self.name}: malformed input {x!r}")
        return a, b, c, d

    def answer(self, x):
        a, b, c, d = self._parse(x)
        return digits((d - b) // (a - c))

    def render(self, x, strategy):
        self.check_strategy(strategy)
        a, b, c, d = self._parse(x)
        A, B, C, D, k = digits(a), digits(b), digits(c), digits(d), digits(a - c)
        if strategy == "x_terms_first":
            steps = [f"{A} x - {C} x + {B} = {D}", f"{k} x + {B} = {D}", f"{k} x = {D} - {B}"]
        else:
            steps = [f"{A} x = {C} x + {D} - {B}", f"{A} x = {C} x + {digits(d - b)}", f"{A} x - {C} x = {digits(d - b)}"]
        steps += [f"{k} x = {digits(d - b)}", f"x = {digits(d - b)} / {k}"]
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])


def _side(words: list[str]) -> tuple[int, int]:
    """`5 x + 3` -> (5, 3)."""
    i = words.index("x")
    if words[i + 1] != "+":
        raise ValueError(words)
    return int("".join(words[:i])), int("".join(words[i + 2:]))
