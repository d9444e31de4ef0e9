"""The child process of a job: ``python -m core.jobs RECORD`` runs the job of one record."""
import sys

from core.jobs.manager import child_main

child_main(sys.argv[1])
