"""Fuzzing every non-HTTP input boundary: problem documents, traces, workloads, throughput tables,
job files, engine state documents and the command line.

Each target feeds one generated input to the real reader (real files in a temporary directory) and
returns its outcome: ``accepted`` or the name of the typed error (:mod:`allocopt.errors`) it raised.
Anything else (an untyped exception, a traceback or exit status 3 from the CLI, a document the JSON
Schema rejects but the reader accepts, an accepted engine state that later breaks) fails. The CI
budget is ``ALLOCOPT_FUZZ_EXAMPLES`` examples per target (default 100); ``benchmarks/fuzz_inputs.py``
runs the same targets with a long budget and prints the counts by outcome.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocopt
from allocopt import cli
from allocopt.errors import AllocoptError, InvalidProblemError
from allocopt.mechanism.sia_workloads import read_sia_workload
from allocopt.mechanism.workload import TRACE_COLUMNS, load_throughputs, read_gavel_trace
from allocopt.runtime.executor import JobRoundResult, RoundOutcome
from allocopt.runtime.loop import load_jobs
from allocopt.throughput import ThroughputTable

EXAMPLES = int(os.environ.get("ALLOCOPT_FUZZ_EXAMPLES", "100"))
SCHEMAS = Path(allocopt.__file__).parent / "schemas"

# ----- generators -------------------------------------------------------------------------------
GPU_TYPES = ["v100", "k80", "a100"]
huge_ints = st.sampled_from([2**31, 2**53 + 1, 2**63, 10**300, -(10**30)])
numbers = st.one_of(st.integers(-3, 10), st.floats(allow_nan=True, allow_infinity=True), huge_ints,
                    st.sampled_from([1e300, 5e-324, -0.0, 1e-300, 0.5]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=6),
                    st.sampled_from(["2", "abc", "", "v100", "\t", "é", "NaN"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["id", "x", *GPU_TYPES, "gpus", ""]), inner,
                                                 max_size=3)), max_leaves=8)


@st.composite
def problem_documents(draw: st.DrawFn) -> dict:
    types = draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=3, unique=True))
    doc: dict[str, Any] = {"cluster": {"gpus": {t: draw(st.integers(0, 6)) for t in types}}, "jobs": []}
    for k in range(draw(st.integers(0, 4))):
        job: dict[str, Any] = {"id": draw(st.sampled_from([k, f"job-{k}"])),
                               "throughputs": {t: draw(st.one_of(st.just(0.0), st.floats(0.01, 100)))
                                               for t in types}}
        for name, values in (("scale_factor", st.integers(1, 3)), ("priority_weight", st.floats(0.1, 10)),
                             ("num_steps_remaining", st.floats(0, 1e6)), ("entity", st.sampled_from(["u", 1]))):
            if draw(st.booleans()):
                job[name] = draw(values)
        doc["jobs"].append(job)
    return doc


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for k, value in enumerate(node):
            out += _paths(value, (*prefix, k))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy) -> Any:
    """A valid document with 0-3 random edits: a value replaced, a key removed, a key added."""
    doc = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(doc)
        path = paths[draw(st.integers(0, len(paths) - 1))]
        if not path:
            continue
        parent = functools.reduce(lambda node, key: node[key], path[:-1], doc)
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "gpus_per_node", "slo_s", "id", "format"]))] = draw(json_values)
    return doc


def as_bytes(document: Any) -> st.SearchStrategy[bytes]:
    """JSON text of a document, spliced with junk at a random point, or junk alone."""
    text = json.dumps(document).encode()

    def splice(k: int, junk: bytes) -> bytes:
        k %= len(text) + 1
        return text[:k] + junk + text[k:]

    return st.one_of(st.just(text), st.builds(splice, st.integers(0, 10**6), st.binary(max_size=8)),
                     st.binary(max_size=40))


@st.composite
def engine_states(draw: st.DrawFn) -> dict:
    doc = draw(problem_documents())
    jobs = [j for j in doc["jobs"] if any(v > 0 for v in j["throughputs"].values())]
    engine = allocopt.Engine({t: max(c, 2) for t, c in doc["cluster"]["gpus"].items()}, round_seconds=60.0,
                             recompute_min_seconds=0.0)
    for job in jobs:
        engine.add_job(job["id"], throughputs=job["throughputs"])
    for _ in range(draw(st.integers(0, 2))):
        engine.next_round()
    return engine.to_json()


def trace_lines() -> st.SearchStrategy[bytes]:
    good = ["ResNet-18 (batch size 16)", "cmd", "dir", "--n", "False", "1000", "1", "1", "-1", "0"]
    field = st.one_of(st.sampled_from(["1e400", "nan", "-1", "0", "1e300", "9" * 5000, "", "x", "2.5", "inf"]),
                      st.text(max_size=5))
    line = st.builds(lambda edits: "\t".join(edits.get(k, v) for k, v in enumerate(good)),
                     st.dictionaries(st.integers(0, len(TRACE_COLUMNS)), field, max_size=3))
    text = st.lists(line, min_size=0, max_size=4).map(lambda lines: "\n".join(lines).encode())
    return st.one_of(text, st.binary(max_size=60), st.builds(lambda t, b: t + b, text, st.binary(max_size=4)))


def csv_text(header: str, good_row: list[str]) -> st.SearchStrategy[bytes]:
    cell = st.one_of(st.sampled_from(["1e400", "nan", "-1", "0", "1e300", "9" * 5000, "", "x", '"', "2"]),
                     st.text(max_size=5))
    row = st.builds(lambda edits: ",".join(edits.get(k, v) for k, v in enumerate(good_row)),
                    st.dictionaries(st.integers(0, len(good_row)), cell, max_size=2))
    body = st.lists(row, max_size=4).map(lambda rows: "\n".join([header, *rows]).encode())
    return st.one_of(body, st.binary(max_size=60), st.builds(lambda t, b: t + b, body, st.binary(max_size=4)))


def job_files() -> st.SearchStrategy[tuple[str, bytes]]:
    base = st.just({"jobs": [{"name": "a", "command": "true", "total_steps": 3},
                             {"name": "b", "command": ["python", "-c", "pass"], "total_steps": 5, "scale_factor": 1,
                              "priority_weight": 2.0, "throughputs": {"cpu": 1.0}, "env": {"X": "1"}}]})
    yaml_junk = st.sampled_from([b"jobs: [\n", b"jobs:\n  - name: a\n\tcommand: x\n", b"jobs: &a [*a]\n",
                                 b"a: &a [*a, *a]\nb: &b [*a, *a]\njobs: [*b, *b]\n", b"jobs: !!python/object x\n",
                                 b"jobs:\n  - {name: a, command: x, total_steps: " + b"9" * 5000 + b"}\n",
                                 b"[" * 3000, b"jobs: " + b"[" * 3000])
    return st.tuples(st.sampled_from(["jobs.yaml", "jobs.json", "jobs.txt"]),
                     st.one_of(mutated(base).flatmap(as_bytes), yaml_junk, st.binary(max_size=40)))


# ----- targets: one input -> its outcome -----------------------------------------------------------
def outcome(call: Callable[[], Any]) -> str:
    """``accepted``, or the typed error's class name; any other exception propagates."""
    try:
        call()
    except AllocoptError as err:
        assert str(err), f"{type(err).__name__} without a message"
        return type(err).__name__
    return "accepted"


@functools.cache
def _validator(name: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    schemas = {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}
    registry = referencing.Registry().with_resources(
        [(s["$id"], referencing.Resource.from_contents(s)) for s in schemas.values()]
        + [(n, referencing.Resource.from_contents(s)) for n, s in schemas.items()])
    return jsonschema.Draft202012Validator(schemas[name], registry=registry)


def _schema_valid(name: str, document: Any) -> bool:
    try:
        text = json.dumps(document, allow_nan=False)
    except (ValueError, TypeError):
        return False  # not JSON at all: NaN or Infinity
    return _validator(name).is_valid(json.loads(text))


def problem_document(document: Any) -> str:
    result = outcome(lambda: allocopt.Problem.from_json(document))
    if result == "accepted":
        assert _schema_valid("problem.schema.json", document), "accepted a document the schema rejects"
    return result


def problem_file(workdir: Path, data: bytes) -> str:
    path = workdir / "problem.json"
    path.write_bytes(data)
    return run_cli(["solve", str(path)])


def engine_state(document: Any) -> str:
    try:
        engine = allocopt.Engine.from_json(document)
    except InvalidProblemError as err:
        assert str(err)
        return type(err).__name__
    assert _schema_valid("engine_state.schema.json", document), "accepted a state the schema rejects"
    # a state that loads works: allocate, plan, record, and saves as valid JSON
    with contextlib.suppress(AllocoptError):  # e.g. InvalidProblemError: jobs without a common field set
        engine.allocate()
    engine.record_round([])
    with contextlib.suppress(AllocoptError):
        plan = engine.next_round()
        engine.record_round([JobRoundResult(lease.job_id, RoundOutcome.PREEMPTED, 1, plan.round_seconds, 1.0)
                             for lease in plan.leases])
    json.dumps(engine.to_json(), allow_nan=False)
    return "accepted"


def trace_file(workdir: Path, data: bytes) -> str:
    path = workdir / "jobs.trace"
    path.write_bytes(data)
    return outcome(lambda: read_gavel_trace(path, _gavel_table()))


def sia_workload_file(workdir: Path, data: bytes) -> str:
    path = workdir / "workload.csv"
    path.write_bytes(data)
    return outcome(lambda: read_sia_workload(path))


def throughput_file(workdir: Path, name: str, data: bytes) -> str:
    path = workdir / name
    path.write_bytes(data)
    return outcome(lambda: load_throughputs(path))


def job_file(workdir: Path, name: str, data: bytes) -> str:
    path = workdir / name
    path.write_bytes(data)
    return outcome(lambda: load_jobs(path))


def run_cli(argv: list[str]) -> str:
    """Exit status of ``allocopt ARGV`` run in this process: 0, 1 or 2 with no traceback; never 3."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit_:  # argparse: usage errors (2) and --help (0)
            code = exit_.code
    assert "Traceback" not in err.getvalue(), err.getvalue()
    assert code in (0, 1, 2), f"exit {code}: {err.getvalue()}"
    if code:
        assert err.getvalue().strip(), "an error exit without a message"
    return f"exit {code}"


@functools.cache
def _gavel_table() -> ThroughputTable:
    return ThroughputTable.gavel()


OPTION_KEYS = ["heterogeneity_aware", "space_sharing", "threads", "verbose", "mip_gap", "solver_options",
               "column_generation", "seed", "best_effort", "time_limit_s", "nope", ""]
OPTION_VALUES = ["true", "false", "maybe", "1", "0", "-1", "2.5", "NaN", "1e999", "null", "{}", "[]", '"x"',
                 "9" * 5000, "[" * 2000, ""]


def cli_arguments() -> st.SearchStrategy[list[str]]:
    """Arguments of ``allocopt solve PROBLEM`` (PROBLEM: a valid file) with random flags and values."""
    option = st.builds(lambda k, v: ["--option", f"{k}={v}"], st.sampled_from(OPTION_KEYS),
                       st.sampled_from(OPTION_VALUES))
    flag = st.one_of(option, st.builds(lambda v: ["--policy", v], st.sampled_from(
        ["max_min_fairness", "water_filling", "max_throughput", "sia", "min_makespan", "finish_time_fairness",
         "fifo", "gandiva", "allox", "isolated", "proportional", "nope", ""])),
        st.builds(lambda v: ["--backend", v], st.sampled_from(["highs", "scipy", "auto", "nope"])),
        st.builds(lambda v: ["--time-limit-s", v], st.sampled_from(["1", "0", "-1", "nan", "inf", "x", "1e999"])),
        st.just(["--best-effort"]), st.sampled_from([["-v"], ["-q"], ["--bogus"], ["-"], ["--out", "OUT"]]))
    return st.lists(flag, max_size=4).map(lambda flags: [token for f in flags for token in f])


def cli_bad_files() -> st.SearchStrategy[tuple[list[str], bytes]]:
    """Every command pointed at a malformed file, with extra flags of that command."""
    commands = st.sampled_from([
        ["solve", "FILE"], ["run", "FILE", "--cluster", "cpu=1", "--state", "STATE"],
        ["simulate", "--trace", "FILE"], ["simulate", "--workload", "FILE"],
        ["simulate", "--generate", "2", "--throughputs", "FILE"], ["serve", "--port", "0", "--state", "FILE"],
        ["fit-profiles", "FILE"]])
    extra = st.lists(st.sampled_from(["--policy", "nope", "--cluster", "v100=x", "--round-seconds", "-1", "1e999",
                                      "--max-rounds", "0", "--seed", "x", "--window", "1,x", "--port", "-1"]),
                     max_size=3)
    junk = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"{", b"[" * 5000, b"\xff\xfe", b"\x00",
                                                             b"jobs: [\n", b'{"format": "allocopt-engine"}']))
    return st.tuples(st.builds(lambda c, e: c + e, commands, extra), junk)


def cli_bad_file(workdir: Path, argv: list[str], data: bytes) -> str:
    (workdir / "FILE").write_bytes(data)
    return run_cli([str(workdir / a) if a in ("FILE", "STATE") else a for a in argv])


_JOBS = [{"id": "a", "throughputs": {"v100": 4.0, "k80": 1.0}}, {"id": "b", "throughputs": {"v100": 2.0, "k80": 1.5}}]
#: Problems for the CLI: plain, with steps and deadlines, with pairs and entities.
CLI_PROBLEMS = [
    {"cluster": {"gpus": {"v100": 1, "k80": 1}}, "jobs": _JOBS},
    {"cluster": {"gpus": {"v100": 1, "k80": 1}},
     "jobs": [{**job, "num_steps_remaining": 1000.0, "slo_s": 900.0} for job in _JOBS]},
    {"cluster": {"gpus": {"v100": 1, "k80": 1}}, "jobs": [{**job, "entity": job["id"]} for job in _JOBS],
     "entity_weights": {"a": 2.0, "b": 1.0},
     "pairs": [{"jobs": ["a", "b"], "throughputs": {"v100": [3.0, 1.0], "k80": [0.5, 1.0]}}]},
]


def cli_solve(workdir: Path, problem: int, argv: list[str]) -> str:
    path = workdir / "problem.json"
    path.write_text(json.dumps(CLI_PROBLEMS[problem]))
    return run_cli(["solve", str(path), *[str(workdir / "out.json") if a == "OUT" else a for a in argv]])


#: name -> (strategy of the input, target(workdir, *input) -> outcome); benchmarks/fuzz_inputs.py runs these.
TARGETS: dict[str, tuple[st.SearchStrategy, Callable[..., str]]] = {
    "problem document": (st.tuples(st.one_of(mutated(problem_documents()), json_values)),
                         lambda workdir, doc: problem_document(doc)),
    "problem file (allocopt solve)": (st.tuples(problem_documents().flatmap(as_bytes)), problem_file),
    "engine state": (st.tuples(mutated(engine_states())), lambda workdir, doc: engine_state(doc)),
    "Gavel trace": (st.tuples(trace_lines()), trace_file),
    "Sia workload": (st.tuples(csv_text("name,time,application,num_replicas,batch_size",
                                        ["bert-0", "0", "bert", "1", "64"])), sia_workload_file),
    "throughput table": (st.one_of(
        st.tuples(st.just("t.csv"), csv_text("model,scale_factor,gpu_type,throughput", ["m", "1", "v100", "2.0"])),
        st.tuples(st.sampled_from(["t.json", "gavel.json"]), mutated(st.just(
            [{"model": "m", "scale_factor": 1, "gpu_type": "v100", "throughput": 2.0}])).flatmap(as_bytes)),
        st.tuples(st.just("gavel.json"), mutated(st.just(
            {"v100": {"('m', 1)": {"null": 2.0}}, "k80": {"('m', 1)": {"null": 1.0}}})).flatmap(as_bytes))),
        throughput_file),
    "job file": (job_files(), job_file),
    "CLI solve arguments": (st.tuples(st.integers(0, len(CLI_PROBLEMS) - 1), cli_arguments()), cli_solve),
    "CLI commands on malformed files": (cli_bad_files(), cli_bad_file),
}


@pytest.mark.parametrize("name", list(TARGETS))
def test_fuzz_input_boundary(name, tmp_path_factory):
    strategy, target = TARGETS[name]
    workdir = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(strategy)
    def check(arguments: tuple) -> None:
        assert target(workdir, *arguments)

    check()


def test_the_schema_and_the_loaders_agree_on_valid_documents():
    # the generators' unmutated documents are valid: both the schema and the loaders take them
    problem = {"cluster": {"gpus": {"v100": 2}}, "jobs": [{"id": "a", "throughputs": {"v100": 1.0}}]}
    assert problem_document(problem) == "accepted"
    engine = allocopt.Engine({"v100": 2}, round_seconds=60.0)
    engine.add_job("a", throughputs={"v100": 1.0})
    engine.next_round()
    assert engine_state(engine.to_json()) == "accepted"


def new_workdir() -> tempfile.TemporaryDirectory:
    """A temporary directory for a target's files (benchmarks/fuzz_inputs.py)."""
    return tempfile.TemporaryDirectory(prefix="allocopt-fuzz-")
