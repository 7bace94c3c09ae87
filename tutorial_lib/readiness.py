"""Is this machine ready for the workshop? The checks behind ``python -m tutorial_lib info``.

Two halves, so that the checks can be tested without the machine they describe:

- ``machine_probe.gather_machine()`` probes this machine (Python, packages, GPU, disk, RAM,
  compiler, the ``TUTORIAL_PRESET`` variable) into a plain ``Machine`` record. Each probe is a
  small function there, which tests replace with ``monkeypatch``.
- ``evaluate(machine)`` is pure: it turns a ``Machine`` into one ``Check`` row per requirement
  (status ``ok``, ``missing`` or ``optional``, a detail and, for each problem, the fix) and a
  verdict. ``missing`` blocks the workshop; ``optional`` does not.

``check_readiness()`` does both. See ``book/workshop/setup.md`` for what the rows mean.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .machine_probe import JUPYTER_FRONTENDS, NOTEBOOK_PACKAGES, Machine, gather_machine

__all__ = [
    "OK",
    "MISSING",
    "OPTIONAL",
    "SETUP_FIX",
    "MIN_PYTHON",
    "MIN_TORCH",
    "MIN_DISK_BYTES",
    "MIN_RAM_BYTES",
    "Check",
    "Readiness",
    "evaluate",
    "check_readiness",
    "format_readiness",
]

OK, MISSING, OPTIONAL = "ok", "missing", "optional"
SETUP_FIX = "make setup (or: pip install -e '.[dev,book]')"
MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 6)  # pyproject.toml: torch>=2.6
MIN_DISK_BYTES = 2 * 2**30
MIN_RAM_BYTES = 7 * 2**30  # an "8 GB" laptop reports about 7.6-7.8 GiB in total
_GiB = 2**30


@dataclass(frozen=True)
class Check:
    """One line of the readiness report."""

    name: str
    status: str  # OK, MISSING or OPTIONAL
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Readiness:
    checks: tuple[Check, ...]
    preset: str  # the preset the notebooks will use

    @property
    def ready(self) -> bool:
        return not any(c.status == MISSING for c in self.checks)

    @property
    def problems(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == MISSING)

    @property
    def verdict(self) -> str:
        if self.ready:
            return f"READY for the workshop (preset {self.preset})"
        # One clause per distinct fix, naming the checks it repairs, in report order.
        by_fix: dict[str, list[str]] = {}
        for c in self.problems:
            by_fix.setdefault(c.fix, []).append(c.name)
        return "NOT READY: " + "; ".join(f"{', '.join(n)}: {fix}" for fix, n in by_fix.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "preset": self.preset,
            "verdict": self.verdict,
            "checks": [asdict(c) for c in self.checks],
        }


# ---- the checks (pure) ----------------------------------------------------------------------


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _check_python(m: Machine) -> Check:
    version = ".".join(map(str, m.python))
    if m.python[:2] >= MIN_PYTHON:
        return Check("Python", OK, version)
    return Check(
        "Python",
        MISSING,
        f"{version} is older than {_dotted(MIN_PYTHON)}",
        f"install Python {_dotted(MIN_PYTHON)} or newer (3.11 is what the book is tested with), then make setup",
    )


def _check_torch(m: Machine) -> Check:
    if m.torch_version is None:
        return Check("torch", MISSING, "does not import", SETUP_FIX)
    build = f"CUDA {m.torch_cuda} build" if m.torch_cuda else "CPU build"
    detail = f"{m.torch_version} ({build})"
    if _version_tuple(m.torch_version) < MIN_TORCH:
        return Check("torch", MISSING, f"{detail} is older than {_dotted(MIN_TORCH)}", SETUP_FIX)
    return Check("torch", OK, detail)


def _check_notebook_stack(m: Machine) -> Check:
    frontends = [n for n in JUPYTER_FRONTENDS if m.packages.get(n)]
    missing = [n for n in NOTEBOOK_PACKAGES if not m.packages.get(n)]
    if not frontends:
        missing.insert(0, "jupyterlab (or notebook)")
    if missing:
        return Check("notebook stack", MISSING, f"missing: {', '.join(missing)}", SETUP_FIX)
    shown = [*frontends[:1], *NOTEBOOK_PACKAGES]
    return Check("notebook stack", OK, ", ".join(f"{n} {m.packages[n]}" for n in shown))


def _check_triton(m: Machine) -> Check:
    version = m.packages.get("triton")
    if version is None:
        if m.platform.startswith("linux"):
            return Check(
                "Triton",
                MISSING,
                "not installed (a dependency on Linux; chapter 7's kernels need it)",
                SETUP_FIX,
            )
        return Check(
            "Triton",
            OPTIONAL,
            f"no Triton wheel for {m.platform}: chapter 7's kernel cells fail with an error "
            "saying so; every other cell runs",
            "for chapter 7's kernels, use a Linux machine",
        )
    if m.gpu is not None:
        return Check("Triton", OK, f"{version}: kernels compile for the GPU ({m.gpu.sm})")
    return Check(
        "Triton",
        OK,
        f"{version}: no CUDA GPU, so the kernels run in Triton's interpreter "
        "(TRITON_INTERPRET=1): correct but slow",
    )


def _check_cxx(m: Machine) -> Check:
    if m.cxx:
        return Check("C++ compiler", OK, f"{m.cxx} (torch.compile builds CPU kernels with it)")
    return Check(
        "C++ compiler",
        MISSING,
        "none found (torch.compile needs one on a CPU: chapters 7 and 8)",
        "sudo apt-get install g++ (Debian/Ubuntu) or xcode-select --install (macOS)",
    )


def _check_at_least(
    name: str, have: int | None, need: int, where: str, unread: str, fix: str
) -> Check:
    """A resource check: ``have`` bytes (None if unreadable) against ``need`` bytes."""
    if have is None:
        return Check(name, OPTIONAL, unread)
    detail = f"{have / _GiB:.1f} GiB {where}"
    if have >= need:
        return Check(name, OK, detail)
    return Check(name, MISSING, f"{detail}; need at least {need // _GiB} GiB", fix)


def _check_disk(m: Machine) -> Check:
    return _check_at_least(
        "disk",
        m.disk_free,
        MIN_DISK_BYTES,
        f"free in {m.cwd}",
        f"could not read the free space in {m.cwd}",
        "free up space here (runs write checkpoints, results and torch.compile's cache)",
    )


def _check_ram(m: Machine) -> Check:
    return _check_at_least(
        "RAM",
        m.ram_total,
        MIN_RAM_BYTES,
        "total",
        "could not read the total memory",
        "use a machine with 8 GB or more (chapter 10 starts 7 processes, each importing PyTorch)",
    )


def _auto_preset(m: Machine) -> tuple[str, str]:
    """The preset ``config.detect_preset_name`` picks on this machine, and why."""
    from .config import preset_for_capability

    preset = preset_for_capability(m.gpu.capability if m.gpu else None)
    if m.gpu is None:
        return preset, "no CUDA GPU"
    if preset == "hopper":
        return preset, f"{m.gpu.name} is {m.gpu.sm}"
    return preset, f"{m.gpu.name} is {m.gpu.sm}; hopper is picked on sm_90 only"


def _check_preset(m: Machine) -> tuple[Check, str]:
    from .config import PRESETS

    auto, why = _auto_preset(m)
    if m.preset_env is None:
        return Check("preset", OK, f"{auto} (auto: {why})"), auto
    chosen = m.preset_env
    if chosen not in PRESETS:
        return Check(
            "preset",
            MISSING,
            f"TUTORIAL_PRESET={chosen!r} is not a preset",
            f"unset TUTORIAL_PRESET (auto picks {auto} here) or set it to one of "
            f"{', '.join(PRESETS)}",
        ), auto
    detail = f"{chosen} (from TUTORIAL_PRESET; auto would pick {auto}: {why})"
    if chosen == "hopper" and m.gpu is None:
        return Check(
            "preset",
            MISSING,
            f"{detail}; the hopper sizes take far too long on a CPU",
            "unset TUTORIAL_PRESET (or export TUTORIAL_PRESET=ci)",
        ), chosen
    return Check("preset", OK, detail), chosen


def _check_gpu(m: Machine) -> Check:
    if m.gpu is None:
        if m.nvidia_smi and m.torch_version is not None and m.torch_cuda is None:
            return Check(
                "GPU",
                OPTIONAL,
                "nvidia-smi finds a GPU, but torch is a CPU build: ci preset on the CPU",
                "to use the GPU: install a CUDA torch (conda env create -f environment.yml), "
                "then make setup TORCH=system",
            )
        return Check("GPU", OK, "none: ci preset on CPU (fine for the workshop)")
    g = m.gpu
    if g.capability == (9, 0):
        return Check("GPU", OK, f"{g.name} ({g.sm}): hopper ready (BF16 and FP8 tensor cores)")
    if g.capability >= (8, 9):
        return Check("GPU", OK, f"{g.name} ({g.sm}): runs; BF16 and FP8 tensor cores")
    if g.capability >= (8, 0):
        return Check(
            "GPU",
            OK,
            f"{g.name} ({g.sm}): runs; BF16 tensor cores, no FP8 speed "
            "(FP8 tensor cores need sm_89+, so FP8 is emulated or skipped with the reason)",
        )
    return Check(
        "GPU",
        OK,
        f"{g.name} ({g.sm}): runs; no BF16 tensor cores (sm_80+) and no FP8 (sm_89+): "
        "those cells report what they cannot run",
    )


def _check_book_time() -> Check:
    """The whole book's estimated time on one H200 at the hopper preset (``book_cost``): an
    estimate from FLOP counts until a device run records the notebooks' times."""
    from .book_cost import BOOK_BUDGET_S, estimate_book, format_estimate
    from .config import PRESETS

    hopper = PRESETS["hopper"]
    over = sum(estimate_book(hopper).values()) > BOOK_BUDGET_S
    return Check("book at hopper", OPTIONAL if over else OK, format_estimate(hopper))


def _check_te(m: Machine) -> Check:
    available, reason = m.te
    if available:
        return Check("Transformer Engine", OK, reason)
    if m.gpu is None:
        return Check(
            "Transformer Engine",
            OPTIONAL,
            "not available; it needs a CUDA GPU, and the book's TE cells say why they skip",
        )
    if m.gpu.capability < (8, 9):
        return Check(
            "Transformer Engine",
            OPTIONAL,
            f"not available; its FP8 needs sm_89+, and this GPU is {m.gpu.sm}",
        )
    return Check(
        "Transformer Engine",
        OPTIONAL,
        "not available: the te-fp8 cells (chapters 5, 7 and 8) skip with the reason",
        "optional: see book/te_install.md (NVIDIA's PyTorch container, or pip against your torch)",
    )


def evaluate(machine: Machine) -> Readiness:
    """The readiness report for ``machine``: one ``Check`` per requirement, in a fixed order."""
    preset_check, preset = _check_preset(machine)
    checks = (
        _check_python(machine),
        _check_torch(machine),
        _check_notebook_stack(machine),
        _check_triton(machine),
        _check_cxx(machine),
        _check_disk(machine),
        _check_ram(machine),
        preset_check,
        _check_gpu(machine),
        _check_te(machine),
        _check_book_time(),
    )
    return Readiness(checks=checks, preset=preset)


def check_readiness(path: str | Path = ".") -> Readiness:
    """``evaluate(gather_machine(path))``: is this machine ready for the workshop?"""
    return evaluate(gather_machine(path))


def format_readiness(report: Readiness) -> str:
    """The text ``python -m tutorial_lib info`` prints under "ready?"."""
    lines = ["ready?"]
    for c in report.checks:
        lines.append(f"  {c.status:<9} {c.name}: {c.detail}")
        if c.fix and c.status != OK:
            lines.append(f"  {'':<9} fix: {c.fix}")
    lines.append(report.verdict)
    return "\n".join(lines)
