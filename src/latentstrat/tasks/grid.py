"""grid_pathfinding: a shortest monotone path between two cells of an 8x8 grid.

x: `path 2 5 to 6 1` (start row col, goal row col; rows grow downward). y: the moves, then
`answer <number of moves>`. `horizontal_first` makes every left/right move before the
up/down moves; `vertical_first` the other way round. Start and goal never share a row or a
column, so the two traces differ from the first move on and no example is ambiguous.
"""
from __future__ import annotations

from latentstrat.tasks.base import ANSWER, Task, digits

SIZE = 8


class GridPathfinding(Task):
    name = "grid_pathfinding"
    strategies = ("horizontal_first", "vertical_first")

    def sample_input(self, rng):
        while True:
            r0, c0, r1, c1 = (rng.randrange(SIZE) for _ in range(4))
            if r0 != r1 and c0 != c1:
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
        horizontal = ["right" if c1 > c0 else "left"] * abs(c1 - c0)
        vertical = ["down" if r1 > r0 else "up"] * abs(r1 - r0)
        moves = horizontal + vertical if strategy == "horizontal_first" else vertical + horizontal
        return " ".join(moves + [ANSWER, self.answer(x)])
