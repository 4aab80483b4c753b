"""The ``allocopt`` command line.

``allocopt solve PROBLEM.json`` reads a problem document (see
:meth:`allocopt.Problem.to_json`) and writes the allocation as JSON (see
:meth:`allocopt.Allocation.to_json`); ``allocopt demo`` solves a realistic
problem drawn from Gavel's measured throughputs with every installed backend.

Exit codes (:data:`EXIT_CODES`): 0 success, 1 the solver failed or did not
prove optimality (or a job failed), 2 invalid input (arguments, options, any
input file), 3 an internal error (a bug in allocopt), 130 interrupted (Ctrl-C).
Errors are one line on stderr, ``allocopt: error: ...``, never a traceback
(``-v`` adds the traceback of an internal error). Results go to stdout,
diagnostics to stderr; ``-v``/``-q`` before the command set how much is logged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import math
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from allocopt import __version__
from allocopt.allocation import Allocation
from allocopt.api import solve
from allocopt.backends import BACKENDS, get_backend, installed_backends
from allocopt.cluster import Cluster
from allocopt.documents import decode, parse_json, read_text
from allocopt.errors import (AllocoptError, BackendNotInstalledError, DataFileError, InvalidOptionError,
                             InvalidProblemError, LicenseError, NotOptimalError, SolverError, UnknownBackendError)
from allocopt.formulations import POLICIES, get_policy
from allocopt.problem import Problem
from allocopt.server.options import add_arguments as add_serve_arguments
from allocopt.throughput.table import ThroughputTable
from allocopt.throughput.goodput import DEFAULT_LOSS, DEFAULT_LOSS_SCALE, LOSSES

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
#: Exit status of each class of outcome (also in ``allocopt --help``).
EXIT_CODES = {0: "success", EXIT_FAILURE: "the solver failed or did not prove optimality, or a job failed",
              EXIT_USAGE: "invalid input (arguments, options, problem/job/trace/state files)",
              EXIT_INTERNAL: "internal error (a bug in allocopt; -v shows the traceback)",
              EXIT_INTERRUPTED: "interrupted (Ctrl-C)"}
_USAGE_ERRORS = (InvalidProblemError, InvalidOptionError, DataFileError, BackendNotInstalledError)

logger = logging.getLogger(__name__)

#: The cluster of Gavel's continuous-trace experiments (Narayanan et al., OSDI 2020).
DEMO_CLUSTER = {"v100": 36, "p100": 36, "k80": 36}

# Keys of --option that have their own flag (passing both would clash in allocopt.solve).
_FLAGS = {"problem": "the PROBLEM argument", "policy": "--policy", "backend": "--backend",
          "time_limit_s": "--time-limit-s", "best_effort": "--best-effort"}


class _UsageError(Exception):
    """Bad input found by the command line itself (file, JSON, output path)."""


# Commands whose parsers live in heavier modules, with their one-line help: a command's module is imported
# only when that command runs (the others get a placeholder with the same help), so that `allocopt solve`
# does not import the benchmark suite or the Slurm controller.
LAZY_COMMANDS = {
    "bench": ("allocopt.bench", "benchmark policies x sizes x backends x techniques against cvxpy baselines"),
    "slurm": ("allocopt.integrations.slurm", "enact allocopt's rounds on a Slurm cluster (controller, job wrapper)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code (:data:`EXIT_CODES`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    try:
        args = _parser(command).parse_args(argv)
    except KeyboardInterrupt:
        return _interrupted()
    with _logging(args.verbose - args.quietness):
        try:
            return args.run(args)
        except _UsageError as err:
            return _error(str(err), EXIT_USAGE)
        except AllocoptError as err:
            return _error(str(err), EXIT_USAGE if isinstance(err, _USAGE_ERRORS) else EXIT_FAILURE)
        except KeyboardInterrupt:
            return _interrupted()
        except BrokenPipeError:  # stdout closed by the reader (e.g. `allocopt demo | head`)
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_FAILURE
        except OSError as err:  # a file or socket the command was pointed at
            where = f"{err.filename}: " if err.filename else ""
            return _error(f"{where}{err.strerror or err}", EXIT_USAGE)
        except RecursionError:
            return _error("input nested too deeply", EXIT_USAGE)
        except Exception as err:  # a bug: one line, the traceback with -v
            logger.info("traceback of the internal error:", exc_info=True)
            return _error(f"internal error: {type(err).__name__}: {err} (a bug in allocopt; please report it, "
                          "-v shows the traceback)", EXIT_INTERNAL)


def _interrupted() -> int:
    print("allocopt: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


class _StderrHandler(logging.StreamHandler):
    """Log records as ``allocopt: LEVEL: message`` to the current ``sys.stderr``."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401 - follows sys.stderr when it is replaced (tests, redirection)
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        text = f"allocopt: {record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        return text


@contextlib.contextmanager
def _logging(verbosity: int) -> Iterator[None]:
    """Log the "allocopt" loggers to stderr while a command runs: warnings by default,
    info with -v, debug with -vv, errors only with -q; the library itself stays silent."""
    package = logging.getLogger("allocopt")
    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(
        verbosity, logging.DEBUG if verbosity > 1 else logging.CRITICAL)
    handler, saved = _StderrHandler(), (package.level, package.propagate)
    package.addHandler(handler)
    package.setLevel(level)
    package.propagate = False
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(saved[0])
        package.propagate = saved[1]


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; of :data:`LAZY_COMMANDS`, only ``command``'s arguments are added."""
    parser = argparse.ArgumentParser(
        prog="allocopt", description="Allocate heterogeneous GPU clusters among training jobs.",
        epilog="Exit codes: " + ", ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()) + ".")
    parser.add_argument("--version", action="version", version=f"allocopt {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more to stderr (-v: progress and info, -vv: debug); before the command")
    parser.add_argument("-q", "--quiet", dest="quietness", action="count", default=0,
                        help="log only errors to stderr (-qq: nothing but the error line); before the command")
    commands = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")

    s = commands.add_parser("solve", help="solve a problem given as JSON, write the allocation as JSON",
                            description="Solve the problem in PROBLEM (JSON, as written by Problem.to_json) "
                                        "and write the allocation as JSON.")
    s.add_argument("problem", metavar="PROBLEM", help="problem JSON file, or - to read stdin")
    s.add_argument("--policy", default="max_min_fairness",
                   help=f"scheduling policy (default: %(default)s; one of {', '.join(sorted(POLICIES))})")
    s.add_argument("--backend", default="highs",
                   help=f"solver backend (default: %(default)s; one of {', '.join(BACKENDS)}, auto)")
    s.add_argument("--out", metavar="FILE", help="write the allocation to FILE instead of stdout")
    s.add_argument("--time-limit-s", type=float, metavar="S", help="solver time limit per solve, in seconds")
    s.add_argument("--best-effort", action="store_true",
                   help="write non-optimal results (e.g. at the time limit) instead of failing")
    s.add_argument("--option", dest="options", action="append", type=_key_value, default=[],
                   metavar="KEY=VALUE",
                   help="policy option or allocopt.solve keyword (e.g. heterogeneity_aware=false, "
                        "threads=4); VALUE is read as JSON where it parses, else as a string; repeatable")
    s.set_defaults(run=_run_solve)

    d = commands.add_parser("demo", help="solve a realistic problem with every installed backend",
                            description="Draw jobs from Gavel's measured throughputs onto Gavel's "
                                        f"continuous-trace cluster ({_gpus(DEMO_CLUSTER)}), solve with "
                                        "each backend and compare.")
    d.add_argument("--jobs", type=_positive_int, default=100, help="number of jobs (default: %(default)s)")
    d.add_argument("--seed", type=_seed, default=0, help="random seed of the workload (default: %(default)s)")
    d.add_argument("--backends", type=_name_list, metavar="NAMES",
                   help="comma-separated backends to run (default: every installed one)")
    d.add_argument("--policy", default="max_min_fairness", help="scheduling policy (default: %(default)s)")
    d.set_defaults(run=_run_demo)

    f = commands.add_parser("fit-profiles", help="fit goodput throughput models to application profiles",
                            description="Fit the Pollux throughput model for every (application, GPU type) under "
                                        "PROFILE_DIR (laid out like Sia's profiles: <app>/placements-<type>.csv, "
                                        "scalability-<type>.csv) and report the median absolute relative error of "
                                        "predicted vs measured iteration time on placements held out of the fit.")
    f.add_argument("profile_dir", metavar="PROFILE_DIR", help="directory of application profiles")
    f.add_argument("--json", metavar="OUT", dest="json_out",
                   help="also write the results as JSON to OUT (- for stdout; the table then goes to stderr)")
    f.add_argument("--loss", choices=LOSSES, default=DEFAULT_LOSS,
                   help="loss of the log-time residuals: cauchy (robust to outlying step times) or rmse (Pollux's) "
                        "(default: %(default)s)")
    f.add_argument("--loss-scale", type=float, default=DEFAULT_LOSS_SCALE, metavar="S",
                   help="scale of the cauchy loss, a log-time residual (0.05: about 5%% relative error) "
                        "(default: %(default)s)")
    f.set_defaults(run=_run_fit_profiles)

    r = commands.add_parser("run", help="run training jobs on this machine's devices or a Ray cluster, round by round",
                            description="Run the jobs of JOBS (YAML or JSON: jobs: [{name, command, total_steps, "
                                        "scale_factor, priority_weight, throughputs, gpu_types}]) to completion: "
                                        "each round solve the policy, lease devices, run, measure. State is "
                                        "journaled to --state; rerunning the command resumes every job. With "
                                        "--executor ray, jobs run on a Ray cluster whose nodes advertise the "
                                        "resources accelerator_type:TYPE.")
    r.add_argument("jobs", metavar="JOBS", help="job file (YAML needs the runtime extra, or JSON)")
    r.add_argument("--cluster", required=True, metavar="TYPE=N[,...]", help="devices to use, e.g. cpu=2 or a100=4")
    r.add_argument("--gpus-per-node", type=_counts, metavar="TYPE=N,...",
                   help="devices per server per type, which --placement packs or spreads over (default: 8 for every "
                        "type; the devices of a type are numbered server by server)")
    r.add_argument("--placement", default="best_fit", metavar="NAME",
                   help="which devices each job's GPUs are, each round: best_fit (the default), packing, scattered or "
                        "consolidated (Tiresias's model-skew rule, by the longest model name a job's name starts "
                        "with); rigid jobs")
    r.add_argument("--admission", default="accept_all", metavar="NAME",
                   help="admission control: accept_all (the default) or load_based (Blox's: jobs are admitted in "
                        "submission order while the admitted jobs ask for at most 1.2 x the cluster's GPUs; the "
                        "others wait, their message says so); rigid jobs")
    r.add_argument("--policy", default="max_min_fairness",
                   help="scheduling policy (default: %(default)s); sia runs elastic jobs (batch_size, application, "
                        "min_replicas, max_replicas) with goodput rounds")
    r.add_argument("--profiles", metavar="DIR",
                   help="application profiles the elastic jobs name (default: Sia's profiles shipped with allocopt)")
    r.add_argument("--executor", default="local", choices=["local", "ray"],
                   help="local: processes on this machine's devices; ray: Ray actors (default: local)")
    r.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to connect to (e.g. auto or HOST:6379; default: start a local instance)")
    r.add_argument("--round-seconds", type=_positive_float, default=30.0, metavar="S", help="round length (default: 30)")
    r.add_argument("--state", metavar="STATE.db",
                   help="SQLite journal, reused to resume (default: one per job file under $XDG_STATE_HOME/allocopt, "
                        "~/.local/state/allocopt without it)")
    r.add_argument("--work-dir", metavar="DIR", help="job files, logs, checkpoints (default: STATE.db.d)")
    r.add_argument("--retry-failed", action="store_true",
                   help="run again the jobs that failed in an earlier run on this --state")
    r.add_argument("--journal-env", action="store_true",
                   help="keep the jobs' env values in the journal (default: names only; values are read from JOBS)")
    r.add_argument("--grace-s", type=_non_negative_float, default=2.0, metavar="S",
                   help="seconds from a stop request to SIGKILL (default: 2)")
    r.add_argument("--max-retries", type=_non_negative_int, default=2, help="restarts of a crashing job (default: 2)")
    r.add_argument("--max-rounds", type=_positive_int, help="stop after this many rounds")
    r.set_defaults(run=_run_jobs)

    m = commands.add_parser("simulate", help="simulate a policy on a cluster over a job trace",
                            description="Simulate round-based scheduling (Gavel's priority mechanism) of a Gavel "
                                        "trace or a generated Poisson workload, or Sia rounds (--policy sia) of a "
                                        "Sia workload; print and write the metrics.")
    source = m.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE",
                        help="job trace: Gavel's (10 tab-separated columns) or another --trace-format")
    source.add_argument("--workload", metavar="FILE",
                        help="Sia workload CSV (name,time,application,num_replicas,batch_size): --policy sia runs "
                             "Sia rounds, any other policy Gavel-style rounds with requested GPUs and batch fixed")
    source.add_argument("--generate", type=_positive_int, metavar="N_JOBS",
                        help="generate N_JOBS jobs with Poisson arrivals (see --jobs-per-hour)")
    m.add_argument("--trace-format", choices=TRACE_FORMATS, default="gavel",
                   help="format of --trace: gavel (the default), philly (cluster_job_log), helios (cluster_log.csv), "
                        "pai (JOB_TABLE,TASK_TABLE: pai_job_table and pai_task_table CSVs) or tiresias (its job "
                        "CSV); a public trace's jobs run one step per second on every GPU type "
                        "(docs/reference/traces.md)")
    m.add_argument("--jobs-per-hour", type=float, default=4.0, help="arrival rate of --generate (default: %(default)s)")
    m.add_argument("--profiles", metavar="DIR",
                   help="Sia application profiles of --workload (default: the subset shipped with allocopt)")
    m.add_argument("--throughputs", metavar="FILE",
                   help="throughput table: allocopt CSV/JSON or Gavel's simulation_throughputs.json "
                        "(default: Gavel's measurements shipped with allocopt)")
    m.add_argument("--cluster", type=_counts, default=dict(DEMO_CLUSTER), metavar="TYPE=N,...",
                   help="GPUs per type, e.g. v100=36,p100=36,k80=36 (the default)")
    m.add_argument("--gpus-per-node", type=_counts, metavar="TYPE=N,...",
                   help="GPUs per server per type (default: 8 for every type)")
    m.add_argument("--policy", default="max_min_fairness_perf",
                   help="allocopt or Gavel policy name (default: %(default)s; gavel:NAME forces Gavel's meaning)")
    m.add_argument("--round-seconds", type=float, default=360.0, help="round length (default: %(default)s)")
    m.add_argument("--recompute-min-seconds", type=float, default=1920.0,
                   help="minimum seconds between allocation recomputes (default: %(default)s)")
    m.add_argument("--restart-overhead-s", type=_non_negative_float, default=0.0,
                   help="seconds lost per restart (default: %(default)s)")
    m.add_argument("--mode", choices=("mechanism", "ideal"), default="mechanism",
                   help="rounds with the priority mechanism, or the fractional allocation applied directly")
    m.add_argument("--window", type=_index_pair, metavar="A,B", help="measure JCTs of jobs A..B-1 only")
    m.add_argument("--seed", type=_seed, default=0, help="seed of random streams (default: %(default)s)")
    m.add_argument("--backend", default="highs", help="solver backend (default: %(default)s)")
    m.add_argument("--solver", metavar="NAME",
                   help="solver of --backend cvxpy (e.g. CLARABEL, an interior-point solver like the ECOS Gavel "
                        "uses: degenerate LPs then get Gavel's central allocations rather than a vertex)")
    m.add_argument("--option", dest="options", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="a policy option (repeatable); VALUE is parsed as JSON when it can be "
                        "(e.g. --option p=-1 --option solver_options='{\"solver\": \"ipm\"}')")
    m.add_argument("--fidelity", metavar="PROFILE",
                   help="whose simulator to follow: allocopt (allocopt's own model, the default), gavel (Gavel's "
                        "simulator, with Gavel's policy names) or sia (Sia's simulator, with --policy sia or "
                        "pollux) (docs/explanation/fidelity.md)")
    m.add_argument("--fidelity-field", dest="fidelity_fields", action="append", type=_key_value, default=[],
                   metavar="FIELD=BOOL", help="override one field of the fidelity profile (repeatable), "
                                              "e.g. --fidelity sia --fidelity-field packed_placement=false")
    m.add_argument("--placement", metavar="NAME",
                   help="where each round's jobs get their GPUs: best_fit (the default), packing, scattered or "
                        "consolidated (Tiresias's model-skew rule; order-based policies)")
    m.add_argument("--admission", metavar="NAME",
                   help="admission control: accept_all (the default) or load_based (Blox's, threshold 1.2)")
    m.add_argument("--tenants", metavar="FILE",
                   help="tenants' weights and GPU quotas: a CSV (tenant,weight[,gpu_quota]) or JSON file, or 'equal' "
                        "(weight 1 for every tenant the jobs name); jobs name their tenant in the trace "
                        "(docs/how-to/tenants-and-capacity.md)")
    m.add_argument("--capacity-events", metavar="FILE",
                   help="servers or GPUs joining and leaving: a CSV file time_s,gpu_type,gpus|servers (signed "
                        "changes), applied at round boundaries (docs/how-to/tenants-and-capacity.md)")
    m.add_argument("--run-unallocated", action="store_true",
                   help="let jobs that arrived after the last recompute run on GPUs the walk gives them "
                        "(Gavel holds those GPUs idle until the next recompute)")
    m.add_argument("--no-ftf", dest="ftf", action="store_false",
                   help="skip the companion isolated-share run that gives finish-time fairness")
    m.add_argument("--json", metavar="FILE", dest="json_out", help="write the full result as JSON")
    m.add_argument("--csv", metavar="FILE", dest="csv_out", help="write one row per job as CSV")
    m.add_argument("--plot", metavar="FILE", help="write a JCT CDF and utilization plot (needs matplotlib)")
    m.add_argument("--progress", action="store_true", help="show a progress bar (needs tqdm)")
    m.set_defaults(run=_run_simulate)

    w = commands.add_parser("sweep", help="run a sweep of simulations (policies x workloads x clusters x seeds)",
                            description="Expand SPEC (YAML or TOML; see docs/how-to/sweeps.md) into simulations, "
                                        "run those not yet in OUTPUT/results.csv (in processes or on Ray), and write "
                                        "the table, a summary over seeds and the standard figures. Each flag "
                                        "overrides the field of its name.")
    w.add_argument("spec", nargs="?", metavar="SPEC", help="the sweep's spec file (.yaml, .yml, .toml)")
    from allocopt.experiments.spec import FIELDS as sweep_fields
    for name, (_, text) in sweep_fields.items():
        w.add_argument("--" + name.replace("_", "-"), dest=f"sweep_{name}", metavar="VALUE", help=text)
    w.add_argument("--progress", action="store_true", help="show a progress bar (needs tqdm)")
    w.add_argument("--no-figures", dest="figures", action="store_false", help="skip the figures (matplotlib)")
    w.add_argument("--dry-run", action="store_true", help="list the points and whether each is done; run nothing")
    w.add_argument("--summary-over", default="seed", metavar="COLUMN,...",
                   help="parameter columns the summary aggregates over (default: seed; 'seed,workload,workload_path' "
                        "averages over a directory's files too)")
    w.set_defaults(run=_run_sweep)

    v = commands.add_parser("serve", help="run the HTTP JSON service (solve and a shared allocation engine)",
                            description="Serve POST /solve and the allocation engine's endpoints as JSON over HTTP "
                                        "until interrupted; GET /openapi.json describes the endpoints (see docs/how-to/http-service.md).")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    v.add_argument("--port", type=_port, default=8000, help="port (default: %(default)s; 0 picks a free one)")
    v.add_argument("--cluster", type=_cluster_arg, metavar="JSON",
                   help='start the engine with this cluster, e.g. \'{"v100": 4, "k80": 8}\' '
                        '(else POST /engine configures it)')
    v.add_argument("--policy", default="max_min_fairness",
                   help="the engine's policy (default: %(default)s); a goodput policy (sia) starts a goodput engine "
                        "of elastic jobs, served under /elastic")
    v.add_argument("--backend", default="highs", help="the engine's backend (default: %(default)s)")
    v.add_argument("--round-seconds", type=float, default=60.0, metavar="SECONDS",
                   help="with a goodput policy: the length of a round (default: %(default)g)")
    v.add_argument("--profiles", metavar="DIR",
                   help="application profiles elastic jobs may name (default: Sia's profiles shipped with allocopt)")
    v.add_argument("--state", metavar="FILE",
                   help="restore the engine from FILE if it exists (over --cluster and --policy) and save it there "
                        "after every change")
    v.add_argument("--quiet", action="store_true", help="do not log requests to stderr")
    add_serve_arguments(v)
    v.set_defaults(run=_run_serve)

    for name, (module, help_text) in LAZY_COMMANDS.items():
        if name == command:
            importlib.import_module(module).add_parser(commands)
        else:
            commands.add_parser(name, help=help_text)
    return parser


def _write_json(document: Any, path: str | None) -> None:
    """``document`` as indented JSON to ``path``, or to stdout for None or ``-``."""
    text = json.dumps(document, indent=2) + "\n"
    if path in (None, "-"):
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise _UsageError(f"cannot write {path}: {err.strerror or err}") from None


# ----- argument types ---------------------------------------------------------------
def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:  # NaN, Infinity and 1e999 stay strings: the option's check rejects them by name
        parsed = json.loads(value, parse_constant=lambda name: value)
        if isinstance(parsed, float) and not math.isfinite(parsed):
            parsed = value
        return key.strip(), parsed
    except (ValueError, RecursionError):
        return key.strip(), value


def _integer(low: int, high: int, expected: str) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``, else "expected ``expected``"."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


def _number(positive: bool, expected: str) -> Callable[[str], float]:
    """An argparse type: a finite number, > 0 (``positive``) or >= 0, else "expected ``expected``"."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (0 < value if positive else 0 <= value) or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_seed = _integer(0, 2**63 - 1, "a seed, an integer >= 0")
_non_negative_int = _integer(0, 2**31 - 1, "an integer >= 0")
_port = _integer(0, 65535, "a TCP port 0-65535")
_positive_int = _integer(1, 2**63 - 1, "a positive integer")
_positive_float = _number(True, "a positive finite number")
_non_negative_float = _number(False, "a finite number >= 0")


def _name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


@contextlib.contextmanager
def _solver_output_to_stderr() -> Iterator[None]:
    """Send what solvers print to file descriptor 1 (logs, license banners) to stderr,
    so that stdout carries only allocopt's own output."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _error(message: str, code: int) -> int:
    print(f"allocopt: error: {message}", file=sys.stderr)
    return code


# ----- allocopt solve -----------------------------------------------------------------
def _run_solve(args: argparse.Namespace) -> int:
    options = dict(args.options)
    clashes = sorted(set(options) & set(_FLAGS))
    if clashes:
        raise InvalidOptionError(f"--option {clashes[0]}=... is not allowed; use {_FLAGS[clashes[0]]}")
    problem = _read_problem(args.problem)
    with _solver_output_to_stderr():
        allocation = solve(problem, args.policy, backend=args.backend, time_limit_s=args.time_limit_s,
                           best_effort=args.best_effort, **options)
    _write_json(allocation.to_json(), args.out)  # a non-optimal status was logged as a warning by solve
    return 0


def _read_problem(source: str) -> Problem:
    if source == "-":
        name, text = "<stdin>", decode(sys.stdin.buffer.read(), "<stdin>")
    else:
        name, text = source, read_text(source, what="problem file")
    try:
        return Problem.from_json(parse_json(text, name))
    except AllocoptError as err:
        if isinstance(err, DataFileError):
            raise
        raise DataFileError(str(err), path=name) from None


# ----- allocopt demo --------------------------------------------------------------------
def _run_demo(args: argparse.Namespace) -> int:
    get_policy(args.policy)
    names = args.backends or installed_backends()
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise UnknownBackendError(f"unknown backend(s) {unknown} in --backends; choose from {', '.join(BACKENDS)}")
    for name in names:
        get_backend(name).check_installed()

    table = ThroughputTable.gavel()
    cluster = Cluster(DEMO_CLUSTER)
    jobs = table.sample_jobs(cluster, args.jobs, seed=args.seed)
    problem = table.sample_problem(cluster, args.jobs, seed=args.seed)
    print(f"allocopt demo: {args.policy} on {args.jobs} jobs drawn from Gavel's measured throughputs "
          f"(seed {args.seed})\n")
    _print_problem(problem, jobs)

    allocations: dict[str, Allocation] = {}
    rows, notes, failed = [], [], False
    for name in names:
        try:
            with _solver_output_to_stderr():
                alloc = solve(problem, args.policy, backend=name)
        except LicenseError as err:
            rows.append([name, "skipped"] + ["-"] * 5)
            notes.append(f"{name}: skipped, {err}")
            continue
        except (NotOptimalError, SolverError) as err:
            rows.append([name, "failed"] + ["-"] * 5)
            notes.append(f"{name}: {err}")
            failed = True
            continue
        allocations[name] = alloc
        t = alloc.timings
        rows.append([name, alloc.status.value, _number(alloc.objective)]
                    + [f"{v:.4f}" for v in (t.model_build_s, t.solver_build_s, t.solve_s, t.total_s)])
    print("Backends (times in seconds)")
    print(_format_table(["backend", "status", "objective", "model build", "solver build", "solve", "total"],
                        rows, left=2))
    for note in notes:
        print(f"  note: {note}")
    objectives = [a.objective for a in allocations.values() if a.objective is not None]
    if len(objectives) > 1:
        spread = (max(objectives) - min(objectives)) / max(max(map(abs, objectives)), 1e-12)
        print(f"  agreement: max relative objective difference across {len(objectives)} backends: {spread:.1e}")
    if allocations:
        name, alloc = next(iter(allocations.items()))
        print(f"\nAllocation by {name} ({args.policy})")
        _print_allocation(alloc, jobs)
    return EXIT_FAILURE if failed or not allocations else 0


# ----- allocopt run ---------------------------------------------------------------------
def _run_jobs(args: argparse.Namespace) -> int:
    import signal

    from allocopt.runtime.devices import devices_for_cluster
    from allocopt.runtime.local import LocalExecutor
    from allocopt.runtime.loop import Scheduler, StateStore, default_state_path, load_jobs, parse_cluster

    from allocopt.mechanism.admission import admission_policy
    from allocopt.mechanism.placement_policies import placement_policy

    if args.ray_address is not None and args.executor != "ray":
        raise _UsageError("--ray-address needs --executor ray")
    get_policy(args.policy)
    placement_policy(args.placement)  # unknown names fail before any job starts
    admission_policy(args.admission)
    invalid: dict[str, str] = {}
    try:
        jobs = load_jobs(args.jobs, invalid=invalid)
    except OSError as err:
        raise _UsageError(f"cannot read job file {args.jobs}: {err.strerror or err}") from None
    gpus = parse_cluster(args.cluster)
    unknown = sorted(set(args.gpus_per_node or {}) - set(gpus))
    if unknown:
        raise _UsageError(f"--gpus-per-node names type(s) {unknown} that --cluster does not have ({args.cluster})")
    cluster = Cluster(gpus, {t: (args.gpus_per_node or {}).get(t, 8) for t in gpus})
    state_path = args.state or default_state_path(args.jobs)
    work_dir = args.work_dir or f"{state_path}.d"
    if args.state is None:  # say where the default put them
        print(f"allocopt run: state {state_path}, work directory {work_dir}", file=sys.stderr)

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    state = None
    try:
        state = StateStore(state_path, store_env=args.journal_env)  # locked before any job process is touched
        if args.executor == "ray":
            from allocopt.runtime.ray_executor import RayExecutor

            executor: LocalExecutor = RayExecutor({}, gpus, work_dir, address=args.ray_address, grace_s=args.grace_s,
                                                  max_retries=args.max_retries)
        else:
            executor = LocalExecutor({}, devices_for_cluster(gpus), work_dir, grace_s=args.grace_s,
                                     max_retries=args.max_retries)
        with _solver_output_to_stderr():
            scheduler = Scheduler(jobs, cluster, executor, state, policy=args.policy, placement=args.placement,
                                  admission=args.admission,
                                  round_seconds=args.round_seconds, out=None if args.quietness else sys.stderr,
                                  rejected=invalid,
                                  retry_failed=args.retry_failed, profiles=args.profiles)
            report = scheduler.run(args.max_rounds)
    except sqlite3.DatabaseError as err:
        raise DataFileError(f"the state journal is not a usable SQLite database ({err}); move it away to start "
                            "afresh, or point --state at another file", path=state_path) from None
    except KeyboardInterrupt:
        print(f"allocopt: interrupted: the jobs were stopped, their progress is kept in {state_path}; rerun the "
              "same command to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if state is not None:
            state.close()
    print(json.dumps(report, indent=2, default=str))
    return EXIT_FAILURE if any(j["status"] == "failed" for j in report["jobs"].values()) else 0


# ----- allocopt simulate ------------------------------------------------------------------
def _counts(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected TYPE=N,... with integer N >= 0, got {text!r}")
        out[key.strip()] = int(value)
    return out


def _index_pair(text: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A,B (job indices), got {text!r}") from None
    return a, b


TRACE_FORMATS = ("gavel", "philly", "helios", "pai", "tiresias")
#: Tenants whose metrics ``allocopt simulate`` prints (all are in --json's result).
MAX_TENANTS_PRINTED = 20


def _read_public_trace(path: str, trace_format: str, gpu_types: list[str]) -> Any:
    """A :class:`~allocopt.mechanism.traces.TraceWorkload` from ``--trace`` of a public ``trace_format``."""
    from allocopt.mechanism.traces import read_trace

    task_table = None
    if trace_format == "pai":
        path, sep, task_table = path.partition(",")
        if not sep or not path or not task_table:
            raise _UsageError(f"--trace-format pai takes --trace JOB_TABLE,TASK_TABLE, got {path + sep + task_table!r}")
    return read_trace(path, trace_format, gpu_types, task_table=task_table)


def _run_simulate(args: argparse.Namespace) -> int:
    from allocopt.extras import require_extra
    from allocopt.mechanism import generate_workload, simulate
    from allocopt.mechanism.workload import load_throughputs, read_gavel_trace

    from allocopt.throughput.profiles import shipped_profiles_dir

    if args.profiles and not args.workload:
        raise _UsageError("--profiles goes with --workload (a Sia workload)")
    if args.trace_format != "gavel" and (args.throughputs or not args.trace):
        raise _UsageError(f"--trace-format {args.trace_format} goes with --trace, without --throughputs (a public "
                          "trace's jobs run one step per second on every GPU type)")
    if args.plot:  # optional extras are checked before the simulation runs
        require_extra("matplotlib", "plot", "--plot")
    if args.progress:
        require_extra("tqdm", "progress", "--progress")
    profiles = (args.profiles or shipped_profiles_dir()) if args.workload else None
    try:
        table = load_throughputs(args.throughputs) if args.throughputs else ThroughputTable.gavel()
        cluster = Cluster(args.cluster, args.gpus_per_node or 8)
        if args.trace and args.trace_format != "gavel":
            converted = _read_public_trace(args.trace, args.trace_format, list(cluster.gpu_types))
            workload, table = converted.workload, converted.throughputs
            skipped = ", ".join(f"{n} ({rule})" for rule, n in converted.skipped.items() if n)
            logger.info("%s: %d jobs%s", args.trace, workload.num_jobs, f"; left out: {skipped}" if skipped else "")
        else:
            workload = (args.workload if args.workload else read_gavel_trace(args.trace, table) if args.trace else
                        generate_workload(table, args.generate, jobs_per_hour=args.jobs_per_hour, seed=args.seed,
                                          cluster=cluster))
    except OSError as err:
        raise _UsageError(f"cannot read {err.filename}: {err.strerror or err}") from None
    options = dict(args.options)
    if args.solver:
        if "solver_options" in options:
            raise _UsageError("--solver and --option solver_options=... both set the solver; give one")
        options["solver_options"] = {"solver": args.solver}
    fidelity = None
    if args.fidelity is not None or args.fidelity_fields:
        fidelity = dict(args.fidelity_fields)
        if args.fidelity is not None:
            fidelity["profile"] = args.fidelity
    with _solver_output_to_stderr():
        result = simulate(workload, cluster, args.policy, throughputs=table, round_seconds=args.round_seconds,
                          recompute_min_seconds=args.recompute_min_seconds, seed=args.seed, mode=args.mode,
                          restart_overhead_s=args.restart_overhead_s, window=args.window, backend=args.backend,
                          progress=args.progress, profiles=profiles, run_unallocated=args.run_unallocated,
                          ftf=args.ftf, policy_options=options or None, fidelity=fidelity,
                          placement=args.placement, admission=args.admission, tenants=args.tenants,
                          capacity_events=args.capacity_events)
    for key in ("average_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "utilization", "restarts_per_job",
                "gpu_hours_per_job", "num_rounds", "solve_s_per_round", "average_ftf", "max_ftf", "unfair_fraction"):
        if key in result.metrics:
            print(f"{key}: {result.metrics[key]:.6g}")
    per_tenant = list(result.metrics.get("tenants", {}).items())
    for tenant, values in per_tenant[:MAX_TENANTS_PRINTED]:
        print(f"tenant {tenant}: " + ", ".join(f"{k} {v:.6g}" for k, v in values.items()))
    if len(per_tenant) > MAX_TENANTS_PRINTED:
        print(f"... {len(per_tenant) - MAX_TENANTS_PRINTED} more tenants (--json writes them all)")
    try:
        if args.json_out:
            result.to_json(args.json_out)
        if args.csv_out:
            result.to_csv(args.csv_out)
        if args.plot:
            result.plot(args.plot)
    except OSError as err:
        raise _UsageError(f"cannot write {err.filename}: {err.strerror or err}") from None
    return 0


# ----- allocopt sweep ----------------------------------------------------------------------
def _run_sweep(args: argparse.Namespace) -> int:
    from allocopt.experiments import expand, load_spec, plot_sweep, run_sweep, summarize, write_summary
    from allocopt.experiments.spec import FIELDS as sweep_fields
    from allocopt.experiments.table import ResultsTable
    from allocopt.extras import require_extra

    spec = load_spec(args.spec, {name: getattr(args, f"sweep_{name}") for name in sweep_fields})
    if args.figures and not args.dry_run:  # optional extras are checked before the runs
        require_extra("matplotlib", "plot", "the sweep's figures (or --no-figures)")
    points = expand(spec)
    if args.dry_run:
        done = ResultsTable(Path(spec.output) / "results.csv").keys if (Path(spec.output) / "results.csv").exists() \
            else set()
        for p in points:
            print(f"{p.key} {'done' if p.key in done else 'todo'} {p.params['policy_label']} {p.params['workload']} "
                  f"rate={p.params['jobs_per_hour']} cluster={p.params['cluster']} seed={p.params['seed']}")
        return 0
    result = run_sweep(spec, progress=args.progress, points=points)
    summary = summarize(result.rows, over=[c.strip() for c in args.summary_over.split(",") if c.strip()])
    write_summary(summary, Path(spec.output) / "summary.csv")
    figures = plot_sweep(result.rows, spec.output) if args.figures else []
    print(f"points: {len(points)} ({result.ran} run, {result.skipped} already done, {len(result.failed)} failed) "
          f"in {result.wall_s:.1f} s")
    for params, error in result.failed:
        print(f"failed: {params['policy_label']} {params['workload']} seed {params['seed']}: {error}")
    for row in summary:
        if row["metric"] == "average_jct_s":
            ci = "" if row["ci95_low"] is None else \
                f" (95% CI {row['ci95_low'] / 3600:.3f}..{row['ci95_high'] / 3600:.3f})"
            rate = "" if row.get("jobs_per_hour") is None else f" {row['jobs_per_hour']:g} jobs/h"
            print(f"{row.get('policy_label')} {row.get('workload', row.get('workload_set'))}{rate} {row.get('cluster')}: "
                  "average JCT "
                  f"{row['mean'] / 3600:.3f} h{ci}, n={row['n']}")
    print(f"table: {result.table}" + (f", {result.parquet}" if result.parquet else ""))
    print(f"summary: {Path(spec.output) / 'summary.csv'}")
    for path in figures:
        print(f"figure: {path}")
    return EXIT_FAILURE if result.failed else 0


# ----- allocopt serve ----------------------------------------------------------------------
def _cluster_arg(text: str) -> Cluster:
    try:
        document = json.loads(text)
        return Cluster.from_dict(document) if isinstance(document, dict) and "gpus" in document else Cluster(document)
    except (json.JSONDecodeError, InvalidProblemError) as err:
        raise argparse.ArgumentTypeError(f"expected a JSON object of GPU type to count, got {text!r}: {err}")


def _run_serve(args: argparse.Namespace) -> int:
    from allocopt.engine import Engine
    from allocopt.server import serve
    from allocopt.server.options import from_arguments, read_token

    from allocopt.documents import parse_json, read_text
    from allocopt.runtime.elastic import GoodputEngine, GoodputOptions, is_goodput_policy, load_job_profiles

    token = None if args.token_file is None else read_token(args.token_file)
    if args.profiles is not None and not Path(args.profiles).is_dir():
        raise _UsageError(f"--profiles {args.profiles}: not a directory")
    if not 0 < args.round_seconds < float("inf"):
        raise _UsageError(f"--round-seconds must be a positive number of seconds, got {args.round_seconds:g}")
    engine: Engine | GoodputEngine | None = None
    if args.state is not None and Path(args.state).exists():
        document = parse_json(read_text(args.state, what="the engine state"), args.state)
        if isinstance(document, dict) and document.get("format") == "allocopt-goodput-engine":
            apps = {job.get("spec", {}).get("application") for job in document.get("jobs", [])
                    if isinstance(job, dict) and isinstance(job.get("spec"), dict)}
            engine = GoodputEngine.from_json(document, load_job_profiles(args.profiles, sorted(a for a in apps if
                                                                                              isinstance(a, str))))
        else:
            engine = Engine.load(args.state)
    elif args.cluster is not None and is_goodput_policy(args.policy):
        engine = GoodputEngine(args.cluster, args.policy, round_seconds=args.round_seconds,
                               options=GoodputOptions({"backend": args.backend}))
    elif args.cluster is not None:
        engine = Engine(args.cluster, args.policy, args.backend)
    try:
        serve(args.host, args.port, engine, options=from_arguments(args), state_path=args.state, token=token,
              quiet=args.quiet or args.quietness > 0,
              announce=lambda line: print(line, file=sys.stderr, flush=True), profiles=args.profiles)
    except OSError as err:
        raise _UsageError(f"cannot serve on {args.host}:{args.port}: {err.strerror or err}") from None
    return 0


# ----- allocopt fit-profiles -------------------------------------------------------------
def _run_fit_profiles(args: argparse.Namespace) -> int:
    from allocopt.throughput.profiles import ProfileFormatError, discover, load_application

    try:
        pairs = discover(args.profile_dir)
    except ProfileFormatError as err:
        raise _UsageError(str(err)) from None
    results: list[dict[str, Any]] = []
    rows = []
    for app, gpu_type in pairs:
        try:
            profile = load_application(args.profile_dir, app, gpu_type)
            held = profile.heldout_error(loss=args.loss, loss_scale=args.loss_scale)
        except ProfileFormatError as err:
            logger.warning("skipped %s on %s: %s", app, gpu_type, err)
            results.append({"application": app, "gpu_type": gpu_type, "median_abs_rel_error": None,
                            "n_heldout": 0, "error": str(err)})
            rows.append([app, gpu_type, "-", "0", "skipped"])
            continue
        error = None if np.isnan(held.median_abs_rel_error) else held.median_abs_rel_error
        results.append({"application": app, "gpu_type": gpu_type, "median_abs_rel_error": error,
                        "n_heldout": held.n_heldout})
        rows.append([app, gpu_type, str(len(profile.observations)), str(held.n_heldout),
                     "-" if error is None else f"{error:.1%}"])
    if all("error" in r for r in results):
        raise _UsageError(f"no (application, GPU type) pair under {args.profile_dir} could be fitted")
    table = sys.stderr if args.json_out == "-" else sys.stdout
    print(f"Held-out iteration-time error of the fitted throughput model ({args.profile_dir})", file=table)
    print(_format_table(["application", "GPU type", "rows", "held out", "median |rel. error|"], rows, left=2),
          file=table)
    fitted = [r["median_abs_rel_error"] for r in results if r["median_abs_rel_error"] is not None]
    print(f"  {sum(e <= 0.10 for e in fitted)} of {len(fitted)} pairs with multi-GPU data within 10%", file=table)
    if args.json_out is not None:
        _write_json(results, args.json_out)
    return 0


def _print_problem(problem: Problem, jobs: Sequence[tuple[str, int]]) -> None:
    cluster = problem.cluster
    gpus = _gpus(dict(zip(cluster.gpu_types, cluster.capacity.tolist())), sep="  ")
    scales, counts = np.unique(problem.scale_factors, return_counts=True)
    by_scale = ", ".join(f"{c} x {s} GPU{'s' if s > 1 else ''}" for s, c in zip(scales, counts))
    print(f"Cluster  {gpus}  ({cluster.capacity.sum()} GPUs)")
    print(f"Jobs     {problem.num_jobs} jobs of {len({m for m, _ in jobs})} models: {by_scale} "
          f"({problem.scale_factors.sum()} GPUs requested)\n")


def _print_allocation(alloc: Allocation, jobs: Sequence[tuple[str, int]]) -> None:
    problem = alloc.problem
    used = alloc.gpus_used
    print(_format_table(["GPU type", "GPUs used", "capacity", "utilization"],
                        [[t, f"{u:.1f}", str(c), f"{u / c:.1%}" if c else "-"]
                         for t, u, c in zip(problem.gpu_types, used, problem.capacity)]))
    norm = alloc.fair_share_ratio
    print(f"\nFair-share ratio s*e/(w*p), 1.0 = a cluster-proportional share: "
          f"min {norm.min():.3f}  median {np.median(norm):.3f}  max {norm.max():.3f}")
    order = np.argsort(norm, kind="stable")
    picks = order[np.unique(np.linspace(0, len(order) - 1, 5).round().astype(int))]
    print("\nExample jobs, from lowest to highest fair-share ratio (time fraction per GPU type)")
    rows = [[str(problem.job_ids[i]), jobs[i][0], str(jobs[i][1])]
            + [f"{x:.3f}" for x in alloc.matrix[i]]
            + [f"{alloc.effective_throughput[i]:.2f}", f"{norm[i]:.3f}"] for i in picks]
    print(_format_table(["job", "model", "GPUs", *problem.gpu_types, "steps/s", "ratio"], rows,
                        left=2))


def _gpus(counts: dict[str, int], sep: str = ", ") -> str:
    return sep.join(f"{t}={c}" for t, c in counts.items())


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _format_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """Fixed-width columns, the first ``left`` left-aligned and the rest right-aligned."""
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if k < left else cell.rjust(w)
                       for k, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in [header, *rows]]
    return "\n".join("  " + line for line in lines)
