from pathlib import Path

from _stage import logged

from latentstrat import report

with logged(snakemake):
    # the aggregate's meta (aggregate_meta.json) carries the collection and report settings
    out_dir = Path(snakemake.output.results).parent
    quality = report.load_entangle_quality(snakemake.input.quality)
    report.build_report(snakemake.input.aggregate, out_dir, {"partial_run": False, "entangle_quality": quality})
