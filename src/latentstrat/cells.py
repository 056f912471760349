"""Cells and the grid: canonical cell ids and the expansion of a validated collection config
into its cells (reconstruction families: latentstrat.families).

A collection config (see config/config.yaml) holds fixed cell settings (`cell`), the primary
arm's grid axes (`grid`), an optional `seeds` axis, and comparison arms. This module is the one
place that turns it into cells; Snakemake's common.smk and every stage call it.

Cell ids are canonical strings built from the cell's settings (never from the position in a
grid): `agg-sum_fam-raw_beta-0.01_seed-314159`, plus `key-value` for every other cell setting
that differs from the schema default (e.g. `sched-lin100`). `1` and `1.0` are the same beta.

Seeds: a cell's `seed` is its replicate seed (it names the cell). What seeds its training (the
model as built, the batch order, the z noise, the validation noise) is its training seed
(`training_seed`), drawn from the replicate seed and every other setting except
token_aggregation: cells of different settings are independent, and the two cells of a pair
(differing in token_aggregation alone) share one training seed, so their paired delta cancels it.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from latentstrat.aggregations import Aggregation, aggregation
from latentstrat.families import DEFAULT_ALPHA, Family, parse_family, short_number
from latentstrat.schedules import Schedule, parse_schedule
from latentstrat.schema import parsed_schema

# cell setting -> short id key, in id order. agg, fam, beta and seed always appear.
ID_KEYS = {
    "token_aggregation": "agg",
    "reconstruction_family": "fam",
    "beta": "beta",
    "beta_schedule": "sched",
    "init": "init",
    "adaptation": "adapt",
    "latent_dim": "zdim",
    "z_slots": "slots",
    "posterior_variance_weight": "lpv",
    "router_marginal_kl_weight": "lrmk",
    "seed": "seed",
}


ALWAYS_IN_ID = ("token_aggregation", "reconstruction_family", "beta", "seed")


CELL_KEYS = tuple(ID_KEYS)


def format_value(v: Any) -> str:
    """Canonical text of a setting value: 1 and 1.0 -> '1'; 0.010 -> '0.01'."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        f = float(v)
        if f.is_integer() and abs(f) < 1e15:
            return str(int(f))
        return repr(f)
    return str(v)


def beta_label(beta: float) -> str:
    """Label as the original study writes it: beta=.01, beta=1."""
    return "beta=" + short_number(float(beta))


def schema_cell_defaults() -> dict:
    props = parsed_schema()["properties"]["cell"]["properties"]
    return {k: v["default"] for k, v in props.items()}


def cell_id(settings: dict) -> str:
    defaults = schema_cell_defaults()
    parts = []
    for key, short in ID_KEYS.items():
        v = settings[key]
        if key in ALWAYS_IN_ID or _canon(v) != _canon(defaults[key]):
            parts.append(f"{short}-{format_value(v)}")
    return "_".join(parts)


# the cell settings a cell's training seed is not drawn from: the ablated axis, so the two arms
# of a pair share one training seed (and one model at step 0)
NOT_SEEDING = ("token_aggregation",)


def training_seed(settings: dict) -> int:
    """The seed of a cell's training (model as built, batch order, z noise, validation noise): a
    non-negative 31-bit int from the sha256 of the canonical text (format_value) of the replicate
    `seed` and every other cell setting except token_aggregation. Cells that differ only in
    token_aggregation (a pair) get the same one; any other difference gives another one."""
    missing = [k for k in CELL_KEYS if k not in settings and k not in NOT_SEEDING]
    if missing:
        raise KeyError(f"training_seed: cell settings lack {', '.join(missing)}")
    text = ";".join(f"{k}={format_value(settings[k])}" for k in CELL_KEYS if k not in NOT_SEEDING)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


def cell_training_seed(cell: dict) -> int:
    """The training seed of a cell dict, or of a model's settings as built (`init_settings`): its
    `training_seed` when it names one, else `training_seed` of its settings."""
    if "training_seed" in cell:
        return int(cell["training_seed"])
    return training_seed(cell)


# the settings that decide a cell's model as built (model.build_model: the backbone, the adapters
# and heads, seeded by the training seed): cells that agree on them start from the same weights
# and share one step-0 validation (step0.step0_validation): the two arms of a pair
INIT_KEYS = ("init", "adaptation", "latent_dim", "z_slots", "training_seed")
INIT_ID_KEYS = {**ID_KEYS, "training_seed": "tseed"}


def init_settings(settings: dict) -> dict:
    """A cell's model as built: its INIT_KEYS, the training seed included."""
    return {k: cell_training_seed(settings) if k == "training_seed" else settings[k] for k in INIT_KEYS}


def init_id(settings: dict) -> str:
    """The name of a cell's model at step 0 (cell settings or `init_settings`), from its INIT_KEYS,
    e.g. init-entangled_adapt-lora_zdim-64_slots-1_tseed-1234567."""
    init = settings if "training_seed" in settings else init_settings(settings)
    return "_".join(f"{INIT_ID_KEYS[k]}-{format_value(init[k])}" for k in INIT_KEYS)


def _canon(v):
    return format_value(v)


def parse_cell_id(cid: str) -> dict:
    """Inverse of cell_id for the keys it names (values as strings)."""
    rev = {v: k for k, v in ID_KEYS.items()}
    out = {}
    for part in cid.split("_"):
        short, _, value = part.partition("-")
        if short not in rev:
            # family names contain underscores: glue back onto the previous part
            last = list(out)[-1]
            out[last] += "_" + part
            continue
        out[rev[short]] = value
    return out


@dataclass(frozen=True, eq=False)
class CellSettings(Mapping):
    """A cell's settings, parsed once (`parse`: at the grid's expansion and when a job rebuilds its
    cell): the named settings as their declarations (latentstrat.aggregations, .families,
    .schedules), the numbers typed. As a mapping it reads as the plain values (names, numbers),
    what cell ids, training seeds and a rule's params are made of."""

    token_aggregation: Aggregation
    reconstruction_family: Family
    beta: float
    beta_schedule: Schedule
    init: str
    adaptation: str
    latent_dim: int
    z_slots: int
    posterior_variance_weight: float
    router_marginal_kl_weight: float
    seed: int
    # the order the settings came in (the config's): a rule's params keep it, so the same cell's
    # params read the same to Snakemake's rerun trigger
    order: tuple = field(default=CELL_KEYS, repr=False)

    @classmethod
    def parse(cls, settings: Mapping) -> "CellSettings":
        """From plain values (a config's, a rule's params); a missing setting is a KeyError naming it,
        an unknown name a ValueError naming the accepted ones."""
        missing = [k for k in CELL_KEYS if k not in settings]
        if missing:
            raise KeyError(f"cell settings lack {', '.join(missing)}")
        s = settings
        return cls(
            token_aggregation=aggregation(str(s["token_aggregation"])),
            reconstruction_family=parse_family(s["reconstruction_family"]),
            beta=float(s["beta"]),
            beta_schedule=parse_schedule(s["beta_schedule"]),
            init=str(s["init"]),
            adaptation=str(s["adaptation"]),
            latent_dim=int(s["latent_dim"]),
            z_slots=int(s["z_slots"]),
            posterior_variance_weight=float(s["posterior_variance_weight"]),
            router_marginal_kl_weight=float(s["router_marginal_kl_weight"]),
            seed=int(s["seed"]),
            order=tuple(k for k in s if k in CELL_KEYS),
        )

    def plain(self) -> dict:
        """The settings as plain values, in the order they came in."""
        return {k: self[k] for k in self.order}

    def replace(self, **changes) -> "CellSettings":
        return CellSettings.parse({**self.plain(), **changes})

    def __getitem__(self, key: str):
        if key not in CELL_KEYS:
            raise KeyError(key)
        value = getattr(self, key)
        return getattr(value, "name", value)

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def __reduce__(self):  # pickled as its plain values (the declarations hold functions)
        return (CellSettings.parse, (self.plain(),))


@dataclass(frozen=True)
class Cell:
    cell_id: str
    arm: str | None  # None where a job does not need it (a cell's shared work)
    role: str | None  # primary | comparison
    settings: CellSettings = field(hash=False)

    @classmethod
    def from_json(cls, d: Mapping) -> "Cell":
        """A cell from a rule's params (`to_json`, or a cell's work: id, settings, training seed);
        a recorded training seed must be the settings' own."""
        cell = cls(d["cell_id"], d.get("arm"), d.get("role"), CellSettings.parse(d))
        if "training_seed" in d and int(d["training_seed"]) != cell.training_seed:
            raise ValueError(f"cell {cell.cell_id}: training seed {d['training_seed']} is not its settings' own")
        return cell

    @property
    def training_seed(self) -> int:
        return training_seed(self.settings)

    def to_json(self) -> dict:
        return {"cell_id": self.cell_id, "arm": self.arm, "role": self.role, **self.settings.plain()}

    def work_json(self) -> dict:
        """What a cell's shared work depends on: its id, settings and training seed (no arm or role)."""
        return {"cell_id": self.cell_id, **self.settings.plain(), "training_seed": self.training_seed}


def as_settings(settings) -> CellSettings:
    """CellSettings as they are, or parsed from plain values (the schema's defaults for the
    settings not given: a test's or a benchmark's cell)."""
    if isinstance(settings, CellSettings):
        return settings
    return CellSettings.parse({**schema_cell_defaults(), **settings})


def as_cell(cell) -> Cell:
    """A Cell as it is, or one from a rule's params or a cell's `to_json`."""
    return cell if isinstance(cell, Cell) else Cell.from_json(cell)


def normalize_settings(s: dict) -> dict:
    """Plain settings with their numbers typed (CellSettings.parse, then plain)."""
    return CellSettings.parse(s).plain()


def next_seeds(seeds: list[int], n: int) -> list[int]:
    """`seeds` extended to n values with the next unused integers after the last one."""
    out = list(seeds)
    s = max(out) if out else 0
    while len(out) < n:
        s += 1
        if s not in out:
            out.append(s)
    return out


def arm_seeds(cfg: dict, arm: dict | None = None) -> list[int]:
    """The seeds of an arm (None: the primary arm): its own `seeds`, or the `seed` of its
    settings, else the collection's `seeds` (default [cell.seed])."""
    if arm is not None and "seeds" in arm:
        return list(arm["seeds"])
    if arm is not None and "seed" in arm.get("settings", {}):
        return [int(arm["settings"]["seed"])]
    return list(cfg.get("seeds") or [cfg["cell"]["seed"]])


def replicate_groups(cfg: dict) -> list[dict]:
    """`replicates:` as a list of groups, each with its `extra_seeds` (default 1) and `grid` ({}
    = every setting); [] without replicates."""
    rep = cfg.get("replicates")
    groups = rep if isinstance(rep, list) else [] if rep is None else [rep]
    return [{"extra_seeds": g.get("extra_seeds", 1), "grid": g.get("grid") or {}} for g in groups]


def _extra_seeds(settings: dict, groups: list[dict]) -> int:
    """The extra seeds of one setting: the most any replicate group containing it gives."""
    inside = [
        g["extra_seeds"]
        for g in groups
        if all(format_value(settings[k]) in {format_value(v) for v in vals} for k, vals in g["grid"].items())
    ]
    return max(inside, default=0)


def _arm_cells(
    name: str, role: str, base: dict, grid: dict, seeds: list[int], groups: list[dict], fresh=()
) -> list[Cell]:
    """The cells of one arm: the grid's settings x the arm's seeds, plus the extra seeds its
    replicate groups give each setting: the next integers after the arm's seeds other than
    `fresh` (a follow-up's fresh seeds, report.headline_seeds: its replicates stay those of the
    collection it follows, and it trains exactly the cells its plan counts)."""
    axes = [k for k in CELL_KEYS if k in grid and k != "seed"]
    most = max((g["extra_seeds"] for g in groups), default=0)
    first = [s for s in seeds if s not in set(fresh)] or list(seeds)
    extra = [s for s in next_seeds(first, len(first) + most + len(seeds))[len(first) :] if s not in seeds][:most]
    cells, seen = [], set()
    for values in itertools.product(*(grid[k] for k in axes)):
        s = dict(base)
        s.update(zip(axes, values))
        for seed in [*seeds, *extra[: _extra_seeds(s, groups)]]:
            settings = CellSettings.parse({**s, "seed": seed})
            cid = cell_id(settings)
            if cid in seen:  # e.g. beta [1, 1.0]
                continue
            seen.add(cid)
            cells.append(Cell(cid, name, role, settings))
    return cells


def expand_cells(cfg: dict) -> list[Cell]:
    """All cells of a validated config (config.load_config / config.check_config): the primary arm,
    then each run-here comparison arm; each arm with its seeds (arm_seeds) and replicates."""
    rep = replicate_groups(cfg)
    fresh = [int(s) for s in (cfg.get("report") or {}).get("headline_seeds") or []]
    cells = _arm_cells(cfg["primary_arm"], "primary", cfg["cell"], cfg["grid"], arm_seeds(cfg), rep, fresh)
    for arm in cfg["comparison_arms"]:
        if "table" in arm:
            continue
        base = {**cfg["cell"], **arm.get("settings", {})}
        grid = {k: v for k, v in cfg["grid"].items() if k not in arm.get("settings", {})}
        grid.update(arm.get("grid", {}))
        cells += _arm_cells(arm["name"], "comparison", base, grid, arm_seeds(cfg, arm), rep, fresh)
    return cells


def pair_priorities(cells: list[Cell]) -> dict[str, int]:
    """cell id -> its scheduling priority: the cells of one pair (one setting and replicate in
    every arm: the same settings but token_aggregation and seed, the same place in their arm's
    seeds) share one, and pairs come in replicate order (every setting's first seed, then each
    setting's second, ...), grid order within, the first pair highest. A run that stops between
    jobs then leaves at most the pairs in flight half done, never half of every pair."""
    seeds_of: dict[str | None, list] = {}
    for c in cells:
        arm_seeds = seeds_of.setdefault(c.arm, [])
        if c.settings["seed"] not in arm_seeds:
            arm_seeds.append(c.settings["seed"])

    def key(c: Cell) -> tuple:
        rest = tuple(format_value(c.settings[k]) for k in CELL_KEYS if k not in ("token_aggregation", "seed"))
        return (seeds_of[c.arm].index(c.settings["seed"]), rest)

    order: dict[tuple, int] = {}
    for c in sorted(cells, key=lambda c: seeds_of[c.arm].index(c.settings["seed"])):
        order.setdefault(key(c), len(order))
    return {c.cell_id: len(order) - order[key(c)] for c in cells}


@dataclass(frozen=True, eq=False)
class Collection:
    """A collection as what comes after its cells reads it: its name, its `report` section, its
    cells (`expand_cells`) and the seeds of its settings (`arm_seeds`). `followup` is the
    collection that follows it up: the same settings on `seeds`, its headline on the `fresh`
    ones (report.headline_seeds)."""

    name: str
    report: Mapping
    cells: tuple[Cell, ...]
    seeds: tuple[int, ...]
    _config: Mapping = field(repr=False)  # what `followup` expands again

    @classmethod
    def of(cls, cfg) -> Collection:
        return cls(cfg["collection"], cfg["report"], tuple(expand_cells(cfg)), tuple(arm_seeds(cfg)), cfg)

    def followup(self, seeds: list[int], fresh: list[int]) -> Collection:
        report = {**self.report, "headline_seeds": fresh or None}
        return Collection.of({**self._config, "seeds": list(seeds), "report": report})


# the one setting a collection's contrasts change: a comparison arm whose cells differ from their
# primary partners in any other setting (the seed aside) is confounded
ABLATED_KEY = "token_aggregation"


@dataclass(frozen=True)
class ArmDifference:
    """How a run-here comparison arm's cells differ from the primary arm's (`arm_differences`)."""

    arm: str
    keys: tuple  # the settings (seed aside) in which its cells differ from their closest primary cells
    unmatched: int  # its cells with no primary cell of the same grid point (family, beta, ...)
    meant: bool  # the config declares the arm confounded on purpose (`confounded: true`)

    @property
    def confounded(self) -> bool:
        return any(k != ABLATED_KEY for k in self.keys)

    def text(self) -> str:
        if not self.keys:
            what = "same settings as the primary arm, other seeds (an A/A arm)"
        elif not self.confounded:
            what = f"differs in {ABLATED_KEY} alone: matched"
        else:
            extra = ", ".join(k for k in self.keys if k != ABLATED_KEY)
            what = f"differs in {', '.join(self.keys)}: confounded by {extra}" + (" (declared)" if self.meant else "")
        return f"arm {self.arm}: {what}"


def arm_differences(cfg: dict, cells: list[Cell] | None = None) -> list[ArmDifference]:
    """Per run-here comparison arm, the settings in which its cells differ from the primary arm's:
    each cell against the primary cells of its grid point (the primary grid's axes) with the
    fewest differing settings, the seed never counted. External arms (`table`) are not known here."""
    cells = expand_cells(cfg) if cells is None else cells
    primary = [c.settings for c in cells if c.role == "primary"]
    axes = [k for k in cfg["grid"] if k not in ("seed", ABLATED_KEY)]
    out = []
    for arm in cfg["comparison_arms"]:
        if "table" in arm:
            continue
        keys, unmatched = set(), 0
        for c in (c for c in cells if c.arm == arm["name"]):
            same_point = [p for p in primary if all(format_value(p[k]) == format_value(c.settings[k]) for k in axes)]
            if not same_point:
                unmatched += 1
                continue
            diffs = [
                {k for k in CELL_KEYS if k != "seed" and format_value(p[k]) != format_value(c.settings[k])}
                for p in same_point
            ]
            keys |= min(diffs, key=len)
        order = list(CELL_KEYS)
        out.append(
            ArmDifference(arm["name"], tuple(sorted(keys, key=order.index)), unmatched, bool(arm.get("confounded")))
        )
    return out


def tokcc_alphas(cells) -> list[float]:
    """The tokcc exponents the cells need the reference's T_ref at (every family's `alpha`, the
    default 0.25 among them)."""
    return sorted({DEFAULT_ALPHA} | {c.settings.reconstruction_family.alpha for c in cells})


def config_alphas(cfg) -> list[float]:
    """The tokcc exponents a collection's cells need T_ref at (`tokcc_alphas` of its cells)."""
    return tokcc_alphas(expand_cells(cfg))


def external_arms(cfg: dict) -> list[dict]:
    return [a for a in cfg["comparison_arms"] if "table" in a]
