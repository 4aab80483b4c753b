"""The service's limits and timeouts (:class:`ServiceOptions`) and the ``allocopt serve`` flags that set them.

Imports nothing beyond the standard library, so the command line can build its
parser without the ``service`` extra installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import socket
from pathlib import Path

from allocopt.errors import InvalidOptionError


@dataclasses.dataclass(frozen=True)
class ServiceOptions:
    """Limits on connections, work and request complexity, and timeouts (seconds), of one service.

    Every limit refuses what is over it with a 4xx JSON error naming the field.
    """

    #: Request bodies over this many bytes get 413.
    max_body_bytes: int = 4 * 2**20
    #: Jobs in one request (``/solve``, an engine state, round results) and in the engine; more get 413.
    max_jobs: int = 10_000
    #: GPUs of one type (cluster ``gpus``, ``PUT /engine/capacity``).
    max_gpus_per_type: int = 100_000
    #: GPU types in a cluster.
    max_gpu_types: int = 64
    #: Nesting depth of a JSON body (the body itself is depth 1).
    max_depth: int = 32
    #: Digits of an integer in a JSON body.
    max_int_digits: int = 18
    #: Magnitude of any number in a JSON body (steps/s, seconds, weights...).
    max_number: float = 1e15
    #: Solves running at once (``POST /solve`` worker threads).
    solve_workers: int = 2
    #: Requests waiting for a worker (per pool: solves, and the engine's one thread); more get 503.
    max_queued: int = 64
    #: Wall-clock limit of one solve, engine solves included (the solver's ``time_limit_s`` is capped to it).
    solve_timeout_s: float = 60.0
    #: Solver threads one request may ask for.
    max_solver_threads: int = max(1, os.cpu_count() or 1)
    #: Open connections; beyond it uvicorn answers 503.
    max_connections: int = 1000
    #: Close an idle keep-alive connection after this long.
    keep_alive_s: float = 5.0
    #: A client must send a request's line and headers within this long of connecting (or of the last response).
    header_timeout_s: float = 10.0
    #: A client must send a request's body within this long of its headers; else 408.
    body_timeout_s: float = 30.0
    #: Listen backlog of the socket.
    backlog: int = 2048

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise InvalidOptionError(f"service option {field.name} must be a positive finite number, "
                                         f"got {value!r}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address) resolves only to loopback addresses."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def read_token(path: str | os.PathLike) -> str:
    """The bearer token in the file at ``path`` (surrounding whitespace stripped).

    Raises
    ------
    InvalidOptionError
        When the file cannot be read, is not UTF-8 text, or holds an empty or multi-line token.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise InvalidOptionError(f"cannot read token file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise InvalidOptionError(f"token file {path} is not UTF-8 text") from None
    if not token or any(c.isspace() for c in token) or not token.isprintable():
        raise InvalidOptionError(f"token file {path} must hold one token: printable, no spaces, not empty")
    return token


_FLAGS = {  # ServiceOptions field -> (flag, metavar, help)
    "max_body_bytes": ("--max-body-bytes", "N", "reject request bodies larger than N bytes with 413"),
    "max_jobs": ("--max-jobs", "N", "jobs per request and in the engine"),
    "max_gpus_per_type": ("--max-gpus-per-type", "N", "GPUs of one type"),
    "max_gpu_types": ("--max-gpu-types", "N", "GPU types in a cluster"),
    "max_depth": ("--max-depth", "N", "nesting depth of a JSON body"),
    "max_int_digits": ("--max-int-digits", "N", "digits of an integer in a JSON body"),
    "max_number": ("--max-number", "X", "magnitude of any number in a JSON body"),
    "solve_workers": ("--solve-workers", "N", "POST /solve requests solved at once"),
    "max_queued": ("--max-queued", "N", "requests waiting for a solver or for the engine; more get 503"),
    "solve_timeout_s": ("--solve-timeout", "SECONDS", "wall-clock limit of one solve"),
    "max_solver_threads": ("--max-solver-threads", "N", "solver threads one request may ask for"),
    "max_connections": ("--max-connections", "N", "open connections (more get 503)"),
    "keep_alive_s": ("--keep-alive", "SECONDS", "close idle keep-alive connections after this long"),
    "header_timeout_s": ("--header-timeout", "SECONDS", "time a client has to send a request's headers"),
    "body_timeout_s": ("--body-timeout", "SECONDS", "time a client has to send a request's body (else 408)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--token-file`` and one flag per limit of :class:`ServiceOptions` to ``parser``."""
    parser.add_argument("--token-file", metavar="FILE",
                        help="require 'Authorization: Bearer TOKEN' with the token in FILE; required when --host "
                             "is not a loopback address")
    group = parser.add_argument_group("limits and timeouts")
    defaults = ServiceOptions()
    for name, (flag, metavar, text) in _FLAGS.items():
        kind = float if isinstance(getattr(defaults, name), float) else int
        group.add_argument(flag, dest=name, type=_positive(kind), default=getattr(defaults, name), metavar=metavar,
                           help=f"{text} (default: %(default){'g' if kind is float else 's'})")


def from_arguments(args: argparse.Namespace) -> ServiceOptions:
    """The :class:`ServiceOptions` of parsed ``allocopt serve`` arguments."""
    return ServiceOptions(**{name: getattr(args, name) for name in _FLAGS})


def _positive(kind: type) -> object:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse
