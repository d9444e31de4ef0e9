"""Background jobs (builds, rankings, sensitivity, searches) in supervised child processes:
``record`` (the Job record), ``params`` (each kind's parameters), ``kinds`` (what each kind runs),
``manager`` (JobManager: queues, the child process and its supervisor). The child is
``python -m core.jobs RECORD`` (``__main__``)."""
from core.jobs.manager import JobManager, can_cancel, is_admin
from core.jobs.params import build_params, isolated_params, rank_params, search_params
from core.jobs.record import Job

__all__ = ["Job", "JobManager", "can_cancel", "is_admin", "build_params", "isolated_params", "rank_params",
           "search_params"]
