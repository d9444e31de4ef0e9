"""The mixed-precision search under a quality budget: the budget, the latency model fitted on
measured profiles, the searcher, and its result record (candidates, Pareto front, chosen point)."""
from core.search.budget import BUDGET_METRICS, Budget, default_margin
from core.search.latency import LatencyModel, fit_latency_model, fusable_edges, latency_model, to_wall_clock
from core.search.result import CANDIDATE_COLUMNS, FRONT_COLUMNS, Candidate, SearchResult, candidate_policy, candidate_table, \
    chosen_candidate, pareto_flags
from core.search.searcher import SearchConfig, Variant, preference_key, search

__all__ = ["BUDGET_METRICS", "CANDIDATE_COLUMNS", "FRONT_COLUMNS", "Budget", "Candidate", "LatencyModel",
           "SearchConfig", "SearchResult", "Variant", "candidate_policy", "candidate_table", "chosen_candidate",
           "default_margin", "fit_latency_model", "fusable_edges", "latency_model", "pareto_flags", "preference_key",
           "search", "to_wall_clock"]
