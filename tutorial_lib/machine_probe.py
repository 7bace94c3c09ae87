"""What the readiness check looks at: ``gather_machine()`` probes this machine (Python, packages,
GPU, disk, RAM, compiler, the ``TUTORIAL_PRESET`` variable) into a plain ``Machine`` record.

Each probe is a small module-level function that tests replace with ``monkeypatch`` (patch them
here, where ``gather_machine`` looks them up). The pure checks over a ``Machine`` are in
``tutorial_lib.readiness``, which re-exports ``GPU``, ``Machine`` and ``gather_machine``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NOTEBOOK_PACKAGES", "GPU", "Machine", "gather_machine"]

# The notebook stack besides JupyterLab (or the classic notebook), in import names.
NOTEBOOK_PACKAGES = ("ipykernel", "ipywidgets", "matplotlib", "tqdm")
JUPYTER_FRONTENDS = ("jupyterlab", "notebook")
_PROBED = (*JUPYTER_FRONTENDS, *NOTEBOOK_PACKAGES, "triton")


@dataclass(frozen=True)
class GPU:
    name: str
    capability: tuple[int, int]

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass(frozen=True)
class Machine:
    """What the checks look at; ``gather_machine()`` fills it in for this machine."""

    python: tuple[int, int, int]
    platform: str  # sys.platform: "linux", "darwin", "win32"
    torch_version: str | None  # None: torch does not import
    torch_cuda: str | None  # torch.version.cuda; None for a CPU build
    packages: Mapping[str, str | None] = field(default_factory=dict)  # import name -> version
    gpu: GPU | None = None  # CUDA device 0, if torch sees one
    nvidia_smi: bool = False  # an NVIDIA driver is installed (nvidia-smi on PATH)
    cxx: str | None = None  # the C++ compiler torch.compile would find
    disk_free: int | None = None  # bytes free where the check runs
    ram_total: int | None = None  # bytes of physical memory
    preset_env: str | None = None  # $TUTORIAL_PRESET, if set and not empty
    te: tuple[bool, str] = (False, "not checked")  # hardware.te_available()
    cwd: str = "."


# ---- probes (each replaced in tests) --------------------------------------------------------


def _package_version(name: str) -> str | None:
    """The installed version of the importable module ``name``, "?" if unknown, None if absent.

    ``find_spec`` finds the module without importing it (importing JupyterLab takes seconds).
    """
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _torch() -> tuple[str | None, str | None, GPU | None]:
    """(torch version, its CUDA version, CUDA device 0) or Nones when torch does not import."""
    try:
        import torch
    except Exception:  # ImportError, or a broken install's own error
        return None, None, None
    from .hardware import cuda_capability

    found = cuda_capability("cuda:0") if torch.cuda.is_available() else None
    gpu = GPU(*found) if found else None
    return torch.__version__, torch.version.cuda, gpu


def _cxx() -> str | None:
    """The C++ compiler: $CXX if set, else the first of g++, c++, clang++ on PATH."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"]) or None
    for name in ("g++", "c++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _disk_free(path: str | Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _ram_total() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil is a dev dependency; fall back to sysconf
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _te() -> tuple[bool, str]:
    from .hardware import te_available

    return te_available()


def gather_machine(path: str | Path = ".") -> Machine:
    """Probe this machine; ``path`` is where disk space is measured (the working directory)."""
    torch_version, torch_cuda, gpu = _torch()
    preset = os.environ.get("TUTORIAL_PRESET", "").strip().lower() or None
    return Machine(
        python=tuple(sys.version_info[:3]),  # type: ignore[arg-type]
        platform=sys.platform,
        torch_version=torch_version,
        torch_cuda=torch_cuda,
        packages={name: _package_version(name) for name in _PROBED},
        gpu=gpu,
        nvidia_smi=shutil.which("nvidia-smi") is not None,
        cxx=_cxx(),
        disk_free=_disk_free(path),
        ram_total=_ram_total(),
        preset_env=preset,
        te=_te(),
        cwd=str(Path(path).resolve()),
    )
