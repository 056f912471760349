"""multidigit_addition: add two 2-digit numbers (the renderers take any lengths).

x: `add 4 7 2 + 3 8 9` (3 digits here; the sampler draws 2-digit operands). y, `right_to_left`:
column sums from the units up, with the carry written when it is 1:
`2 + 9 = 1 1 ; 7 + 8 + 1 = 1 6 ; 4 + 3 + 1 = 8 ; answer 8 6 1`.
`left_to_right`: add the second number one place value at a time, highest first, writing the
running total: `+ 3 0 0 = 7 7 2 ; + 8 0 = 8 5 2 ; + 9 = 8 6 1 ; answer 8 6 1`. The first
token (a digit vs `+`) decides the strategy; traces never coincide.
"""

from __future__ import annotations

from latentstrat.tasks.base import ANSWER, SEP, Task, digits

# 2-digit operands: with 3-digit ones the left_to_right running totals need carries across
# three places and the 1 M-parameter default model stayed below 0.1 answer accuracy
OPERAND_DIGITS = 2


class MultidigitAddition(Task):
    name = "multidigit_addition"
    strategies = ("right_to_left", "left_to_right")

    def sample_input(self, rng):
        a, b = (rng.randrange(10 ** (OPERAND_DIGITS - 1), 10**OPERAND_DIGITS) for _ in range(2))
        return f"add {digits(a)} + {digits(b)}"

    def _parse(self, x: str) -> tuple[int, int]:
        w = x.split()
        if len(w) < 4 or w[0] != "add" or "+" not in w:
            raise ValueError(f"{self.name}: malformed input {x!r}")
        k = w.index("+")
        return int("".join(w[1:k])), int("".join(w[k + 1 :]))

    def answer(self, x):
        a, b = self._parse(x)
        return digits(a + b)

    def render(self, x, strategy):
        self.check_strategy(strategy)
        a, b = self._parse(x)
        steps = []
        if strategy == "right_to_left":
            da, db = str(a)[::-1], str(b)[::-1]
            carry = 0
            for i in range(max(len(da), len(db))):
                terms = [int(d[i]) for d in (da, db) if i < len(d)] + ([1] if carry else [])
                s = sum(terms)
                steps.append(" + ".join(map(str, terms)) + f" = {digits(s)}")
                carry = s // 10
        else:
            total, db = a, str(b)
            for i, d in enumerate(db):
                part = int(d) * 10 ** (len(db) - 1 - i)
                total += part
                steps.append(f"+ {digits(part)} = {digits(total)}")
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])
