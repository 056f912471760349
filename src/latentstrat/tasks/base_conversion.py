"""base_conversion: rewrite a binary number (7-11 bits) in base 4 or base 8.

x: `convert 1 0 1 1 0 1 1 to base 8`. Every base-2^k digit is one group of k bits, so both
strategies are exact bit-group lookups (8 facts), not long division: a 1 M-parameter model
learns them from a few thousand examples, which decimal -> base b conversion by repeated
division was not (docs/tasks.md: 0.04 answer accuracy after 5000 mixture steps).
`group_from_right`: cut groups of k bits from the right (lowest digit first), each with its
value: `0 1 1 = 3 ; 0 1 1 = 3 ; 1 = 1 ; answer 1 3 3`.
`pad_left`: `=` and the bits left-padded with zeros to a multiple of k, then the groups from
the left: `= 0 0 1 0 1 1 0 1 1 ; 0 0 1 = 1 ; 0 1 1 = 3 ; 0 1 1 = 3 ; answer 1 3 3`.
The first token (a bit vs `=`) decides the strategy; traces never coincide.
"""

from __future__ import annotations

from latentstrat.tasks.base import ANSWER, SEP, Task

MIN_BITS, MAX_BITS = 7, 11
BASES = {4: 2, 8: 3}  # base -> bits per digit


class BaseConversion(Task):
    name = "base_conversion"
    strategies = ("group_from_right", "pad_left")

    def sample_input(self, rng):
        n = rng.randrange(2 ** (MIN_BITS - 1), 2**MAX_BITS)
        return f"convert {' '.join(format(n, 'b'))} to base {rng.choice(sorted(BASES))}"

    def _parse(self, x: str) -> tuple[str, int]:
        w = x.split()
        if (
            len(w) < 5
            or w[0] != "convert"
            or w[-3:-1] != ["to", "base"]
            or w[-1] not in map(str, BASES)
            or not all(b in "01" for b in w[1:-3])
            or w[1] != "1"
        ):
            raise ValueError(f"{self.name}: malformed input {x!r}")
        return "".join(w[1:-3]), int(w[-1])

    def answer(self, x):
        return " ".join(str(int(g, 2)) for g in _groups(*self._parse(x)))

    def render(self, x, strategy):
        self.check_strategy(strategy)
        bits, base = self._parse(x)
        groups = _groups(bits, base)
        if strategy == "group_from_right":
            steps = [_group_step(g) for g in reversed(groups)]
            steps[-1] = _group_step(groups[0].lstrip("0"))  # unpadded: x starts with a 1 bit
        else:
            steps = ["= " + " ".join("".join(groups))] + [_group_step(g) for g in groups]
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])


def _groups(bits: str, base: int) -> list[str]:
    """The bits left-padded with zeros to a multiple of k, cut into k-bit digits (highest first)."""
    k = BASES[base]
    padded = bits.zfill(-(-len(bits) // k) * k)
    return [padded[i : i + k] for i in range(0, len(padded), k)]


def _group_step(g: str) -> str:
    return f"{' '.join(g)} = {int(g, 2)}"
