#!/usr/bin/env python3
"""The device check: what one H100/H200 can tell us in 6 minutes, returned as it goes.

    python3 scripts/hopper_check.py --out OUT [--preset hopper] [--budget-s 360] [--dry-run]

Runs on the lent GPU machine as it is (its Python with a CUDA torch and Triton; no venv, no
network, no Jupyter: ``benchmarks/README.md`` gives the exact command, with the wheels it
brings). Stages, in order of value; each writes into ``OUT`` the moment it ends, so a run cut
short at any point still returns everything finished before:

1. ``env``: the environment stamp (GPU, driver, CUDA, torch, Triton, Python, date);
2. ``smoke`` (``tests/device_smoke.py``, about a minute): every Triton kernel against its
   reference, every natively run FP8 recipe's GEMM against our emulation, two training steps
   under every policy;
3. ``precision``, ``fp8``, ``fusion``: the recorded benchmarks (``benchmarks/*.py``), shortened;
4. ``ladder``: a short ablation ladder (``python -m tutorial_lib bench --ladder``);
5. ``notebooks``: the chapters under nbmake, one at a time and in order, while time is left.

``OUT`` receives at most five flat files, whatever happens (the device returns at most 8 files
of 16 MiB): ``report.json`` and ``report.md`` (rewritten after every stage and notebook),
``smoke.json`` (after every check), ``results.tar.gz`` (every result file written so far, in the
format ``benchmarks/`` commits, this report among them as ``hopper_check__...``) and the log the
command tees. Each stage is a subprocess with a
timeout: its cap (``CAPS``) or what is left of ``--budget-s``, whichever is less; the notebooks
get what the stages before them left. ``--dry-run``: the same stages at the ``ci`` preset on
any machine, shortened to fit ``DRY_BUDGET_S`` (``tests/test_hopper_check.py`` runs it).
Exit status 1 when a stage failed or timed out, or a notebook failed or hung (on a GPU, ran
past ``HANG_FACTOR`` times its estimated time); a notebook cut sooner by the budget is ``cut``,
one not started ``not run``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tutorial_lib without installing it (the device machine)
BUDGET_S = 360.0  # 6 minutes: a start and two tries fit in the device's 15, with a minute spare
DRY_BUDGET_S = 120.0
# Seconds a stage may take at most (device run, dry run). The notebooks take what is left. The
# dry run's caps leave room for a 2-core CPU shared with the rest of the test suite (its stages
# took 3 to 40 s alone, up to twice that next to other tests).
CAPS = {
    "smoke": (90, 60),
    "precision": (40, 30),
    "fp8": (40, 30),
    "fusion": (80, 80),  # it compiles GPT-2 124M with torch.compile (about 40 s, assumed)
    "ladder": (40, 40),
}
HANG_FACTOR = 3.0  # on a GPU, a notebook cut after 3x its estimated time (book_cost) is a failure
MIN_NOTEBOOK_S = 20.0  # do not start a notebook with less time than this left
# The shortened arguments of each stage (device run, dry run).
SHORT = {
    "precision": (["--steps", "5"], ["--steps", "1", "--policies", "fp32,bf16,fp8"]),
    "fp8": (["--iters", "10"], ["--sizes", "128", "--iters", "1"]),
    "fusion": (["--iters", "10", "--steps", "5"], ["--iters", "1", "--steps", "1"]),
    # our Triton kernels for the fused rungs: the compiled ones are the fusion stage's
    "ladder": (["--steps", "20", "--fusion", "triton"], ["--steps", "2", "--rungs", "1,2"]),
}
Runner = Callable[[Sequence[str], dict[str, str], float], "int | None"]


@dataclass
class StageResult:
    name: str
    status: str  # ok | failed | timed out | not run; a notebook: ok | failed | cut | not run
    seconds: float = 0.0
    timeout_s: float | None = None
    detail: str = ""
    files: list[str] = field(default_factory=list)


def stage_argv(name: str, preset: str, results: Path, out: Path, dry: bool) -> list[str]:
    py = sys.executable
    if name == "smoke":
        return [py, "tests/device_smoke.py", "--preset", preset, "--json", str(out / "smoke.json")]
    extra = SHORT[name][1 if dry else 0]
    common = ["--preset", preset, "--out", str(results), *extra]
    if name == "ladder":
        return [py, "-m", "tutorial_lib", "bench", "--ladder", "--no-progress", *common]
    return [py, f"benchmarks/{name}.py", *common]


def child_env(preset: str, results: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Unbuffered output, the preset, the repository importable, and ``TUTORIAL_RESULTS_DIR`` (so
    the notebooks, run last, show the results just recorded)."""
    env = dict(os.environ if base is None else base)
    env.pop("MPLBACKEND", None)  # notebooks keep their inline backend
    path = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        PYTHONUNBUFFERED="1",
        TUTORIAL_PRESET=preset,
        PYTHONPATH=os.pathsep.join(path),
        TUTORIAL_RESULTS_DIR=str(results),
    )
    return env


def run_subprocess(argv: Sequence[str], env: dict[str, str], timeout: float) -> int | None:
    """Run ``argv`` in the repository root, output live; its exit code, or None on a timeout
    (then its whole process group, notebook kernels included, is ended)."""
    proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc)
        return None
    except BaseException:
        _end_group(proc)
        raise


def _end_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


class Check:
    """The run: its clock, its stages' results, and ``OUT``'s files, rewritten as it goes."""

    def __init__(self, out: Path, results: Path, preset: str, budget: float, env: dict[str, Any],
                 runner: Runner = run_subprocess, clock: Callable[[], float] | None = None) -> None:  # fmt: skip
        self.out, self.results, self.preset, self.budget = out, results, preset, budget
        self.env, self.runner, self.clock = env, runner, clock or time.monotonic
        self.start = self.clock()
        self.stages: list[StageResult] = []
        self.notebooks: list[StageResult] = []

    def left(self) -> float:
        return self.budget - (self.clock() - self.start)

    def run(self, name: str, argv: Sequence[str], cap: float) -> StageResult:
        timeout = min(cap, self.left())
        if timeout < 5:
            return StageResult(name, "not run", detail="no time left")
        print(f"[hopper-check] {name}: {' '.join(argv[1:])} (timeout {timeout:.0f} s)", flush=True)
        before, t0 = _snapshot(self.results), self.clock()
        code = self.runner(argv, child_env(self.preset, self.results), timeout)
        seconds = self.clock() - t0
        files = sorted(n for n, s in _snapshot(self.results).items() if before.get(n) != s)
        if code == 0:
            return StageResult(name, "ok", seconds, timeout, files=files)
        if code is None:
            return StageResult(name, "timed out", seconds, timeout, f"after {timeout:.0f} s", files)
        return StageResult(name, "failed", seconds, timeout, f"exit status {code}", files)

    def record(self, result: StageResult, notebook: bool = False) -> None:
        (self.notebooks if notebook else self.stages).append(result)
        print(
            f"[hopper-check] {result.name}: {result.status} {result.detail} ({result.seconds:.0f} s)",
            flush=True,
        )
        self.write()

    def ok(self) -> bool:
        """No stage failed or timed out, and no notebook failed (one cut by the budget, or not
        started for lack of time, is not a failure)."""
        return all(r.status in ("ok", "not run") for r in self.stages) and all(
            r.status in ("ok", "not run", "cut") for r in self.notebooks
        )

    def write(self) -> None:
        """``report.json``, ``report.md`` and ``results.tar.gz`` in ``OUT``, each atomically."""
        report = {
            "check": "hopper_check",
            "preset": self.preset,
            "environment": self.env,
            "budget_s": self.budget,
            "elapsed_s": round(self.clock() - self.start, 1),
            "ok": self.ok(),
            "stages": [asdict(r) for r in self.stages],
            "notebooks": [asdict(r) for r in self.notebooks],
        }
        _atomic_text(self.out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
        _atomic_text(self.out / "report.md", markdown(report))
        # the same, as a result record to commit beside the benchmarks' (results.tar.gz)
        from tutorial_lib.bench import write_results

        smoke = self.out / "smoke.json"
        meta = {k: report[k] for k in ("budget_s", "elapsed_s", "ok")}
        meta["smoke"] = json.loads(smoke.read_text(encoding="utf-8")) if smoke.is_file() else []
        rows = [asdict(r) for r in self.stages + self.notebooks]
        write_results("hopper_check", rows, self.results, meta, environment=self.env)
        files = sorted(p for p in self.results.glob("*__*") if p.is_file())
        tmp = self.out / "results.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for p in files:
                tar.add(p, arcname=p.name)
        os.replace(tmp, self.out / "results.tar.gz")


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    stamp = ", ".join(
        f"{k} {env.get(k) or 'n/a'}"
        for k in ("device", "driver", "cuda", "torch", "triton", "python")
    )
    lines = [
        f"# hopper_check, preset {report['preset']}",
        "",
        f"Run on {env.get('date', '?')}: {stamp}.",
        "",
        f"Budget {report['budget_s']:.0f} s, {report['elapsed_s']:.0f} s so far; "
        + ("every stage so far passed." if report["ok"] else "NOT every stage passed."),
        "",
        "| stage | status | seconds | timeout s | detail | files |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["stages"] + report["notebooks"]:
        timeout = "" if r["timeout_s"] is None else f"{r['timeout_s']:.0f}"
        detail = r["detail"].replace("|", "/").replace("\n", " ")[:200]
        lines.append(
            f"| {r['name']} | {r['status']} | {r['seconds']:.0f} | {timeout} | {detail} | {'<br>'.join(r['files'])} |"
        )
    return "\n".join(lines) + "\n"


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    if not folder.is_dir():
        return {}
    return {
        p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir() if p.is_file()
    }


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def smoke_detail(out: Path) -> str:
    """``N passed, M failed`` and the failed checks' names, from the smoke stage's JSON."""
    path = out / "smoke.json"
    if not path.is_file():
        return "no checks finished"
    rows = json.loads(path.read_text(encoding="utf-8"))
    failed = [f"{r['group']} {r['check']}" for r in rows if not r["ok"]]
    return f"{len(rows) - len(failed)} passed, {len(failed)} failed" + (
        f": {', '.join(failed)}" if failed else ""
    )


def run_notebooks(check: Check, chapters: Sequence[Path], workdir: Path, on_gpu: bool) -> None:
    """Each chapter under nbmake in a staged copy of the book, in order, while time is left. On a
    GPU, one still running after ``HANG_FACTOR`` times its estimated time (``book_cost``) has
    timed out (a hang); one cut sooner by the budget is ``cut``."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from stage_book import stage

    from tutorial_lib.book_cost import estimate_book
    from tutorial_lib.config import get_preset

    estimates = estimate_book(get_preset(check.preset)) if on_gpu else {}

    book = stage(ROOT / "book", workdir / "book")
    for chapter in chapters:
        left = check.left()
        if left < MIN_NOTEBOOK_S:
            check.record(
                StageResult(chapter.stem, "not run", detail=f"no time left ({left:.0f} s)"),
                notebook=True,
            )
            continue
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake",
                f"--nbmake-timeout={int(left)}", str(book / "chapters" / chapter.name)]  # fmt: skip
        result = check.run(chapter.stem, argv, left)
        expected = estimates.get(chapter.name[:2])
        if result.status == "timed out" and (expected is None or left < HANG_FACTOR * expected):
            # its timeout was all the budget left, less than it may need: cut, not failed
            result.status, result.detail = "cut", f"the budget ran out after {result.seconds:.0f} s"
        elif result.status == "timed out":
            result.detail = f"still running after {left:.0f} s, {HANG_FACTOR:.0f}x its estimate of {expected:.0f} s"
        check.record(result, notebook=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the folder whose files come back")
    p.add_argument("--preset", default=None, help="default: hopper (ci with --dry-run)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"default {BUDGET_S:.0f} ({DRY_BUDGET_S:.0f} dry)",
    )
    p.add_argument("--dry-run", action="store_true", help="the ci preset, shortened (any machine)")
    p.add_argument("--stages", default="smoke,precision,fp8,fusion,ladder,notebooks")
    p.add_argument("--chapters", default="", help="comma-separated notebook stems (default: all)")
    args = p.parse_args(argv)
    args.preset = args.preset or ("ci" if args.dry_run else "hopper")
    args.budget_s = args.budget_s or (DRY_BUDGET_S if args.dry_run else BUDGET_S)
    return args


def _stamp(preset: str) -> dict[str, Any]:
    from tutorial_lib.bench import environment_stamp

    return {**environment_stamp(), "preset": preset}


def main(argv: Sequence[str] | None = None, runner: Runner = run_subprocess,
         stamp: Callable[[str], dict[str, Any]] = _stamp) -> int:  # fmt: skip
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="hopper-check-"))
    results = workdir / "results"
    results.mkdir()
    t0 = time.monotonic()
    env = stamp(args.preset)
    check = Check(args.out.resolve(), results, args.preset, args.budget_s, env, runner)
    check.record(
        StageResult("env", "ok", time.monotonic() - t0, detail=env.get("device_summary") or "")
    )
    wanted = args.stages.split(",")
    for name in ("smoke", "precision", "fp8", "fusion", "ladder"):
        if name not in wanted:
            continue
        result = check.run(
            name,
            stage_argv(name, args.preset, results, check.out, args.dry_run),
            CAPS[name][args.dry_run],
        )
        if name == "smoke":
            result.detail = f"{result.detail}; {smoke_detail(check.out)}".strip("; ")
        check.record(result)
    if "notebooks" in wanted:
        names = [c for c in args.chapters.split(",") if c]
        chapters = sorted((ROOT / "book" / "chapters").glob("*.ipynb"))
        on_gpu = env.get("device_type") == "cuda"
        run_notebooks(check, [c for c in chapters if not names or c.stem in names], workdir, on_gpu)
    check.write()
    print((check.out / "report.md").read_text(encoding="utf-8"), flush=True)
    return 0 if check.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
