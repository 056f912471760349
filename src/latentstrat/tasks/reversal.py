"""list_reversal: reverse a list of 4-6 digits.

x: `reverse 3 8 1 9 4`. `swap_ends`: swap the outermost pair not yet swapped, writing the
list after each swap: `4 8 1 9 3 ; 4 9 1 8 3 ; answer 4 9 1 8 3`. `take_last`: build the
result by taking digits from the end, writing the growing prefix: `4 ; 4 9 ; 4 9 1 ; 4 9 1 8 ;
4 9 1 8 3 ; answer 4 9 1 8 3`. Traces never coincide (the first step has n tokens vs 1).
"""

from __future__ import annotations

from latentstrat.tasks.base import ANSWER, SEP, Task

MIN_LEN, MAX_LEN = 4, 6


class ListReversal(Task):
    name = "list_reversal"
    strategies = ("swap_ends", "take_last")

    def sample_input(self, rng):
        return "reverse " + " ".join(str(rng.randrange(10)) for _ in range(rng.randint(MIN_LEN, MAX_LEN)))

    def _parse(self, x: str) -> list[str]:
        w = x.split()
        if len(w) < 3 or w[0] != "reverse" or not all(len(d) == 1 and d.isdigit() for d in w[1:]):
            raise ValueError(f"{self.name}: malformed input {x!r}")
        return w[1:]

    def answer(self, x):
        return " ".join(self._parse(x)[::-1])

    def render(self, x, strategy):
        self.check_strategy(strategy)
        a = self._parse(x)
        if strategy == "swap_ends":
            steps = []
            for i in range(len(a) // 2):
                a[i], a[-1 - i] = a[-1 - i], a[i]
                steps.append(" ".join(a))
        else:
            r = a[::-1]
            steps = [" ".join(r[:i]) for i in range(1, len(r) + 1)]
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])
