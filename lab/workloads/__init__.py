"""Workloads: request generators (synthetic lengths, arrivals, prefix sharing) and trace replay."""

from lab.workloads.base import Workload, WorkloadRequest
from lab.workloads.synthetic import SyntheticWorkload
from lab.workloads.trace import TraceWorkload

__all__ = ["SyntheticWorkload", "TraceWorkload", "Workload", "WorkloadRequest"]
