"""Running a baseline in a child process bounded by wall-clock time and memory.

A cvxpy baseline spends most of a large instance building its expression tree,
which no solver time limit stops (space sharing at 1,024 jobs: over 9 minutes
and 13 GB before the solver starts). :func:`run_bounded` runs it in a fresh
(spawned) process whose address space is capped with ``RLIMIT_AS`` and which
is killed at the wall-clock limit; either way a :class:`Measurement` with the
reason comes back, and the caller goes on.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

from allocopt.bench.timing import Measurement, short

#: Default cap on a baseline's address space: half the machine's memory, at most 16 GiB.
try:
    DEFAULT_MEMORY_LIMIT_BYTES = min(16 << 30, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
except (ValueError, OSError, AttributeError):
    DEFAULT_MEMORY_LIMIT_BYTES = 8 << 30


def _child(connection: Any, function: Callable[..., Measurement], args: tuple[Any, ...],
           memory_limit_bytes: int | None) -> None:
    try:
        from allocopt.backends.highs import new_highs

        new_highs()  # HiGHS's copyright banner goes to /dev/null in this process too
        import cvxpy  # noqa: F401 - loaded before the cap: mapping its libraries needs address space
        if memory_limit_bytes:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
        result = function(*args)
        result.values = None  # the solution's values stay in the child
    except MemoryError:
        result = Measurement(status=f"error: over the memory limit of {memory_limit_bytes / 2**30:.1f} GiB")
    except ImportError as err:
        result = Measurement(status=f"skipped: {short(err)} (pip install 'allocopt[cvxpy]')")
    except Exception as err:  # noqa: BLE001 - any failure of the baseline becomes its status
        result = Measurement(status=f"error: {type(err).__name__}: {short(err)}")
    connection.send(result)
    connection.close()


def run_bounded(function: Callable[..., Measurement], args: tuple[Any, ...], *, wall_limit_s: float,
                memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES) -> Measurement:
    """``function(*args)`` (picklable, returning a Measurement) in a spawned process; a
    ``timeout: ...`` Measurement when it runs past ``wall_limit_s`` (the process is killed), an
    ``error: ...`` one when it exceeds ``memory_limit_bytes`` or dies, a ``skipped: ...`` one when
    its modeling package (cvxpy) is missing."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, function, args, memory_limit_bytes), daemon=True)
    process.start()
    sender.close()
    try:
        if receiver.poll(wall_limit_s):
            try:
                return receiver.recv()
            except EOFError:
                pass
        else:
            return Measurement(status=f"timeout: build and solve over {wall_limit_s:g} s (stopped)",
                               total_s=wall_limit_s)
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receiver.close()
    code = process.exitcode
    return Measurement(status=f"error: the baseline process died (exit code {code}; out of memory at "
                              f"{(memory_limit_bytes or 0) / 2**30:.1f} GiB?)")
