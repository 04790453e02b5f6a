"""Reports from the store: numbers, timeline and plots, HTML. Reads the store only; never imports a job kind."""

from fedqueue.report.numbers import build_report, compute_report, write_report
from fedqueue.report.run_data import RunData

__all__ = ["RunData", "build_report", "compute_report", "write_report"]
