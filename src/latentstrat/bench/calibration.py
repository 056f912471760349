"""`python -m latentstrat.bench calibrate`: the verdict's calibration from the command line (what
it draws and prints: latentstrat.bench.calibrate; the two-look procedure and the second look
alone: latentstrat.bench.looks; the pass rule: latentstrat.bench.targets)."""

from __future__ import annotations

import argparse
import sys
import time

from latentstrat.bench.calibrate import SCENARIOS, Collection, describe, design, fit_scenario, run_scenario, table
from latentstrat.bench.looks import procedure_checks, procedure_table, run_procedure, second_look_table
from latentstrat.bench.targets import checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.bench calibrate",
        description="Measure the verdict's false-sign rate, coverage, mean t^2 and power by simulation "
        "through the project's own contrast code (docs/design.md, 'Verdicts').",
    )
    ap.add_argument("--configfile", default="config/config.yaml", help="the collection whose design is simulated")
    ap.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="declared scenario(s); default all (none with --fit)",
    )
    ap.add_argument(
        "--fit", action="append", default=[], help="a finished collection's aggregate folder to fit a scenario to"
    )
    ap.add_argument("--draws", type=int, default=1000, help="null collections per scenario")
    ap.add_argument(
        "--power-draws", type=int, default=400, help="collections at the detectable difference per scenario"
    )
    ap.add_argument(
        "--procedure-draws",
        type=int,
        default=0,
        help="null runs of the whole two-look procedure per scenario (first look, planned follow-up, second look)",
    )
    ap.add_argument(
        "--second-look-seeds",
        type=int,
        nargs="*",
        default=[],
        help="null draws (--draws of them) of the second look alone with each of these numbers of fresh seeds",
    )
    ap.add_argument("--seed", type=int, default=20261203, help="the simulation's seed")
    ap.add_argument("--arm", default=None, help="comparison arm (default: the config's primary contrast)")
    args = ap.parse_args(argv)

    from latentstrat.aggregate.collection import report_settings
    from latentstrat.config import config_for_command

    cfg = config_for_command(args.configfile)
    thr = report_settings(cfg.get("report"))
    arm = args.arm or thr.get("primary_contrast") or cfg["comparison_arms"][0]["name"]
    collection = Collection.of(cfg)
    d = design(collection.cells)
    declared = args.scenario or ([] if args.fit else list(SCENARIOS))  # --fit alone: the fitted ones only
    scenarios = [SCENARIOS[s] for s in declared] + [fit_scenario(p) for p in args.fit]
    for sc in scenarios[len(declared) :]:
        print(f"{sc.name}: {describe(sc)}")
    print(
        f"design: {args.configfile}: {len(d)} cells, {d.setting.nunique()} settings, "
        f"seeds per setting {d.groupby(['arm', 'setting']).size().min()}-{d.groupby(['arm', 'setting']).size().max()}; "
        f"contrast {cfg['primary_arm']} vs {arm}"
    )
    if args.second_look_seeds:
        print(second_look_table(collection, scenarios, arm, thr, args.second_look_seeds, args.draws, args.seed))
        return 0
    rows = []
    for i, sc in enumerate(scenarios):
        t0 = time.perf_counter()
        rows.append(run_scenario(d, sc, arm, thr, args.draws, args.power_draws, args.seed + i))
        print(f"  {sc.name}: {sc.what} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    print(table(rows))
    if args.procedure_draws:
        procs = []
        for i, sc in enumerate(scenarios):
            t0 = time.perf_counter()
            procs.append(
                {"scenario": sc.name, **run_procedure(d, sc, arm, thr, collection, args.procedure_draws, args.seed + i)}
            )
            print(f"  {sc.name}: the two-look procedure ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        print(procedure_table(procs))
        rows += [{**r, "procedure": True} for r in procs if procedure_checks(r)]
    failed = [r["scenario"] for r in rows if r.get("procedure") or checks(r)]
    print("all scenarios meet the targets" if not failed else f"missed in: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
