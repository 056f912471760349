"""base_conversion: write a decimal number 10..499 in base 3..9.

x: `convert 1 9 9 to base 3`. `repeated_division`: quotient and remainder of each division
by the base, the digits are the remainders read backwards:
`6 6 r 1 ; 2 2 r 0 ; 7 r 1 ; 2 r 1 ; 0 r 2 ; answer 2 1 1 0 1`.
`subtract_powers`: for each power of the base from the highest down, the power, its digit
and what remains: `8 1 x 2 r 3 7 ; 2 7 x 1 r 1 0 ; 9 x 1 r 1 ; 3 x 0 r 1 ; 1 x 1 r 0 ;
answer 2 1 1 0 1`. Traces never coincide (`r` at the third position or later vs `x`).
"""
from __future__ import annotations

from latentstrat.tasks.base import ANSWER, SEP, Task, digits


def to_base(n: int, base: int) -> list[int]:
    out = []
    while n:
        n, r = divmod(n, base)
        out.append(r)
    return out[::-1] or [0]


class BaseConversion(Task):
    name = "base_conversion"
    strategies = ("repeated_division", "subtract_powers")

    def sample_input(self, rng):
        return f"convert {digits(rng.randint(10, 499))} to base {rng.randint(3, 9)}"

    def _parse(self, x: str) -> tuple[int, int]:
        w = x.split()
        if len(w) < 5 or w[0] != "convert" or w[-3:-1] != ["to", "base"]:
            raise ValueError(f"{self.name}: malformed input {x!r}")
        return int("".join(w[1:-3])), int(w[-1])

    def answer(self, x):
        n, base = self._parse(x)
        return " ".join(map(str, to_base(n, base)))

    def render(self, x, strategy):
        self.check_strategy(strategy)
        n, base = self._parse(x)
        steps = []
        if strategy == "repeated_division":
            while n:
                n, r = divmod(n, base)
                steps.append(f"{digits(n)} r {r}")
        else:
            ds = to_base(n, base)
            for i, d in enumerate(ds):
                p = base ** (len(ds) - 1 - i)
                n -= d * p
                steps.append(f"{digits(p)} x {d} r {digits(n)}")
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])
