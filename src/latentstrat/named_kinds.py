"""Settings whose values are declared names, some with parameters (`tokcc_a0.25`, `lin300`,
`sum`), each kind declared once: what every declaration has (`Kind`), the table of declared kinds
of one setting (`Kinds`: its one regular expression, the config schema's pattern, the accepted
names for error messages, a name's parse into its kind and numbers) and a parsed name (`Named`).
Reconstruction families (latentstrat.families), KL weight schedules (latentstrat.schedules) and
token aggregations (latentstrat.aggregations) are the three such settings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, ClassVar


@dataclass(frozen=True)
class Kind:
    """What every declared kind has.

    name     the kind (`tokcc`)
    syntax   the names as a user writes them (`tokcc_a<alpha>`), for error messages
    pattern  a regular expression over the whole name, one named group per parameter
    """

    name: str
    syntax: str
    pattern: str


@dataclass(frozen=True)
class Named:
    """A parsed name: the name, its kind and its parameters as (group, number) pairs; a subclass
    sets `kinds`, the table its kinds are declared in."""

    kinds: ClassVar[dict]
    name: str
    kind: str
    params: tuple = ()

    def __getitem__(self, key: str):
        return dict(self.params)[key]

    @property
    def declaration(self):
        return self.kinds[self.kind]


class Kinds(dict):
    """The declared kinds of one setting, by kind name. A kind has `name`, `syntax` (the names as
    a user writes them) and `pattern` (a regular expression over the whole name, one named
    group per parameter)."""

    def __init__(self, setting: str, joiner: str = ", "):
        super().__init__()
        self.setting = setting  # "reconstruction family": what error messages call it
        self.joiner = joiner

    def declare(self, kind):
        """Add a kind (its name unique). Returns it."""
        if kind.name in self:
            raise ValueError(f"{self.setting} kind {kind.name!r} is declared twice")
        re.compile(kind.pattern)
        self[kind.name] = kind
        return kind

    def accepted_names(self) -> str:
        """The names every declared kind accepts, for error messages."""
        return self.joiner.join(k.syntax for k in self.values())

    def name_pattern(self) -> str:
        """One regular expression that accepts every declared kind's names."""
        plain = [re.sub(r"\(\?P<\w+>", "(", k.pattern) for k in self.values()]
        return "^(?:" + "|".join(plain) + ")$"

    def parse(self, name: str, number: Callable[[str], float | int]) -> tuple[str, str, tuple]:
        """(the name, its kind, its parameters as (group, number) pairs, unmatched optional groups
        left out); a ValueError naming it and the accepted names when no kind matches or a
        parameter is no number."""
        text = str(name)
        for kind in self.values():
            m = re.fullmatch(kind.pattern, text)
            if not m:
                continue
            try:
                params = tuple((k, number(v)) for k, v in m.groupdict().items() if v is not None)
            except ValueError:
                raise ValueError(f"unknown {self.setting} {text!r}: malformed number") from None
            return text, kind.name, params
        raise ValueError(f"unknown {self.setting} {text!r} (expected {self.accepted_names()})")
