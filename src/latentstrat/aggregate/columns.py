"""The names the aggregate tables and the report share: column names and the metric lists the
tables are built over, so the report reads the words the aggregate writes."""

from latentstrat.metrics import CONTRAST_METRICS

FAMILY_COL = "reconstruction_loss_family_label"
CELL_CHECK_COL = "cell_check"  # "ok" / "FAIL" / "" (not checked) in every table that names cells
# metrics compared between the primary arm and each comparison arm (common cells, arm contrasts)
DELTA_METRICS = list(CONTRAST_METRICS)
SHARE_METRICS = ["example_share", "token_share", "loss_share", "grad_norm_share"]
