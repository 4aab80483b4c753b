#!/usr/bin/env python
"""Long fuzzing run of every non-HTTP input boundary; prints the counts by outcome.

Runs the targets of ``tests/test_fuzz_inputs.py`` (problem documents and files, engine state
documents, Gavel traces, Sia workloads, throughput tables, job files, the command line) with
``--examples`` generated inputs each (default 1,200: 10,800 in all) and counts each outcome:
``accepted``, the typed error raised (``DataFileError``, ``InvalidProblemError``, ...), the CLI's
exit status, or ``FAILURE: ...`` for an untyped exception, a traceback, exit status 3, or a
document accepted against its JSON Schema. Exits 1 when any input failed. Nothing is timed.

Usage::

    python benchmarks/fuzz_inputs.py                      # 9 targets x 1,200 inputs
    python benchmarks/fuzz_inputs.py --examples 100 --targets "engine state,job file"
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

from allocopt.bench.machine import machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]


def _load_targets() -> dict:
    spec = importlib.util.spec_from_file_location("test_fuzz_inputs", ROOT / "tests" / "test_fuzz_inputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_target(module, name: str, examples: int, seed: int) -> tuple[collections.Counter, dict[str, str]]:
    """Counts by outcome of ``examples`` inputs of target ``name``, and one input per failure kind."""
    strategy, target = module.TARGETS[name]
    counts: collections.Counter = collections.Counter()
    failures: dict[str, str] = {}
    with module.new_workdir() as tmp:
        workdir = Path(tmp)

        @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def one(arguments: tuple) -> None:
            try:
                counts[target(workdir, *arguments)] += 1
            except BaseException as err:  # noqa: BLE001 - every failure is counted, the run goes on
                if isinstance(err, KeyboardInterrupt):
                    raise
                kind = f"FAILURE: {type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
                counts[kind] += 1
                failures.setdefault(kind, repr(arguments)[:400])

        from hypothesis import seed as hypothesis_seed

        hypothesis_seed(seed)(one)()
    return counts, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1200, help="inputs per target (default: %(default)s)")
    parser.add_argument("--targets", help="comma-separated target names (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generators (default: %(default)s)")
    add_results_option(parser, "fuzz_inputs", Path(__file__).parent / "results")
    args = parser.parse_args()
    machine = machine_info()
    rows = []
    module = _load_targets()
    names = [n.strip() for n in args.targets.split(",")] if args.targets else list(module.TARGETS)
    total: collections.Counter = collections.Counter()
    failed = False
    for name in names:
        started = time.perf_counter()
        counts, failures = run_target(module, name, args.examples, args.seed)
        n = sum(counts.values())
        print(f"\n{name}: {n} inputs in {time.perf_counter() - started:.0f} s")
        for kind, count in counts.most_common():
            print(f"  {count:>6}  {kind}")
            total["failure" if kind.startswith("FAILURE") else "typed error or clean exit 2" if kind not in
                  ("accepted", "exit 0", "exit 1") else "accepted / solved"] += count
        rows += [{"target": name, "outcome": kind, "inputs": count} for kind, count in counts.most_common()]
        for kind, example in failures.items():
            print(f"  example of {kind}:\n    {example}")
        failed |= bool(failures)
    print(f"\nall targets: {sum(total.values())} inputs: " + ", ".join(f"{v} {k}" for k, v in total.most_common()))
    if args.results:
        write_results(args.results, "fuzz_inputs", machine=machine, data={"rows": rows, "total": dict(total)},
                      tables=[results_table(f"Outcomes of {args.examples:,} generated inputs per target "
                                            f"(seed {args.seed})", rows,
                                            [Column("target", "target", left=True),
                                             Column("outcome", "outcome", left=True), Column("inputs", "inputs", ",")])])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
