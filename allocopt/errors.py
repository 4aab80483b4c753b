"""Every error and warning allocopt raises, in one place.

Each class derives from a built-in exception as well, so existing ``except
ValueError`` / ``except ImportError`` clauses keep working. Messages name the
offending job, GPU type, field or option and say what to do next.
"""

from __future__ import annotations

from typing import Any


class AllocoptError(Exception):
    """Base class of every error raised by allocopt."""


class InvalidProblemError(AllocoptError, ValueError):
    """The inputs of a problem are malformed.

    ``field`` names the offending input (e.g. ``"throughputs"``) and ``job``
    the offending job id, when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None, job: Any = None):
        super().__init__(message)
        self.field = field
        self.job = job


class UnknownJobError(InvalidProblemError):
    """The job id is not known (e.g. to an :class:`allocopt.Engine`)."""


class DuplicateJobError(InvalidProblemError):
    """A job with this id already exists (e.g. in an :class:`allocopt.Engine`)."""


class DataFileError(AllocoptError, ValueError):
    """A data file is missing or malformed; the message starts with ``path, line N:``.

    ``path`` is the file and ``line`` the 1-based line (None for the whole file).
    """

    def __init__(self, message: str, *, path: Any, line: int | None = None):
        where = f"{path}, line {line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


class ProfileFormatError(DataFileError):
    """A Sia/Pollux profile file is missing, malformed or holds impossible values."""


class WorkloadFormatError(DataFileError):
    """A Sia workload file is missing or malformed."""


class InvalidOptionError(AllocoptError, ValueError):
    """An option passed to a policy, backend or command is unknown or out of range."""


class UnknownPolicyError(InvalidOptionError):
    """The policy name is not registered."""


class UnknownBackendError(InvalidOptionError):
    """The backend name is not one of allocopt's backends."""


class BackendNotInstalledError(AllocoptError, ImportError):
    """The backend's Python package is missing; the message names the extra to install."""


class LicenseError(AllocoptError, RuntimeError):
    """The solver is installed but has no usable license."""


class LicenseLimitError(LicenseError):
    """The model is larger than the solver's size-limited license allows."""


class SolverError(AllocoptError, RuntimeError):
    """The solver itself failed (crashed, rejected the model or an option).

    ``status`` and ``solution``, when given, are the :class:`allocopt.Status`
    and the raw :class:`allocopt.Solution` of the failed solve.
    """

    def __init__(self, message: str, *, status: Any = None, solution: Any = None):
        super().__init__(message)
        self.status = status
        self.solution = solution


class NotOptimalError(AllocoptError, RuntimeError):
    """The solver finished without proving optimality.

    ``status`` is the :class:`allocopt.Status` and ``solution`` the raw
    :class:`allocopt.Solution` (which may hold an incumbent). Pass
    ``best_effort=True`` to :func:`allocopt.solve` to receive such results as an
    :class:`allocopt.Allocation` with an explicit status instead.
    """

    def __init__(self, message: str, *, status: Any = None, solution: Any = None):
        super().__init__(message)
        self.status = status
        self.solution = solution


class InfeasibleError(NotOptimalError):
    """No allocation satisfies the constraints (e.g. deadlines that cannot all be met)."""


class UnboundedError(NotOptimalError):
    """The objective can grow without limit; the formulation is missing a bound."""


class TimeLimitError(NotOptimalError):
    """The solver stopped at its time limit before proving optimality."""


class StateError(AllocoptError, RuntimeError):
    """The scheduler's state (journal, its lock, its work directory) is in use by another scheduler,
    missing, replaced or unreadable; the message names the file and what to do."""


class AllocoptWarning(UserWarning):
    """Warnings raised by allocopt (e.g. falling back to another backend)."""
