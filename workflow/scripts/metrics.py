from _stage import logged, stage_config

from latentstrat.cell import cell_metrics

with logged(snakemake):
    cfg = stage_config(snakemake)
    cell_metrics.write_cell_metrics(
        cfg,
        snakemake.params.cell,
        snakemake.input.records,
        list(snakemake.input.probes),
        snakemake.output.metrics,
        snakemake.output.bootstrap,
        train_summary_path=snakemake.input.summary,
        reference_tokens_path=snakemake.input.reference_tokens,
    )
