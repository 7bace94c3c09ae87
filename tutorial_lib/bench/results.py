"""Recorded benchmark results: one format for every benchmark, stamped with its environment.

A result is ``{out_dir}/{name}__{device_slug}__{YYYY-MM-DD}.json`` holding
``{"benchmark": name, "environment": environment_stamp(), "meta": ..., "rows": [...]}``, with a
Markdown table of the rows next to it (same name, ``.md``). Chapters that cannot show an
effect on the reader's hardware plot a recorded Hopper result instead, labelled with
``results_label`` so that nobody mistakes it for a measurement made in front of them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..config import get_preset
from ..hardware import default_device, describe_device

__all__ = [
    "default_results_dir",
    "environment_stamp",
    "write_results",
    "write_and_print",
    "load_results",
    "latest_hopper_results",
    "results_label",
    "markdown_table",
]

RESULTS_ENV = "TUTORIAL_RESULTS_DIR"


def default_results_dir() -> Path:
    """Where recorded results live: ``$TUTORIAL_RESULTS_DIR``, else the repository's
    ``benchmarks/results`` (found from this file, so a notebook running in ``book/chapters``
    finds it too), else ``benchmarks/results`` under the working directory (a non-editable
    install, away from the repository)."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    repo = Path(__file__).resolve().parents[2]
    if (repo / "benchmarks").is_dir() and (repo / "tutorial_lib").is_dir():
        return repo / "benchmarks" / "results"
    return Path("benchmarks") / "results"


DEFAULT_DIR = default_results_dir()


def _driver_version() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi``, or None without one (or on any failure)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0] if lines else None


def _triton_version() -> str | None:
    try:
        import triton
    except Exception:  # ImportError, or a broken install failing at import time
        return None
    return str(getattr(triton, "__version__", None) or "unknown")


def _preset_name() -> str | None:
    try:
        return get_preset().name
    except ValueError:  # a bad TUTORIAL_PRESET; the stamp should not hide the run
        return None


def environment_stamp(device: torch.device | str | None = None) -> dict[str, Any]:
    """Everything needed to say where a number came from: date, device, software versions."""
    device = default_device(device)
    info = describe_device(device)
    cc = info.compute_capability
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": info.name,
        "device_type": info.type,
        "device_summary": info.summary(),
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": _driver_version(),
        "triton": _triton_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "preset": _preset_name(),
    }


def _slug(text: str, max_len: int = 48) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:max_len].rstrip("-") or "unknown"


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of ``rows``: columns are the union of keys in first-seen order.

    A key a row lacks is an empty cell; ``None`` is ``n/a``; floats have 4 significant digits.
    """
    columns = list(dict.fromkeys(key for row in rows for key in row))
    if not columns:
        return "(no rows)"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [_cell(row[c]) if c in row else "" for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(
    name: str,
    rows: list[dict[str, Any]],
    out_dir: str | Path = DEFAULT_DIR,
    meta: dict[str, Any] | None = None,
    *,
    environment: dict[str, Any] | None = None,
) -> Path:
    """Write ``rows`` as JSON (and a ``.md`` table next to it); returns the JSON's path.

    ``environment`` defaults to ``environment_stamp()`` of the default device. The file name
    holds the device, the preset and the date: a rerun on the same device, preset and day
    replaces that day's file, and a ``ci`` run never replaces a ``hopper`` one.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or "__" in name:
        raise ValueError(f"Benchmark name {name!r}: use letters, digits, '.', '-', single '_'.")
    env = environment if environment is not None else environment_stamp()
    record = {"benchmark": name, "environment": env, "meta": meta, "rows": rows}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    preset = _slug(str(env.get("preset") or "nopreset"))
    path = out / f"{name}__{_slug(env['device'])}__{preset}__{env['date'][:10]}.json"
    _atomic_write(path, json.dumps(record, indent=2, default=str) + "\n")
    summary = env.get("device_summary") or env["device"]
    md = f"# {name}\n\n{results_label(record)}\n\n{summary}\n\n{markdown_table(rows)}\n"
    _atomic_write(path.with_suffix(".md"), md)
    return path


def write_and_print(
    name: str,
    title: str,
    rows: list[dict[str, Any]],
    out_dir: str | Path,
    meta: dict[str, Any] | None,
    environment: dict[str, Any],
) -> Path:
    """``write_results`` and print what a benchmark's command line shows: the title with where
    and when it was measured, the device, the table, and the files written."""
    path = write_results(name, rows, out_dir, meta, environment=environment)
    print(f"{title}: {results_label({'environment': environment})}")
    print(environment.get("device_summary") or environment["device"])
    print(markdown_table(rows))
    print(f"wrote {path} and {path.with_suffix('.md').name}")
    return path


def load_results(
    name: str, out_dir: str | Path = DEFAULT_DIR, device_contains: str | None = None
) -> list[dict[str, Any]]:
    """Every recorded result of benchmark ``name``, newest first.

    ``device_contains`` keeps only results whose device name contains it (case-insensitive).
    A missing folder gives an empty list; a file that is not valid JSON raises.
    """
    records = []
    for path in sorted(Path(out_dir).glob(f"{name}__*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("benchmark") != name:
            continue
        device = str(record.get("environment", {}).get("device", ""))
        if device_contains is None or device_contains.lower() in device.lower():
            records.append(record)
    return sorted(records, key=lambda r: r["environment"]["date"], reverse=True)


def latest_hopper_results(name: str, out_dir: str | Path = DEFAULT_DIR) -> dict[str, Any] | None:
    """The newest result of ``name`` measured on an H100 or H200 at the ``hopper`` preset, or
    None if there is none.

    A chapter that gets None must say so plainly rather than show something else in its place.
    """
    hopper = [
        r
        for r in load_results(name, out_dir)
        if any(h in r["environment"]["device"].upper() for h in ("H100", "H200"))
        and r["environment"].get("preset") == "hopper"
    ]
    return hopper[0] if hopper else None


def results_label(record: dict[str, Any]) -> str:
    """``"measured on NVIDIA H200 on 2025-06-01 (torch 2.7.0, CUDA 12.8)"`` for a figure."""
    env = record["environment"]
    cuda = env.get("cuda") or "none"
    preset = env.get("preset") or "?"
    return (
        f"measured on {env['device']} on {env['date'][:10]}, preset {preset} "
        f"(torch {env['torch']}, CUDA {cuda})"
    )
