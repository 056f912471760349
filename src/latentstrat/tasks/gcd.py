"""gcd_computation: greatest common divisor of two different numbers 10..99.

x: `gcd 4 8 , 1 8`. `euclid_remainder`: `4 8 mod 1 8 = 1 2 ; 1 8 mod 1 2 = 6 ; 1 2 mod 6 = 0
; answer 6` (when the first number is the smaller, the first step swaps them: `1 8 mod 4 8 =
1 8`). `prime_factors`: factor both numbers, then the common factors:
`4 8 = 2 x 2 x 2 x 2 x 3 ; 1 8 = 2 x 3 x 3 ; common 2 x 3 ; answer 6` (`common 1` when there
is none). Euclid by subtraction is left out on purpose: its trace length is unbounded (gcd of
9 7 and 1 0 takes 1 6 subtractions) and records must stay short. The third token (`mod` vs
`=`) decides the strategy; traces never coincide.
"""

from __future__ import annotations

import math

from latentstrat.tasks.base import ANSWER, SEP, Task, digits


def remainder_steps(a: int, b: int) -> list[tuple[int, int, int]]:
    steps = []
    while b:
        steps.append((a, b, a % b))
        a, b = b, a % b
    return steps


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def common_factors(a: list[int], b: list[int]) -> list[int]:
    rest, out = list(b), []
    for p in a:
        if p in rest:
            rest.remove(p)
            out.append(p)
    return out


def _product(fs: list[int]) -> str:
    return " x ".join(digits(f) for f in fs) if fs else "1"


class GcdComputation(Task):
    name = "gcd_computation"
    strategies = ("euclid_remainder", "prime_factors")

    def sample_input(self, rng):
        while True:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if a != b:
                return f"gcd {digits(a)} , {digits(b)}"

    def _parse(self, x: str) -> tuple[int, int]:
        w = x.split()
        if len(w) < 4 or w[0] != "gcd" or "," not in w:
            raise ValueError(f"{self.name}: malformed input {x!r}")
        k = w.index(",")
        return int("".join(w[1:k])), int("".join(w[k + 1 :]))

    def answer(self, x):
        return digits(math.gcd(*self._parse(x)))

    def render(self, x, strategy):
        self.check_strategy(strategy)
        a, b = self._parse(x)
        if strategy == "euclid_remainder":
            steps = [f"{digits(p)} mod {digits(q)} = {digits(r)}" for p, q, r in remainder_steps(a, b)]
        else:
            fa, fb = prime_factors(a), prime_factors(b)
            steps = [
                f"{digits(a)} = {_product(fa)}",
                f"{digits(b)} = {_product(fb)}",
                f"common {_product(common_factors(fa, fb))}",
            ]
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])
