"""Carrying out round plans: the executor interface and its implementations."""

from allocopt.runtime.executor import Executor, JobRoundResult, Lease, RoundOutcome, RoundPlan

__all__ = ["Executor", "JobRoundResult", "Lease", "RoundOutcome", "RoundPlan"]
