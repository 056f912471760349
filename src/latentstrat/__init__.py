"""latentstrat: latent-strategy ablation grids (router p(z|x), generator p(y|x,z), posterior q(z|x,y)).

Data flow: tasks -> data -> model -> objective -> entangle -> reference -> train ->
decode/evaluate -> probes -> metrics -> aggregate -> report. See docs/architecture.md.
"""

__version__ = "0.1.0"
