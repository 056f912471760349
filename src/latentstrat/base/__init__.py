"""The base stages, shared by every cell of a base: the entangled model (entangle, its step,
its quality check, the shipped models) and the reference stage (the entangled model's NLL of
every supervised token and the scales S_ref, T_ref). The data stage is latentstrat.data."""
