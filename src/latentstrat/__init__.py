"""latentstrat: latent-strategy ablation grids (router p(z|x), generator p(y|x,z), posterior q(z|x,y)).

The folders follow the data flow: tasks/ -> the definitions and infrastructure here (families,
cells, config, paths, data, metrics, ...) -> modeling/ (backbone -> model -> objective, decode,
scoring) -> base/ (entangle -> reference) -> cell/ (step0 -> train -> evaluate -> probes ->
tabulate) -> aggregate/ -> report/. See docs/architecture.md.
"""

__version__ = "0.1.0"
