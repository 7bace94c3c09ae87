#!/usr/bin/env python3
"""Run the whole book on one GPU and record the results (issue 9): ``make hopper-check``.

    python scripts/hopper_check.py [--preset hopper] [--results benchmarks/results]
                                   [--budget-s 480] [--skip-notebooks] [--only STEP]
                                   [--jobs 2] [--bundle results.tar.gz]

Steps, in this order, each a subprocess of this Python with ``TUTORIAL_PRESET`` set (and
``TUTORIAL_RESULTS_DIR`` = DIR, so the notebooks, run last, show the results just recorded):

1. ``precision``, ``fp8`` and ``fusion``: ``benchmarks/<name>.py --preset P --out DIR``;
2. ``ladder``: ``python -m tutorial_lib bench --ladder --preset P --out DIR``;
3. ``notebooks``: every chapter under nbmake (``pytest -n 2 --nbmake book/chapters``; ``--jobs``),
   in place and without ``--overwrite``: the notebooks are checked, not rewritten. Two at once
   share the GPU, so their printed timings are contended; nothing of theirs is recorded.

The recorded results come first: they are what the chapters read (``perf.latest_hopper_results``),
so when time runs short it is the notebook check that is cut, not the measurements. Each step's
timeout is what is left of ``--budget-s`` minus the shares (``RESERVE``) kept for the selected
steps after it, so a step may use what an earlier one left and the part of the budget nobody
reserves; the last step gets all that is left. At the end
``DIR/hopper_check-<preset>.json`` and ``.md`` record the environment stamp
(``perf.environment_stamp``: GPU, driver, CUDA, torch, Triton, Python, date), each step's status,
duration and the files it wrote, and every result row that was skipped with its reason.
``--bundle`` packs those files into one ``.tar.gz`` (one file is easy to copy back from an offline GPU machine).
Exit status 1 when a step failed, timed out or found no budget left.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIN_STEP_S = 30.0  # a step gets at least this long, or what is left if that is less
STEP_NAMES = ("precision", "fp8", "fusion", "ladder", "notebooks")
# The fraction of the budget each step keeps for itself while the steps before it run. Together
# 0.7: the other 0.3 goes to whichever step needs it first, so a benchmark that runs long is
# not killed (losing its results) to keep the notebook check's full share.
RESERVE = {"precision": 0.05, "fp8": 0.05, "fusion": 0.15, "ladder": 0.25, "notebooks": 0.2}

Runner = Callable[[Sequence[str], dict[str, str], float], "int | None"]


@dataclass(frozen=True)
class Step:
    """One subprocess; ``{timeout}`` in ``argv`` becomes its timeout in whole seconds."""

    name: str
    argv: tuple[str, ...]
    reserve: float  # fraction of the budget kept for it (RESERVE)
    env: dict[str, str] = field(default_factory=dict)
    skip: str | None = None  # why it is not run (not selected)


@dataclass
class StepResult:
    name: str
    status: str  # ok | failed | skipped
    seconds: float = 0.0
    reason: str = ""
    timeout_s: float | None = None
    files: list[str] = field(default_factory=list)
    incomplete: bool = False  # skipped for lack of budget: the run did not finish


def plan_steps(
    preset: str,
    results: Path,
    python: str = sys.executable,
    skip_notebooks: bool = False,
    only: str | None = None,
    cpu: bool = False,
    jobs: int = 2,
) -> list[Step]:
    """The five steps for ``preset`` writing into ``results``; unselected ones carry ``skip``."""
    out = ["--preset", preset, "--out", str(results)]
    nb_env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if cpu else {}
    argvs = {
        name: (python, f"benchmarks/{name}.py", *out) for name in ("precision", "fp8", "fusion")
    }
    argvs["ladder"] = (python, "-m", "tutorial_lib", "bench", "--ladder", *out)
    argvs["notebooks"] = (
        python,
        "-m",
        "pytest",
        "-n",
        str(jobs),
        "-p",
        "no:cacheprovider",
        "--nbmake",
        "--nbmake-timeout={timeout}",
        "book/chapters",
    )
    steps = []
    for name in STEP_NAMES:
        skip = None
        if only is not None and name != only:
            skip = f"not selected (--only {only})"
        elif name == "notebooks" and skip_notebooks:
            skip = "--skip-notebooks"
        env = nb_env if name == "notebooks" else {}
        steps.append(Step(name, argvs[name], RESERVE[name], env, skip))
    return steps


def step_timeout(remaining: float, budget: float, later_reserves: Sequence[float]) -> float:
    """Seconds a step may run: what is left minus the later steps' reserves (fractions of the
    budget), but at least ``MIN_STEP_S`` (or all that is left, if less)."""
    reserved = budget * sum(later_reserves)
    return max(min(MIN_STEP_S, remaining), remaining - reserved)


def child_env(
    preset: str, results: Path, extra: dict[str, str], base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of a step: unbuffered output, the preset, the repository importable, and
    ``TUTORIAL_RESULTS_DIR`` (so the notebooks, run last, show the results just recorded)."""
    env = dict(os.environ if base is None else base)
    env.pop("MPLBACKEND", None)  # notebooks keep their inline backend (figures in the output)
    path = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        PYTHONUNBUFFERED="1",
        TUTORIAL_PRESET=preset,
        PYTHONPATH=os.pathsep.join(path),
        TUTORIAL_RESULTS_DIR=str(results),
    )
    env.update(extra)
    return env


def run_subprocess(argv: Sequence[str], env: dict[str, str], timeout: float) -> int | None:
    """Run ``argv`` in the repository root, output live; its exit code, or None on a timeout
    (then its whole process group, notebook kernels included, is ended)."""
    proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return _end_group(proc, None)
    except BaseException:
        _end_group(proc, None)
        raise


def _end_group(proc: subprocess.Popen, code: int | None) -> int | None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    return code


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """``{file name: (mtime_ns, size)}`` of the files in ``folder`` (empty if it is missing)."""
    if not folder.is_dir():
        return {}
    return {
        p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir() if p.is_file()
    }


def changed_files(before: dict, after: dict) -> list[str]:
    return sorted(name for name, sig in after.items() if before.get(name) != sig)


def run_steps(
    steps: Sequence[Step],
    preset: str,
    results: Path,
    budget: float,
    runner: Runner = run_subprocess,
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Run the selected steps in order within ``budget`` seconds; one status line each."""
    start = clock()
    todo = [s for s in steps if s.skip is None]
    out = []
    for step in steps:
        if step.skip is not None:
            out.append(StepResult(step.name, "skipped", reason=step.skip))
        else:
            remaining = budget - (clock() - start)
            later = [s.reserve for s in todo[todo.index(step) + 1 :]]
            out.append(_run_one(step, preset, results, remaining, budget, later, runner, clock))
        r = out[-1]
        print(
            f"[hopper-check] {r.name}: {r.status}"
            + (f" ({r.reason})" if r.reason else "")
            + f", {r.seconds:.0f} s",
            flush=True,
        )
    return out


def _run_one(step, preset, results, remaining, budget, later, runner, clock) -> StepResult:
    if remaining < 1.0:
        return StepResult(step.name, "skipped", reason="no budget left", incomplete=True)
    timeout = step_timeout(remaining, budget, later)
    argv = [a.replace("{timeout}", str(int(timeout))) for a in step.argv]
    print(f"[hopper-check] {step.name}: {' '.join(argv[1:])} (timeout {timeout:.0f} s)", flush=True)
    before, t0 = snapshot(results), clock()
    code = runner(argv, child_env(preset, results, step.env), timeout)
    seconds = clock() - t0
    files = changed_files(before, snapshot(results))
    if code == 0:
        return StepResult(step.name, "ok", seconds, "", timeout, files)
    reason = f"timed out after {timeout:.0f} s" if code is None else f"exit status {code}"
    return StepResult(step.name, "failed", seconds, reason, timeout, files)


def skipped_rows(results: Path, files: Sequence[str]) -> list[str]:
    """``"fp8_train: te-fp8: <reason>"`` for every result row written with a ``skipped`` reason."""
    lines = []
    for name in files:
        if not name.endswith(".json") or "__" not in name:
            continue
        record = json.loads((results / name).read_text(encoding="utf-8"))
        for row in record.get("rows", []):
            if row.get("skipped"):
                what = row.get("policy") or row.get("rung") or row.get("op") or "?"
                extra = f" {row['impl']}" if row.get("impl") else ""
                lines.append(f"{record.get('benchmark')}: {what}{extra}: {row['skipped']}")
    return lines


def write_report(
    results: Path, preset: str, env: dict[str, Any], steps: Sequence[StepResult], budget: float
) -> tuple[Path, Path]:
    """``hopper_check-<preset>.json`` and ``.md`` in ``results``; returns both paths."""
    results.mkdir(parents=True, exist_ok=True)
    files = [f for r in steps for f in r.files]
    record = {
        "check": "hopper_check",
        "preset": preset,
        "environment": env,
        "budget_s": budget,
        "total_s": sum(r.seconds for r in steps),
        "ok": exit_code(steps) == 0,
        "steps": [asdict(r) for r in steps],
        "skipped_rows": skipped_rows(results, files),
    }
    path = results / f"hopper_check-{preset}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    stamp = ", ".join(
        f"{k} {env.get(k) or 'n/a'}"
        for k in ("device", "driver", "cuda", "torch", "triton", "python")
    )
    lines = [
        f"# hopper_check, preset {preset}",
        "",
        f"Run on {env.get('date', '?')}: {stamp}.",
        "",
        env.get("device_summary") or "",
        "",
        f"Budget {budget:.0f} s, used {record['total_s']:.0f} s; "
        f"{'all steps passed' if record['ok'] else 'NOT all steps passed'}.",
        "",
        "| step | status | seconds | timeout s | reason | files |",
        "|---|---|---|---|---|---|",
    ]
    for r in steps:
        timeout = "" if r.timeout_s is None else f"{r.timeout_s:.0f}"
        lines.append(
            f"| {r.name} | {r.status} | {r.seconds:.0f} | {timeout} | {r.reason} | "
            f"{'<br>'.join(r.files)} |"
        )
    if record["skipped_rows"]:
        lines += ["", "Result rows skipped, with the reason:", ""]
        lines += [f"- {line}" for line in record["skipped_rows"]]
    md = path.with_suffix(".md")
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, md


def exit_code(steps: Sequence[StepResult]) -> int:
    return int(any(r.status == "failed" or r.incomplete for r in steps))


def bundle(target: Path, results: Path, names: Sequence[str]) -> Path:
    """Pack ``results/<name>`` for each name into the ``.tar.gz`` ``target`` (flat names, so
    ``tar -xzf target -C benchmarks/results`` puts them in place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as tar:
        for name in dict.fromkeys(names):
            tar.add(results / name, arcname=name)
    return target


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=os.environ.get("TUTORIAL_PRESET") or "hopper")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--budget-s", type=float, default=480.0, help="seconds for all steps together")
    p.add_argument("--skip-notebooks", action="store_true")
    p.add_argument("--jobs", type=int, default=2, help="notebooks run at once (pytest -n)")
    p.add_argument("--only", choices=STEP_NAMES, help="run this step alone (debugging)")
    p.add_argument("--bundle", type=Path, help="also pack every file written into this .tar.gz")
    args = p.parse_args(argv)
    if args.budget_s <= 0 or args.jobs < 1:
        p.error(f"--budget-s and --jobs must be positive, got {args.budget_s}, {args.jobs}")
    return args


def _stamp(preset: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))  # without an installed tutorial_lib (the device machine)
    from tutorial_lib.bench import environment_stamp

    return {**environment_stamp(), "preset": preset}


def main(
    argv: Sequence[str] | None = None,
    runner: Runner = run_subprocess,
    stamp: Callable[[str], dict[str, Any]] = _stamp,
) -> int:
    args = parse_args(argv)
    results = args.results.resolve()
    env = stamp(args.preset)
    print(
        f"[hopper-check] preset {args.preset} on {env.get('device_summary') or env['device']}; "
        f"budget {args.budget_s:.0f} s; results in {results}",
        flush=True,
    )
    cpu = env.get("device_type") != "cuda"
    steps = plan_steps(
        args.preset, results, sys.executable, args.skip_notebooks, args.only, cpu, args.jobs
    )
    done = run_steps(steps, args.preset, results, args.budget_s, runner)
    json_path, md_path = write_report(results, args.preset, env, done, args.budget_s)
    print(md_path.read_text(encoding="utf-8"))
    if args.bundle is not None:
        names = [f for r in done for f in r.files] + [json_path.name, md_path.name]
        print(
            f"[hopper-check] bundled {len(names)} files into {bundle(args.bundle, results, names)}"
        )
    return exit_code(done)


if __name__ == "__main__":
    sys.exit(main())
