"""Figures from run directories: `python -m lab.plots RUN_DIR [RUN_DIR ...] --out DIR`."""

from lab.plots.data import RunData, find_runs, load_run, load_runs
from lab.plots.figures import latency_cdfs, plot_all, throughput_goodput, timeline

__all__ = ["RunData", "find_runs", "latency_cdfs", "load_run", "load_runs", "plot_all",
           "throughput_goodput", "timeline"]
