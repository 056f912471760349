from _stage import logged, stage_config

from latentstrat.cell import tabulate

with logged(snakemake):
    cfg = stage_config(snakemake)
    tabulate.write_cell_row(
        cfg,
        snakemake.params.cell,
        snakemake.input.records,
        list(snakemake.input.probes),
        snakemake.output.row,
        snakemake.output.bootstrap,
        train_summary_path=snakemake.input.summary,
        reference_tokens_path=snakemake.input.reference_tokens,
    )
