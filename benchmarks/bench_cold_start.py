"""Cold start: the time a fresh process takes to import allocopt and solve a first problem, against the
interpreter's own start (``python -c pass``) measured in the same run.

Targets: ``import allocopt`` plus a first ``solve`` of the README's example at most 0.15 s beyond the
interpreter's start; ``allocopt solve examples/problem.json`` at most 0.6 s wall. Each command runs
``--repeat`` times, interleaved, and the medians are compared; CPU seconds (user + system of the child)
are reported beside wall seconds, as they move less with the machine's load. Where a command misses its
target, ``-X importtime`` of it lists the modules that cost most.

The children run as an installed package does: with its bytecode cached (``PYTHONDONTWRITEBYTECODE`` is
removed from their environment and one untimed run of each command writes the cache first), since a
process that compiles allocopt's sources on every start spends some 0.04 s doing so.

    python benchmarks/bench_cold_start.py [--repeat 15] [--results FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from allocopt.bench.machine import machine_info
from allocopt.bench.output import Column, add_results_option, results_table, write_results

HERE = Path(__file__).resolve().parent.parent
README_EXAMPLE = """
import allocopt
cluster = allocopt.Cluster({"v100": 1, "k80": 1})
problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], cluster, job_ids=["resnet", "lstm", "a3c"])
alloc = allocopt.solve(problem, "max_min_fairness")
assert abs(alloc.objective - 8 / 11) < 1e-9
"""
COMMANDS = {
    "interpreter (python -c pass)": [sys.executable, "-c", "pass"],
    "import allocopt + first solve": [sys.executable, "-c", README_EXAMPLE],
    "allocopt solve examples/problem.json": [sys.executable, "-m", "allocopt", "solve", "examples/problem.json"],
}
TARGETS = {"import allocopt + first solve": ("beyond the interpreter", 0.15),
           "allocopt solve examples/problem.json": ("wall", 0.6)}


CHILD_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run of ``argv``."""
    before = os.times()
    started = time.perf_counter()
    subprocess.run(argv, check=True, cwd=HERE, stdout=subprocess.DEVNULL, env=CHILD_ENV)
    wall = time.perf_counter() - started
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15, help="runs of each command (default 15)")
    add_results_option(parser, "bench_cold_start", Path(__file__).parent / "results", ("--results", "--json"))
    args = parser.parse_args()
    machine = machine_info()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for argv in COMMANDS.values():  # untimed: writes the bytecode cache an installed package has
        run_once(argv)
    for _ in range(args.repeat):  # interleaved, so that a change of load hits every command alike
        for name, argv in COMMANDS.items():
            runs[name].append(run_once(argv))
    base_wall = statistics.median(w for w, _ in runs["interpreter (python -c pass)"])
    rows = []
    print(f"{'command':40s} {'wall s':>8s} {'cpu s':>8s} {'wall - interpreter':>19s}  target")
    for name, samples in runs.items():
        wall = statistics.median(w for w, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        target = TARGETS.get(name)
        measured = wall - base_wall if target and target[0] == "beyond the interpreter" else wall
        verdict = "" if target is None else (f"{target[0]} <= {target[1]} s: "
                                             f"{'met' if measured <= target[1] else 'missed'}")
        print(f"{name:40s} {wall:8.3f} {cpu:8.3f} {wall - base_wall:19.3f}  {verdict}")
        rows.append({"command": name, "wall_s": wall, "cpu_s": cpu, "beyond_interpreter_s": wall - base_wall,
                     "target": None if target is None else {"measure": target[0], "seconds": target[1],
                                                            "met": measured <= target[1]}})
    if args.results:
        for row in rows:
            row["target_text"] = ("" if row["target"] is None else
                                  f"{row['target']['measure']} <= {row['target']['seconds']:g} s: "
                                  f"{'met' if row['target']['met'] else 'missed'}")
        write_results(args.results, "bench_cold_start", machine=machine, data={"repeat": args.repeat, "rows": rows},
                      tables=[results_table(f"A fresh process, medians of {args.repeat} interleaved runs", rows,
                                            [Column("command", "command", left=True), Column("wall_s", "wall s", ".3f"),
                                             Column("cpu_s", "CPU s", ".3f"),
                                             Column("beyond_interpreter_s", "wall - interpreter s", ".3f"),
                                             Column("target_text", "target", left=True)])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
