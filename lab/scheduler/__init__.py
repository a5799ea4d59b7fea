from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.scheduler.preemption import PreemptionStrategy, RecomputePreemption, ReservePreemption
from lab.scheduler.queues import FairQueue, FCFSQueue, PriorityQueue, RequestQueue, SJFQueue
from lab.scheduler.scheduler import Scheduler, SchedulerConfig

__all__ = [
    "FCFSQueue", "FairQueue", "ModelRunnerOutput", "PreemptionStrategy", "PriorityQueue",
    "RecomputePreemption", "RequestQueue", "ReservePreemption", "SJFQueue", "Scheduler",
    "SchedulerConfig", "SchedulerOutput",
]
