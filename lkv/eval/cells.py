"""The budget column's two non-numeric values, shared by the runner that writes result rows and every
reader of them (report, paired comparisons, TensorBoard, sweep summaries)."""

FULL = "full"  # budget of FullKV cells (no eviction)
NO_BUDGET = "-"  # budget of importance cells (one cell carries every Recall@C)
