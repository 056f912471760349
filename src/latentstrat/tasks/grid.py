"""grid_pathfinding: a shortest monotone path between two cells of a 9x9 grid.

x: `path 2 5 to 6 1` (start row col, goal row col; rows grow downward). y: one segment per
axis, a direction word followed by the coordinate reached after each move along that axis,
then `answer <number of moves>`: `left 4 3 2 1 down 3 4 5 6 answer 8`. Writing the reached
coordinate makes each step local (the next coordinate is the last one +-1; a segment ends
when it equals the goal's, read off x) instead of a count of repeated `left` tokens, which
a small model miscounts (data v2: `left left left left ...`). `horizontal_first` walks the
column first, `vertical_first` the row first. When start and goal differ in row and column
the two traces differ from the first token on. A small share of inputs
(STRAIGHT_RATE) are straight lines (same row or column): both strategies give the same trace,
so these examples are ambiguous, as the design expects some to be (flagged in the data,
left out of probe labels).
"""

from __future__ import annotations

from latentstrat.tasks.base import ANSWER, Task, digits

SIZE = 9  # 5184 inputs off a straight line: 3300 examples stay ~3% ambiguous (8x8: 7%)
STRAIGHT_RATE = 0.02


class GridPathfinding(Task):
    name = "grid_pathfinding"
    strategies = ("horizontal_first", "vertical_first")

    def sample_input(self, rng):
        straight = rng.random() < STRAIGHT_RATE
        while True:
            r0, c0, r1, c1 = (rng.randrange(SIZE) for _ in range(4))
            if straight and rng.random() < 0.5:
                r1 = r0
            elif straight:
                c1 = c0
            if (r0, c0) != (r1, c1) and straight == (r0 == r1 or c0 == c1):
                return f"path {r0} {c0} to {r1} {c1}"

    def _parse(self, x: str) -> tuple[int, int, int, int]:
        w = x.split()
        if len(w) != 6 or w[0] != "path" or w[3] != "to":
            raise ValueError(f"{self.name}: malformed input {x!r}")
        return int(w[1]), int(w[2]), int(w[4]), int(w[5])

    def answer(self, x):
        r0, c0, r1, c1 = self._parse(x)
        return digits(abs(r1 - r0) + abs(c1 - c0))

    def render(self, x, strategy):
        self.check_strategy(strategy)
        r0, c0, r1, c1 = self._parse(x)
        horizontal = _segment("right", "left", c0, c1)
        vertical = _segment("down", "up", r0, r1)
        moves = horizontal + vertical if strategy == "horizontal_first" else vertical + horizontal
        return " ".join(moves + [ANSWER, self.answer(x)])


def _segment(forward: str, backward: str, start: int, goal: int) -> list[str]:
    """`right 4 5 6` for start 3, goal 6 (direction, then each reached coordinate); [] if equal."""
    if start == goal:
        return []
    step = 1 if goal > start else -1
    return [forward if step > 0 else backward] + [digits(v) for v in range(start + step, goal + step, step)]
