"""Fuzz and load the HTTP service (``allocopt serve``) on loopback; print the counts by outcome.

Two parts, both against a real ``allocopt serve`` subprocess (or ``--url`` of a
running one, loopback only):

- **fuzz**: Hypothesis draws request bodies for every endpoint (valid documents
  with one part replaced, removed or added; random JSON; deep nesting, huge
  integers and numbers, NaN and Infinity; broken bytes) and odd methods and
  paths. Every answer must be JSON (errors ``{"error", "type", "field"}``) with a
  status below 500, and the server must log no traceback.
- **load**: ``--idle`` connections opened and left idle while ``--clients``
  threads, each on its own keep-alive connection, send mixed requests (solve,
  add and remove jobs, allocation, rounds); counts resets and errors, checks the
  idle connections are still open and how many threads the server has.

    python benchmarks/http_load.py                         # 10,000 fuzz cases, 64 clients, 500 idle
    python benchmarks/http_load.py --fuzz-cases 500 --requests 5

``tests/test_server.py`` runs both with a short budget.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import ipaddress
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from allocopt.bench.machine import machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)

CLUSTER = {"v100": 4, "k80": 4}
JOBS = [{"id": "a", "throughputs": {"v100": 4.0, "k80": 1.0}}, {"id": 7, "throughputs": {"v100": 2.0, "k80": 1.5}}]
KEYS = ["id", "throughputs", "scale_factor", "priority_weight", "num_steps_remaining", "time_since_start_s", "slo_s",
        "time_isolated_s", "entity", "cluster", "gpus", "gpus_per_node", "jobs", "costs", "entity_weights", "pairs",
        "policy", "backend", "options", "count", "gpu_type", "steps_per_s", "round_seconds", "job_id", "outcome",
        "steps", "run_seconds", "measured_steps_per_s", "restarted", "message", "format", "format_version",
        "version", "rounds", "measured", "policy_options", "solve_options", "throughput_smoothing", "v100", "k80",
        "threads", "time_limit_s", "mip_gap", "best_effort", "partitions", "heterogeneity_aware", "space_sharing"]
POLICIES = ["max_min_fairness", "max_throughput", "min_makespan", "finish_time_fairness", "water_filling", "isolated",
            "proportional", "fifo", "gandiva", "allox", "sia"]
OPTIONS = ["heterogeneity_aware", "space_sharing", "aggregate_job_types", "column_generation", "price_decomposition",
           "normalize_by_cost", "reference_gpu_type", "method", "entity_policies", "seed", "packing_threshold", "alpha",
           "p", "lambda_n", "lambda_a", "relaxation_first", "time_limit_s", "mip_gap", "threads", "best_effort",
           "partitions", "verbose", "solver_options"]
ODD_NUMBERS = [0, -1, 1, 2**31, 2**63, 33_554_432, 10**15, 10**16, 1e300, 1e308, -1e308, 1e-300, 5e-324, 0.5, -0.0]
ODD_STRINGS = ["", "v100", "k80", "tpu", "a", "7", "max_min_fairness", "max_throughput", "sia", "water_filling",
               "finish_time_fairness", "min_makespan", "proportional", "highs", "scipy", "auto", "completed",
               "preempted", "failed", "allocopt-engine", "\u0000", "\ud7ff" * 3, "x" * 300]


def _leaves() -> st.SearchStrategy:
    return st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                     st.sampled_from(ODD_NUMBERS), st.sampled_from(ODD_STRINGS))


JSON = st.recursive(_leaves(), lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4)),
    max_leaves=16)


def templates(state: dict[str, Any] | None = None) -> dict[tuple[str, str], Any]:
    """A valid body for each (method, path template) of the service."""
    problem = {"cluster": {"gpus": dict(CLUSTER), "gpus_per_node": 4}, "jobs": [dict(j) for j in JOBS],
               "costs": {"v100": 3.0, "k80": 1.0}}
    result = {"job_id": "a", "outcome": "preempted", "steps": 10, "run_seconds": 60.0, "measured_steps_per_s": 3.5}
    bodies = {
        ("POST", "/solve"): {**problem, "policy": "max_min_fairness", "backend": "highs", "options": {"threads": 1}},
        ("POST", "/engine"): {"cluster": {"gpus": dict(CLUSTER)}, "policy": "max_min_fairness",
                              "solve_options": {"threads": 1}},
        ("POST", "/engine/jobs"): {"id": "n", "throughputs": {"v100": 3.0, "k80": 1.0}, "scale_factor": 1,
                                   "num_steps_remaining": 1000.0},
        ("PATCH", "/engine/jobs/{job}"): {"priority_weight": 2.0, "throughputs": {"k80": 0.5}},
        ("POST", "/engine/jobs/{job}/throughput"): {"gpu_type": "v100", "steps_per_s": 3.0},
        ("PUT", "/engine/capacity/{gpu_type}"): {"count": 4, "gpus_per_node": 4},
        ("POST", "/engine/rounds/next"): {"round_seconds": 60.0},
        ("POST", "/engine/rounds/{index}/results"): [result],
    }
    if state is not None:
        bodies[("POST", "/engine#state")] = state
    return bodies


ROUTES = [("GET", "/health"), ("GET", "/openapi.json"), ("GET", "/schemas/{name}"), ("GET", "/engine"),
          ("GET", "/engine/jobs"), ("GET", "/engine/jobs/{job}"), ("DELETE", "/engine/jobs/{job}"),
          ("GET", "/engine/allocation"), ("GET", "/nope")]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "FOO"]
PARAMS = {"job": ["a", "7", "n", "zz", "%2F", "a%20b", "%FF", "..", "x" * 300, "-1", "99999999999999999999999"],
          "gpu_type": ["v100", "k80", "tpu", "%00", "a" * 200], "name": ["problem", "engine_state", "nope"],
          "index": ["0", "1", "2", "-1", "x", "9" * 40]}


@st.composite
def mutated(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with one part replaced by random JSON, removed, or one key added."""
    document = json.loads(json.dumps(document))
    slots: list[tuple[Any, Any]] = [(None, None)]
    stack = [document] if isinstance(document, (dict, list)) else []
    while stack:
        node = stack.pop()
        for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
            slots.append((node, key))
            if isinstance(value, (dict, list)):
                stack.append(value)
    parent, key = draw(st.sampled_from(slots))
    action = draw(st.sampled_from(["replace", "remove", "add"]))
    if parent is None:
        return draw(JSON) if action == "replace" else document
    if action == "replace":
        parent[key] = draw(JSON)
    elif action == "remove":
        del parent[key]
    elif isinstance(parent, dict):
        parent[draw(st.sampled_from(KEYS) | st.text(max_size=6))] = draw(JSON)
    else:
        parent.append(draw(JSON))
    return document


@st.composite
def bodies(draw: st.DrawFn, document: Any) -> bytes:
    """Bytes of a request body: a mutated valid document, random JSON, or broken and oversized text."""
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "json", "deep", "digits", "bytes", "truncated",
                                 "empty"]))
    if kind == "mutated":
        return json.dumps(draw(mutated(document))).encode()
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "deep":
        depth = draw(st.integers(1, 20_000))
        return ('{"jobs": ' * depth + "1" + "}" * depth).encode() if draw(st.booleans()) else b"[" * depth + b"]" * depth
    if kind == "digits":
        digits = "9" * draw(st.integers(15, 6000))
        where = draw(st.sampled_from(["count", "steps", "round_seconds", "id"]))
        return f'{{"{where}": {digits}, "id": "d", "throughputs": {{"v100": {digits}}}}}'.encode()
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "truncated":
        text = json.dumps(document).encode()
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    return b""


@st.composite
def cases(draw: st.DrawFn, bodies_by_route: dict[tuple[str, str], Any]) -> tuple[str, str, bytes | None]:
    """One request: method, path (parameters filled, percent-encoded), body."""
    if draw(st.integers(0, 9)) == 0:
        method, template = draw(st.sampled_from(ROUTES))
        method = draw(st.sampled_from([method, *METHODS]))
        body = draw(st.none() | bodies(None))
    else:
        (method, template), document = draw(st.sampled_from(sorted(bodies_by_route.items(), key=repr)))
        body = draw(bodies(document))
        if template in ("/solve", "/engine") and draw(st.booleans()):  # policies with drawn options
            options = draw(st.dictionaries(st.sampled_from(OPTIONS), _leaves() | JSON, max_size=3))
            key = "options" if template == "/solve" else draw(st.sampled_from(["policy_options", "solve_options"]))
            body = json.dumps({**document, "policy": draw(st.sampled_from(POLICIES)), key: options}).encode()
    path = template.split("#")[0]
    for name, values in PARAMS.items():
        if "{" + name + "}" in path:
            value = draw(st.sampled_from(values) | st.text(min_size=1, max_size=8).map(lambda t: quote(t, safe="")))
            path = path.replace("{" + name + "}", value)
    return method, path, body


# ----- talking to the server -----------------------------------------------------------------------------------
def loopback_url(url: str) -> tuple[str, int]:
    """Host and port of ``url``; refuses anything but a loopback address."""
    parts = urlsplit(url)
    if not parts.hostname or not ipaddress.ip_address(parts.hostname).is_loopback:
        raise SystemExit(f"http_load only talks to loopback addresses (127.0.0.1, ::1), not {url}")
    return parts.hostname, parts.port or 80


class Client:
    """One keep-alive HTTP/1.1 connection (reopened when the server closes it)."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 120.0):
        self.host, self.port = loopback_url(url)
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout_s = timeout_s
        self.connection: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, dict[str, str]]:
        for attempt in (0, 1):
            if self.connection is None:
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self.connection.request(method, path, body=body, headers=self.headers)
                response = self.connection.getresponse()
                data = response.read()
                if response.will_close:
                    self.close()
                return response.status, data, {k.lower(): v for k, v in response.getheaders()}
            except (http.client.RemoteDisconnected, BrokenPipeError) as err:
                self.close()  # the server closed an idle keep-alive connection: retry once on a new one
                if attempt:
                    raise err
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, document: Any = None) -> tuple[int, Any]:
        status, data, _ = self.request(method, path, None if document is None else json.dumps(document).encode())
        return status, json.loads(data) if data else None

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def classify(method: str, path: str, status: int, data: bytes, headers: dict[str, str]) -> str:
    """The outcome of one answer: ``"<status>"`` when well-formed, else what is wrong with it."""
    if b"Traceback" in data:
        return "traceback"
    if status >= 500 and status != 503:
        return f"{status} (server error)"
    if method == "HEAD" or status == 204 or (path == "/docs" and status == 200):
        return str(status)
    if "application/json" not in headers.get("content-type", ""):
        return f"{status} not JSON"
    try:
        document = json.loads(data)
    except ValueError:
        return f"{status} invalid JSON"
    if status >= 400 and not (isinstance(document, dict) and set(document) == {"error", "type", "field"}):
        return f"{status} malformed error"
    return str(status)


def fuzz(url: str, num_cases: int, *, token: str | None = None, time_budget_s: float = float("inf"),
         seed: int | None = None) -> collections.Counter:
    """Send ``num_cases`` Hypothesis-drawn requests; the counts by outcome (``classify``)."""
    client = Client(url, token)
    counts: collections.Counter = collections.Counter()
    reset = {"cluster": {"gpus": dict(CLUSTER)}, "solve_options": {"threads": 1}}

    def fresh_engine() -> None:
        assert client.json("POST", "/engine", reset)[0] == 201
        for job in JOBS:
            client.json("POST", "/engine/jobs", job)

    fresh_engine()
    state = client.json("GET", "/engine")[1]
    start = time.monotonic()

    @settings(max_examples=num_cases, deadline=None, database=None, derandomize=seed is not None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(case=cases(templates(state)))
    def run(case: tuple[str, str, bytes | None]) -> None:
        if time.monotonic() - start > time_budget_s:
            counts["skipped (time budget)"] += 1
            return
        if sum(counts.values()) % 200 == 199:
            fresh_engine()  # keep the engine small: fuzzed jobs pile up
        method, path, body = case
        try:
            status, data, headers = client.request(method, path, body)
            counts[classify(method, path, status, data, headers)] += 1
        except (ConnectionError, http.client.HTTPException, OSError) as err:
            client.close()
            counts[f"connection error ({type(err).__name__})"] += 1

    run()
    client.close()
    return counts


def load(url: str, clients: int, idle: int, requests_per_client: int, *, token: str | None = None,
         pid: int | None = None) -> collections.Counter:
    """``idle`` idle connections held open while ``clients`` threads send mixed requests; counts by outcome.

    Also counts ``idle closed`` (idle connections the server closed during the run) and, given the server's
    ``pid``, records ``server threads before`` / ``server threads after``.
    """
    host, port = loopback_url(url)
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()
    if pid is not None:
        counts["server threads before"] = _threads(pid)
    status, out = Client(url, token).json("POST", "/engine", {"cluster": {"gpus": dict(CLUSTER)}})
    if status != 201:
        raise RuntimeError(f"cannot reset the engine: {status} {out}")
    sockets = [socket.create_connection((host, port), timeout=30) for _ in range(idle)]
    small = {"cluster": {"gpus": {"v100": 2, "k80": 2}}, "options": {"threads": 1},
             "jobs": [{"id": k, "throughputs": {"v100": 1.0 + k, "k80": 0.5 + k / 2}} for k in range(6)]}

    def client_run(k: int) -> None:
        client = Client(url, token)
        local: collections.Counter = collections.Counter()
        for r in range(requests_per_client):
            job = f"load-{k}-{r}"
            steps = [("POST", "/engine/jobs", {"id": job, "throughputs": {"v100": 2.0}}),
                     ("GET", "/engine/allocation", None), ("DELETE", f"/engine/jobs/{job}", None),
                     ("GET", "/health", None), ("POST", "/engine/rounds/next", {})]
            if (k + r) % 3 == 0:
                steps.insert(0, ("POST", "/solve", small))
            for method, path, document in steps:
                try:
                    status, data, headers = client.request(method, path, None if document is None
                                                           else json.dumps(document).encode())
                    local[classify(method, path, status, data, headers)] += 1
                except ConnectionResetError:
                    local["connection reset"] += 1
                    client.close()
                except (ConnectionError, http.client.HTTPException, OSError) as err:
                    local[f"connection error ({type(err).__name__})"] += 1
                    client.close()
        client.close()
        with lock:
            counts.update(local)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client_run, range(clients)))
    counts["idle closed"] = sum(_closed(s) for s in sockets)
    if pid is not None:
        counts["server threads after"] = _threads(pid)
    for s in sockets:
        s.close()
    return counts


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted`` (children inherit it); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        soft = min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


class ServerProcess:
    """``allocopt serve --port 0 --quiet ARGS`` on 127.0.0.1 as a subprocess; its stderr is collected."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "allocopt", "serve", "--host", "127.0.0.1",
                                         "--port", "0", "--quiet", *args], stderr=subprocess.PIPE, text=True)
        line = self.process.stderr.readline()
        if "serving on http://" not in line:
            raise RuntimeError(f"allocopt serve did not start: {line}{self.process.stderr.read()}")
        self.url = line.split("serving on ")[1].strip()
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True)
        self._reader.start()

    def stop(self) -> str:
        """Stop the server; everything it wrote to stderr."""
        self.process.terminate()
        self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        return "".join(self.stderr)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.stop()


def _print(title: str, counts: collections.Counter, seconds: float) -> None:
    print(f"{title} ({seconds:.1f} s)")
    for outcome, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {count:>8}  {outcome}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server on loopback (default: start allocopt serve)")
    parser.add_argument("--token-file", help="bearer token file of --url's server")
    parser.add_argument("--fuzz-cases", type=int, default=10_000)
    parser.add_argument("--time-budget", type=float, default=900.0, help="seconds of fuzzing at most")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--requests", type=int, default=20, help="rounds of mixed requests per client")
    parser.add_argument("--seed", type=int)
    add_results_option(parser, "http_load", Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    machine = machine_info()
    phases = {}
    raise_fd_limit(4 * (args.idle + args.clients) + 256)
    token = open(args.token_file).read().strip() if args.token_file else None
    server = None if args.url else ServerProcess("--cluster", json.dumps(CLUSTER), "--max-jobs", "500",
                                                 "--header-timeout", "600", "--keep-alive", "600")
    url = args.url or server.url
    try:
        start = time.monotonic()
        counts = fuzz(url, args.fuzz_cases, token=token, time_budget_s=args.time_budget, seed=args.seed)
        _print(f"fuzz: {sum(counts.values())} requests", counts, time.monotonic() - start)
        phases[f"fuzz: {sum(counts.values())} requests"] = counts
        start = time.monotonic()
        counts = load(url, args.clients, args.idle, args.requests, token=token,
                      pid=None if server is None else server.process.pid)
        _print(f"load: {args.clients} clients x {args.requests} rounds, {args.idle} idle connections", counts,
               time.monotonic() - start)
        phases[f"load: {args.clients} clients x {args.requests} rounds, {args.idle} idle connections"] = counts
    finally:
        if server is not None:
            log = server.stop()
            print(f"server stderr: {log.count('Traceback')} tracebacks, {len(log.splitlines())} lines")
    if args.results:
        rows = [{"phase": phase, "outcome": outcome, "count": count} for phase, counts in phases.items()
                for outcome, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        write_results(args.results, "http_load", machine=machine, data={"rows": rows},
                      tables=[results_table("Requests by outcome", rows,
                                            [Column("phase", "phase", left=True), Column("outcome", "outcome", left=True),
                                             Column("count", "requests", ",")])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
