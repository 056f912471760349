"""sorting_algorithms: sort 4 digits by bubble, insertion or selection sort (the renderers take
any length; `min_len`/`max_len` set what is sampled).

x: `sort 5 3 8 1 4`. y: the list after each step, steps separated by `;`, then
`answer 1 3 4 5 8`. A bubble step is one full pass (stops after the first pass without a
swap, which is not written); insertion writes the sorted prefix after inserting each element
1..n-1 (`3 5 ; 3 5 8 ; 1 3 5 8 ; ...`); selection writes the whole list after placing each
position 0..n-2. Insertion traces never equal the others (their first step has 2 tokens);
bubble and selection could coincide only when bubble needs all n-1 passes and every pass
equals a selection step, which happens for no unsorted input of 4-5 digits (checked
exhaustively), so this task has no ambiguous examples. Already sorted inputs are not sampled.
"""

from __future__ import annotations

from latentstrat.tasks.base import ANSWER, SEP, Task


def bubble_steps(a: list[int]) -> list[list[int]]:
    a, states = list(a), []
    for end in range(len(a) - 1, 0, -1):
        swapped = False
        for i in range(end):
            if a[i] > a[i + 1]:
                a[i], a[i + 1] = a[i + 1], a[i]
                swapped = True
        if not swapped:
            break
        states.append(list(a))
    return states


def insertion_steps(a: list[int]) -> list[list[int]]:
    a, states = list(a), []
    for i in range(1, len(a)):
        key, j = a[i], i - 1
        while j >= 0 and a[j] > key:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = key
        states.append(a[: i + 1])
    return states


def selection_steps(a: list[int]) -> list[list[int]]:
    a, states = list(a), []
    for i in range(len(a) - 1):
        m = min(range(i, len(a)), key=lambda k: (a[k], k))
        a[i], a[m] = a[m], a[i]
        states.append(list(a))
    return states


STEPS = {"bubble": bubble_steps, "insertion": insertion_steps, "selection": selection_steps}


class SortingAlgorithms(Task):
    name = "sorting_algorithms"
    strategies = tuple(STEPS)
    min_len, max_len = 4, 4

    def sample_input(self, rng):
        while True:
            a = [rng.randrange(10) for _ in range(rng.randint(self.min_len, self.max_len))]
            if a != sorted(a):
                return "sort " + " ".join(map(str, a))

    def _parse(self, x: str) -> list[int]:
        words = x.split()
        if not words or words[0] != "sort":
            raise ValueError(f"{self.name}: malformed input {x!r}")
        return [int(w) for w in words[1:]]

    def answer(self, x):
        return " ".join(map(str, sorted(self._parse(x))))

    def render(self, x, strategy):
        self.check_strategy(strategy)
        states = STEPS[strategy](self._parse(x))
        steps = [" ".join(map(str, s)) for s in states]
        return f" {SEP} ".join(steps + [f"{ANSWER} {self.answer(x)}"])
