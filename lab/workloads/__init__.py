"""Workloads: request generators (synthetic lengths, arrivals, prefix sharing)."""

from lab.workloads.base import Workload, WorkloadRequest
from lab.workloads.synthetic import SyntheticWorkload

__all__ = ["SyntheticWorkload", "Workload", "WorkloadRequest"]
