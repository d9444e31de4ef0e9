"""Per-layer sensitivity to INT8: cumulative (every eligible layer INT8, compared layer by layer,
in chunks under a memory budget) and isolated / leave-one-out (one layer switched at a time on a switchable model)."""
from core.sensitivity.comparison import COMPARE_COLUMNS, ranking_comparison
from core.sensitivity.cumulative import RANK_COLUMNS, RANK_METRICS, Ranking, rank_layers
from core.sensitivity.isolated import (MODES, SENSITIVITY_COLUMNS, Sensitivity, Switchable, TrialData, TrialPool, open_trial_pool,
                                       sensitivity, sensitivity_file, split_eval, switchable_model, trial_data,
                                       write_sensitivity)
from core.sensitivity.memory import PeakMemory, comparison_budget, parse_memory
from core.sensitivity.runners import RANKING_NOTE, RUNNER_LABELS, RUNNERS

__all__ = ["COMPARE_COLUMNS", "MODES", "RANKING_NOTE", "RANK_COLUMNS", "RANK_METRICS", "RUNNERS", "RUNNER_LABELS",
           "SENSITIVITY_COLUMNS", "Ranking", "Sensitivity",
           "Switchable", "TrialData", "TrialPool", "PeakMemory", "comparison_budget", "open_trial_pool",
           "parse_memory", "rank_layers", "ranking_comparison", "sensitivity", "sensitivity_file", "split_eval",
           "switchable_model", "trial_data", "write_sensitivity"]
