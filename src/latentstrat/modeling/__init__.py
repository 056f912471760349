"""The model and its one inference path, shared by the base and the cell stages: the backbone
(transformers), the latent-strategy model on it (peft adapters, router and posterior heads),
the objective J, decoding, and the judge of generated texts (scoring)."""
