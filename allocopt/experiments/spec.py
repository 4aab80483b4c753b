"""A sweep's specification: policies x workloads x clusters x seeds x settings, read from YAML or TOML.

A spec is a plain document (YAML, TOML, or a mapping) with these fields;
every one is also a flag of ``allocopt sweep`` (``--seeds 0,1,2``), which
overrides the file's value::

    policies:                  # names, or {name, options, label}
      - max_min_fairness
      - {name: max_min_fairness_perf, options: {}, label: mmf-perf}
    workloads:                 # one or more of
      - generate: {num_jobs: 5000, jobs_per_hour: [0.25, 0.5], scale_factor_probs: {1: 1.0}}
      - trace: gavel.trace                 # a Gavel trace
      - {trace: log.json, format: philly}  # a public trace: philly, helios, tiresias, or pai (with task_table)
      - sia: workload.csv                  # a Sia/Pollux workload CSV (profiles: DIR, default shipped)
      - directory: saturn/                 # every file of a directory (*.csv: Sia, else Gavel traces)
    clusters: [{v100: 36, p100: 36, k80: 36}]
    gpus_per_node: 8
    seeds: [0, 1, 2]
    round_seconds: [360]       # a list sweeps it
    recompute_min_seconds: 1920
    mode: mechanism
    window: [4000, 5000]
    backend: highs
    fidelity: gavel            # passed to simulate only when set
    placement: consolidated    # passed to simulate only when set (best_fit, packing, scattered, consolidated)
    admission: load_based      # passed to simulate only when set (accept_all, load_based)
    tenants: tenants.csv       # passed to simulate only when set (a tenants file, or equal)
    capacity_events: events.csv  # passed to simulate only when set (servers joining and leaving)
    restart_overhead_s: 0
    run_unallocated: false
    ftf: true
    throughputs: FILE          # default: Gavel's measurements
    output: results/           # the sweep's directory (relative to the spec file)
    workers: 2
    ray_address: null

Paths are relative to the spec file; ``package:PATH`` is a path inside the
installed allocopt package (``package:data/sia_workloads/saturn``).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from os import PathLike
from pathlib import Path
from typing import Any

from allocopt.errors import InvalidOptionError

#: Workload kinds of a spec's ``workloads`` entries.
WORKLOAD_KINDS = ("generate", "trace", "sia", "directory")


class SweepSpecError(InvalidOptionError):
    """A sweep specification is malformed; ``field`` names the offending field (``workloads[1].generate``)
    and ``source`` the file it came from (None for flags or a mapping)."""

    def __init__(self, message: str, *, field: str, source: str | None = None):
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {message}")
        self.field = field
        self.source = source


@dataclass(frozen=True)
class PolicySpec:
    """One policy of a sweep: an allocopt or Gavel policy name, its options and the label results carry."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload entry; a ``generate`` entry expands to one workload per arrival rate.

    Attributes
    ----------
    kind : {"generate", "trace", "sia", "directory"}
    path : str, optional
        File or directory (absolute) of ``trace``, ``sia`` and ``directory``.
    trace_format : str
        Format of a ``trace``: ``"gavel"`` (the default) or a public trace of
        :data:`allocopt.mechanism.traces.TRACE_FORMATS`, whose jobs run one step per second on every type.
    task_table : str, optional
        PAI's ``pai_task_table`` beside a ``pai`` trace's job table.
    profiles : str, optional
        Sia application profiles (a directory) of Sia workloads; default: the shipped subset.
    num_jobs : int, optional
        Jobs generated (``generate``).
    jobs_per_hour : tuple of float
        Arrival rates, jobs per hour (``generate``).
    scale_factor_probs : mapping of int to float, optional
        GPUs per generated job and their probabilities (default: Gavel's multi-GPU mix).
    label : str
    """

    kind: str
    path: str | None = None
    profiles: str | None = None
    num_jobs: int | None = None
    jobs_per_hour: tuple[float, ...] = ()
    scale_factor_probs: Mapping[int, float] | None = None
    label: str = ""
    trace_format: str = "gavel"
    task_table: str | None = None


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep (see the module docstring for the document it is read from).

    ``round_seconds`` is a tuple: each value is a point of the grid. Times are seconds.
    """

    policies: tuple[PolicySpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    clusters: tuple[Mapping[str, int], ...] = ({"v100": 36, "p100": 36, "k80": 36},)
    gpus_per_node: int | Mapping[str, int] = 8
    seeds: tuple[int, ...] = (0,)
    round_seconds: tuple[float, ...] = (360.0,)
    recompute_min_seconds: float = 1920.0
    mode: str = "mechanism"
    window: tuple[int, int] | None = None
    backend: str = "highs"
    fidelity: str | None = None
    placement: str | None = None
    admission: str | None = None
    tenants: str | None = None
    capacity_events: str | None = None
    restart_overhead_s: float = 0.0
    run_unallocated: bool = False
    ftf: bool = True
    throughputs: str | None = None
    output: str = "sweep-results"
    workers: int = 1
    ray_address: str | None = None


# ----- field parsers: each takes the raw value (from a document or a flag's text) and the field's name -------------
def _fail(name: str, message: str) -> SweepSpecError:
    return SweepSpecError(message, field=name)


def _listify(value: Any, name: str) -> list:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                raise _fail(name, f"not a JSON list: {err}") from None
        else:
            value = [v.strip() for v in text.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        value = [value]
    if not value:
        raise _fail(name, "needs at least one value")
    return list(value)


def _int(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool):
        raise _fail(name, f"expected an integer, got {value!r}")
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        number = None
    if number is None:
        raise _fail(name, f"expected an integer, got {value!r}")
    if minimum is not None and number < minimum:
        raise _fail(name, f"must be >= {minimum}, got {number}")
    return number


def _float(value: Any, name: str, positive: bool = False) -> float:
    if isinstance(value, bool):
        raise _fail(name, f"expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _fail(name, f"expected a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise _fail(name, f"must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return number


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return value.strip().lower() in ("true", "yes", "1", "on")
    raise _fail(name, f"expected true or false, got {value!r}")


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(name, f"expected a non-empty string, got {value!r}")
    return value.strip()


def _mapping(value: Any, name: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise _fail(name, f"not a JSON object: {err}") from None
    if not isinstance(value, Mapping):
        raise _fail(name, f"expected a mapping, got {value!r}")
    return dict(value)


def _cluster(value: Any, name: str) -> dict[str, int]:
    if isinstance(value, str) and not value.strip().startswith("{"):  # v100=36,p100=36
        pairs = [item.partition("=") for item in value.split(",")]
        if not all(sep for _, sep, _ in pairs):
            raise _fail(name, f"expected TYPE=N,... or a mapping, got {value!r}")
        value = {k.strip(): v.strip() for k, _, v in pairs}
    counts = _mapping(value, name)
    if not counts:
        raise _fail(name, "a cluster needs at least one GPU type")
    return {str(k): _int(v, f"{name}.{k}", minimum=0) for k, v in counts.items()}


def _clusters(value: Any, name: str) -> tuple[dict[str, int], ...]:
    if isinstance(value, str):
        value = [part for part in value.split(";") if part.strip()]  # flags: v100=36,k80=4;v100=8
    if isinstance(value, Mapping):
        value = [value]
    return tuple(_cluster(v, f"{name}[{k}]") for k, v in enumerate(_listify(value, name)))


def _gpus_per_node(value: Any, name: str) -> int | dict[str, int]:
    if isinstance(value, (Mapping, str)) and not (isinstance(value, str) and value.strip().isdigit()):
        per_type = _cluster(value, name)
        if any(v < 1 for v in per_type.values()):
            raise _fail(name, f"GPUs per server must be >= 1, got {per_type}")
        return per_type
    return _int(value, name, 1)


def _policy(value: Any, name: str) -> PolicySpec:
    if isinstance(value, str):
        return PolicySpec(_str(value, name), {}, value.strip())
    entry = _mapping(value, name)
    unknown = set(entry) - {"name", "options", "label"}
    if unknown:
        raise _fail(name, f"unknown keys {sorted(unknown)}; a policy has name, options, label")
    if "name" not in entry:
        raise _fail(name, "a policy entry needs a name")
    policy = _str(entry["name"], f"{name}.name")
    options = _mapping(entry.get("options", {}), f"{name}.options")
    return PolicySpec(policy, options, _str(entry.get("label", policy), f"{name}.label"))


def _policies(value: Any, name: str) -> tuple[PolicySpec, ...]:
    policies = tuple(_policy(v, f"{name}[{k}]") for k, v in enumerate(_listify(value, name)))
    labels = [p.label for p in policies]
    if len(set(labels)) != len(labels):
        raise _fail(name, f"labels must differ (give each entry a label): {labels}")
    return policies


def _path(value: Any, name: str, base: Path | None, *, directory: bool = False) -> str:
    text = _str(value, name)
    if text.startswith("package:"):
        path = Path(str(resources.files("allocopt"))) / text.removeprefix("package:")
    else:
        path = Path(text).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
    if not (path.is_dir() if directory else path.is_file()):
        raise _fail(name, f"{'no directory' if directory else 'no file'} {str(path)!r}")
    return str(path.resolve())


def _workload(value: Any, name: str, base: Path | None) -> WorkloadSpec:
    entry = _mapping(value, name)
    kinds = [k for k in WORKLOAD_KINDS if k in entry]
    if len(kinds) != 1:
        raise _fail(name, f"a workload entry needs exactly one of {', '.join(WORKLOAD_KINDS)}, got keys "
                          f"{sorted(entry)}")
    kind = kinds[0]
    allowed = {kind, "profiles", "label"} | ({"format", "task_table"} if kind == "trace" else set())
    unknown = set(entry) - allowed
    if unknown:
        raise _fail(name, f"unknown keys {sorted(unknown)}; a {kind} entry has {', '.join(sorted(allowed))}")
    profiles = _path(entry["profiles"], f"{name}.profiles", base, directory=True) if "profiles" in entry else None
    if kind == "generate":
        gen = _mapping(entry[kind], f"{name}.generate")
        unknown = set(gen) - {"num_jobs", "jobs_per_hour", "scale_factor_probs"}
        if unknown or not {"num_jobs", "jobs_per_hour"} <= set(gen):
            raise _fail(f"{name}.generate", f"needs num_jobs and jobs_per_hour (optional scale_factor_probs), got "
                                            f"keys {sorted(gen)}")
        rates = tuple(_float(r, f"{name}.generate.jobs_per_hour", positive=True)
                      for r in _listify(gen["jobs_per_hour"], f"{name}.generate.jobs_per_hour"))
        probs = None
        if "scale_factor_probs" in gen:
            raw = _mapping(gen["scale_factor_probs"], f"{name}.generate.scale_factor_probs")
            probs = {_int(k, f"{name}.generate.scale_factor_probs", 1):
                     _float(v, f"{name}.generate.scale_factor_probs.{k}") for k, v in raw.items()}
            if not probs or sum(probs.values()) <= 0:
                raise _fail(f"{name}.generate.scale_factor_probs", "needs a positive probability")
        return WorkloadSpec("generate", None, profiles, _int(gen["num_jobs"], f"{name}.generate.num_jobs", 1),
                            rates, probs, _str(entry.get("label", "generated"), f"{name}.label"))
    path = _path(entry[kind], f"{name}.{kind}", base, directory=kind == "directory")
    if kind == "directory" and not any(p.is_file() for p in Path(path).iterdir()):
        raise _fail(f"{name}.directory", f"{path!r} holds no files")
    trace_format, task_table = "gavel", None
    if kind == "trace":
        from allocopt.mechanism.traces import TRACE_FORMATS

        trace_format = _choice(("gavel", *TRACE_FORMATS))(entry.get("format", "gavel"), f"{name}.format")
        if (trace_format == "pai") != ("task_table" in entry):
            raise _fail(name, "a pai trace needs task_table (its pai_task_table), and only a pai trace takes one")
        if "task_table" in entry:
            task_table = _path(entry["task_table"], f"{name}.task_table", base)
    return WorkloadSpec(kind, path, profiles, label=_str(entry.get("label", Path(path).stem), f"{name}.label"),
                        trace_format=trace_format, task_table=task_table)


def _workloads(value: Any, name: str, base: Path | None) -> tuple[WorkloadSpec, ...]:
    if isinstance(value, str):  # a flag: JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise _fail(name, f"not a JSON list of workload entries: {err}") from None
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise _fail(name, f"expected a list of workload entries, got {value!r}")
    return tuple(_workload(v, f"{name}[{k}]", base) for k, v in enumerate(value))


def _window(value: Any, name: str) -> tuple[int, int] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    items = _listify(value, name)
    if len(items) != 2:
        raise _fail(name, f"expected [first, end] job indices, got {value!r}")
    a, b = (_int(v, name, minimum=0) for v in items)
    if a >= b:
        raise _fail(name, f"first ({a}) must be below end ({b})")
    return a, b


def _optional_str(value: Any, name: str) -> str | None:
    return None if value is None else _str(value, name)


def _fidelity(value: Any, name: str) -> str | None:
    from allocopt.mechanism.fidelity import FIDELITY_PROFILES

    return None if value is None else _choice(tuple(FIDELITY_PROFILES))(value, name)


def _plugin(value: Any, name: str, kind: str) -> str | None:
    if value is None:
        return None
    if kind == "placement":
        from allocopt.mechanism.placement_policies import PLACEMENT_POLICIES as known
    else:
        from allocopt.mechanism.admission import ADMISSION_POLICIES as known
    return _choice(tuple(sorted(known)))(value, name)


def _tenants(value: Any, name: str, base: Path | None) -> str | None:
    if value is None:
        return None
    return "equal" if isinstance(value, str) and value.strip() == "equal" else _path(value, name, base)


def _choice(options: Sequence[str]) -> Callable[[Any, str], str]:
    def parse(value: Any, name: str) -> str:
        text = _str(value, name)
        if text not in options:
            raise _fail(name, f"expected one of {list(options)}, got {text!r}")
        return text
    return parse


#: Field name -> (parser(value, name, base_dir), flag help). Every field of SweepSpec has one.
FIELDS: dict[str, tuple[Callable[[Any, str, Path | None], Any], str]] = {
    "policies": (lambda v, n, b: _policies(v, n), "policy names, comma-separated, or JSON entries: "
                 "'[{\"name\": \"fifo\", \"options\": {}, \"label\": \"f\"}]'"),
    "workloads": (_workloads, "workload entries as JSON, e.g. '[{\"trace\": \"a.trace\"}]'"),
    "clusters": (lambda v, n, b: _clusters(v, n), "clusters, ';'-separated, each TYPE=N,..."),
    "gpus_per_node": (lambda v, n, b: _gpus_per_node(v, n), "GPUs per server: N for every type, or TYPE=N,... "
                                                            "(default 8)"),
    "seeds": (lambda v, n, b: tuple(_int(s, n, 0) for s in _listify(v, n)), "seeds, comma-separated"),
    "round_seconds": (lambda v, n, b: tuple(_float(s, n, positive=True) for s in _listify(v, n)),
                      "round lengths in seconds, comma-separated (default 360)"),
    "recompute_min_seconds": (lambda v, n, b: _float(v, n), "minimum seconds between recomputes (default 1920)"),
    "mode": (lambda v, n, b: _choice(("mechanism", "ideal"))(v, n), "mechanism or ideal"),
    "window": (lambda v, n, b: _window(v, n), "A,B: measure jobs A..B-1"),
    "backend": (lambda v, n, b: _str(v, n), "solver backend (default highs)"),
    "fidelity": (lambda v, n, b: _fidelity(v, n), "simulate's fidelity preset (allocopt, gavel, sia)"),
    "placement": (lambda v, n, b: _plugin(v, n, "placement"), "placement plug-in (best_fit, packing, scattered, "
                                                               "consolidated)"),
    "admission": (lambda v, n, b: _plugin(v, n, "admission"), "admission plug-in (accept_all, load_based)"),
    "tenants": (lambda v, n, b: _tenants(v, n, b), "tenants' weights and GPU quotas: a CSV or JSON file, or equal"),
    "capacity_events": (lambda v, n, b: None if v is None else _path(v, n, b),
                        "capacity-events CSV file (time_s,gpu_type,gpus|servers)"),
    "restart_overhead_s": (lambda v, n, b: _float(v, n), "seconds lost per restart"),
    "run_unallocated": (lambda v, n, b: _bool(v, n), "true: jobs arrived since the last recompute may run"),
    "ftf": (lambda v, n, b: _bool(v, n), "finish-time fairness companion run (default true)"),
    "throughputs": (lambda v, n, b: None if v is None else _path(v, n, b), "throughput table file"),
    "output": (lambda v, n, b: _output(v, n, b), "the sweep's output directory"),
    "workers": (lambda v, n, b: _int(v, n, 1), "processes on this machine (default 1)"),
    "ray_address": (lambda v, n, b: _optional_str(v, n), "run each point as a task on this Ray cluster"),
}
assert set(FIELDS) == {f.name for f in fields(SweepSpec)}


def _output(value: Any, name: str, base: Path | None) -> str:
    path = Path(_str(value, name)).expanduser()
    return str((base / path if base is not None and not path.is_absolute() else path).resolve())


def parse_spec(document: Mapping[str, Any], *, base_dir: str | PathLike[str] | None = None,
               source: str | None = None) -> SweepSpec:
    """Validate a spec document (a mapping of :class:`SweepSpec`'s fields) into a :class:`SweepSpec`.

    Parameters
    ----------
    document : mapping
        Field name to value; ``policies`` and ``workloads`` are required.
    base_dir : path, optional
        Directory relative paths are resolved against (default: the working directory).
    source : str, optional
        The file the document came from, named in errors.

    Raises
    ------
    SweepSpecError
        An unknown, missing or malformed field; ``field`` names it.
    """
    if not isinstance(document, Mapping):
        raise SweepSpecError(f"a sweep spec is a mapping of fields, got {type(document).__name__}",
                             field="document", source=source)
    unknown = sorted(set(document) - set(FIELDS))
    if unknown:
        raise SweepSpecError(f"unknown fields {unknown}; known: {sorted(FIELDS)}", field=unknown[0], source=source)
    for required in ("policies", "workloads"):
        if document.get(required) is None:
            raise SweepSpecError("is required", field=required, source=source)
    base = Path(base_dir) if base_dir is not None else None
    values = {}
    try:
        for name, value in document.items():
            values[name] = FIELDS[name][0](value, name, base)
    except SweepSpecError as err:
        if source is None:
            raise
        raise SweepSpecError(str(err).split(": ", 1)[1], field=err.field, source=source) from None
    return SweepSpec(**values)


def read_document(path: str | PathLike[str]) -> dict[str, Any]:
    """The mapping in a YAML (``.yaml``, ``.yml``; needs pyyaml) or TOML (``.toml``) spec file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SweepSpecError(f"cannot read: {err}", field="document", source=str(path)) from None
    if path.suffix.lower() == ".toml":
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise SweepSpecError(f"not TOML: {err}", field="document", source=str(path)) from None
    elif path.suffix.lower() in (".yaml", ".yml"):
        from allocopt.extras import require_extra
        require_extra("yaml", "runtime", "a YAML sweep spec")
        import yaml
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SweepSpecError(f"not YAML: {err}", field="document", source=str(path)) from None
    else:
        raise SweepSpecError("a spec file ends in .yaml, .yml or .toml", field="document", source=str(path))
    if not isinstance(document, Mapping):
        raise SweepSpecError("the file must hold a mapping of fields", field="document", source=str(path))
    return dict(document)


def load_spec(path: str | PathLike[str] | None = None, overrides: Mapping[str, Any] | None = None) -> SweepSpec:
    """A :class:`SweepSpec` from a spec file, with ``overrides`` (field -> value, e.g. from flags) replacing
    the file's values; paths in the file are relative to it, paths in ``overrides`` to the working directory.

    Raises
    ------
    SweepSpecError
    """
    document = read_document(path) if path is not None else {}
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    base = Path(path).resolve().parent if path is not None else None
    file_part = {k: v for k, v in document.items() if k not in overrides}
    missing = [k for k in ("policies", "workloads") if k not in file_part and k not in overrides]
    if missing:
        raise SweepSpecError("is required (in the spec file or as a flag)", field=missing[0],
                             source=str(path) if path else None)
    # the file's fields are validated against its directory, the flags' against the working directory
    dummy = {"policies": "_", "workloads": {"generate": {"num_jobs": 1, "jobs_per_hour": 1}}}
    spec = parse_spec({**dummy, **file_part}, base_dir=base, source=str(path) if path else None)
    flagged = parse_spec({**dummy, **overrides}, base_dir=None)
    return replace(spec, **{k: getattr(flagged, k) for k in overrides})


__all__ = ["FIELDS", "PolicySpec", "SweepSpec", "SweepSpecError", "WORKLOAD_KINDS", "WorkloadSpec", "load_spec",
           "parse_spec", "read_document"]
