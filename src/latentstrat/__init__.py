"""latentstrat: latent-strategy ablation grids (router p(z|x), generator p(y|x,z), posterior q(z|x,y)).

Data flow: tasks -> data -> backbone -> model -> objective -> entangle / reference -> step0 ->
train -> decode / scoring -> evaluate -> probes -> cell_metrics / metrics -> aggregate -> report.
See docs/architecture.md.
"""

__version__ = "0.1.0"
