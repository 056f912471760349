"""linear_equations: solve a x + b = c x + d (a > c >= 1, b in 1..12, integer solution 1..9).

x: `solve 5 x + 3 = 2 x + 1 2`. Both strategies compute the same two differences, a - c and
d - b, each written next to its operands (`1 2 - 3 = 9`), in a different order.
`x_terms_first` collects the x terms, then the constants:
`5 x - 2 x = 3 x ; 3 x + 3 = 1 2 ; 1 2 - 3 = 9 ; 3 x = 9 ; x = 9 / 3 ; answer 3`.
`constants_first` moves the constant first:
`1 2 - 3 = 9 ; 5 x = 2 x + 9 ; 5 x - 2 x = 3 x ; 3 x = 9 ; x = 9 / 3 ; answer 3`.
(Data version 1 wrote `3 x = 1 2 - 3 ; 3 x = 9`, the difference several tokens after its
operands; the entangled model got it wrong in ~20% of temperature-1 samples.)
The second token (`x` vs a digit or `-`) decides the strategy; traces never coincide.
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
            left, right = w[1:k], w[k + 1 :]
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
        A, B, C, D = digits(a), digits(b), digits(c), digits(d)
        K, R = digits(a - c), digits(d - b)
        collect, constants = f"{A} x - {C} x = {K} x", f"{D} - {B} = {R}"
        if strategy == "x_terms_first":
            steps = [collect, f"{K} x + {B} = {D}", constants]
        else:
            steps = [constants, f"{A} x = {C} x + {R}", collect]
        steps += [f"{K} x = {R}", f"x = {R} / {K}"]
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])


def _side(words: list[str]) -> tuple[int, int]:
    """`5 x + 3` -> (5, 3)."""
    i = words.index("x")
    if words[i + 1] != "+":
        raise ValueError(words)
    return int("".join(words[:i])), int("".join(words[i + 2 :]))
