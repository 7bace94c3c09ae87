"""What hardware are we on, and what can it do on paper?

``describe_device()`` reports the device in front of the reader. ``SPECS`` is a table of peak
dense throughput and memory bandwidth from vendor datasheets; MFU is only ever computed against
an entry of this table, and is *unavailable* (``None``) on a device the table does not know,
such as a CPU. A made-up peak is how "104% MFU on an H100" happens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = [
    "CPUCapabilities",
    "cpu_capabilities",
    "DeviceSpec",
    "DeviceInfo",
    "SPECS",
    "describe_device",
    "lookup_spec",
    "default_device",
    "te_available",
    "fp8_gemm_status",
    "cuda_capability",
]


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet numbers for one accelerator. FLOP/s are *dense* (no 2:4 sparsity)."""

    name: str
    peak_flops: dict[str, float]  # dtype name ("fp32", "tf32", "bf16", "fp16", "fp8") -> FLOP/s
    hbm_bandwidth: float  # bytes/s
    source: str

    def peak(self, dtype: str) -> float | None:
        """Peak FLOP/s for ``dtype``, or None if the device has no such math (e.g. FP8 on A100)."""
        return self.peak_flops.get(dtype)


_TB = 1e12

# NVIDIA H100 Tensor Core GPU datasheet (SXM5 column; sparse figures halved): FP64 TC 67 TF,
# TF32 494.5 TF, BF16/FP16 989.5 TF, FP8 1979 TF; FP32 (non-TC) 67 TF. The H200 datasheet (SXM)
# gives the same compute: only the memory differs.
_HOPPER_SXM_PEAKS = {
    "fp32": 67e12,
    "tf32": 494.5e12,
    "bf16": 989.5e12,
    "fp16": 989.5e12,
    "fp8": 1979e12,
}

# Every number below is dense (non-sparse) and from the vendor's datasheet named in `source`.
SPECS: dict[str, DeviceSpec] = {
    "H100 SXM": DeviceSpec(
        name="H100 SXM",
        peak_flops=_HOPPER_SXM_PEAKS,
        hbm_bandwidth=3.35 * _TB,  # datasheet: 3.35 TB/s HBM3
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense values",
    ),
    "H100 PCIe": DeviceSpec(
        name="H100 PCIe",
        # NVIDIA H100 datasheet, PCIe column (sparse figures halved): TF32 378 TF, BF16 756.5 TF
        # (1,513 sparse), FP8 1513 TF (3,026 sparse), FP32 51 TF.
        peak_flops={
            "fp32": 51e12,
            "tf32": 378e12,
            "bf16": 756.5e12,
            "fp16": 756.5e12,
            "fp8": 1513e12,
        },
        hbm_bandwidth=2.0 * _TB,  # datasheet: 2 TB/s HBM2e
        source="NVIDIA H100 Tensor Core GPU datasheet (PCIe), dense values",
    ),
    "H200": DeviceSpec(
        name="H200",
        peak_flops=_HOPPER_SXM_PEAKS,
        hbm_bandwidth=4.8 * _TB,  # datasheet: 4.8 TB/s HBM3e
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM), dense values",
    ),
    "A100": DeviceSpec(
        name="A100",
        # NVIDIA A100 Tensor Core GPU datasheet (SXM 80 GB): FP32 19.5 TF, TF32 156 TF,
        # BF16/FP16 312 TF (dense); no FP8 tensor cores.
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
        hbm_bandwidth=2.039 * _TB,  # datasheet: 2,039 GB/s (80 GB SXM)
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB), dense values",
    ),
    "B200": DeviceSpec(
        name="B200",
        # NVIDIA HGX B200 / DGX B200 datasheet per GPU (dense = sparse / 2): TF32 1.1 PF,
        # BF16/FP16 2.25 PF, FP8 4.5 PF, FP4 9 PF (18 PF sparse); FP32 75 TF.
        peak_flops={
            "fp32": 75e12,
            "tf32": 1.1e15,
            "bf16": 2.25e15,
            "fp16": 2.25e15,
            "fp8": 4.5e15,
            "fp4": 9e15,
        },
        hbm_bandwidth=8.0 * _TB,  # datasheet: 8 TB/s HBM3e
        source="NVIDIA HGX B200 datasheet (per GPU), dense values",
    ),
}

# Substrings of torch.cuda.get_device_name() -> SPECS key. Order matters: most specific first.
_NAME_PATTERNS: list[tuple[str, str]] = [
    ("H200", "H200"),
    ("H100 PCIe", "H100 PCIe"),
    ("H100", "H100 SXM"),
    ("A100", "A100"),
    ("B200", "B200"),
]


# Variants whose numbers differ from the table's entries (GH200's memory, H100 NVL's clocks and
# memory, A100 40GB's 1.6 TB/s): unknown rather than wrong.
_NOT_IN_TABLE = ("GH200", "H100 NVL", "40GB")


def lookup_spec(device_name: str) -> DeviceSpec | None:
    """The datasheet entry for a device name as CUDA reports it, or None if unknown."""
    if any(v.lower() in device_name.lower() for v in _NOT_IN_TABLE):
        return None
    for pattern, key in _NAME_PATTERNS:
        if pattern.lower() in device_name.lower():
            return SPECS[key]
    return None


# CPU flags (/proc/cpuinfo) that decide how fast matmuls run, in the order they are reported.
_CPU_FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_bf16": "AVX-512 BF16",
    "avx512_fp16": "AVX-512 FP16",
    "amx_tile": "AMX",
    "amx_bf16": "AMX-BF16",
    "amx_fp16": "AMX-FP16",
    "sve": "SVE",  # arm64 (Linux "Features", macOS hw.optional.arm.FEAT_*)
    "bf16": "ARM BF16",
    "i8mm": "ARM I8MM",
}
_BF16_MATRIX_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


@dataclass(frozen=True)
class CPUCapabilities:
    """What a CPU offers for matrix math: its flags, and the kernels torch chose for it.

    ``flags`` are the CPU's own (``/proc/cpuinfo``, or ``sysctl`` on macOS; empty where neither
    answers); ``torch_isa`` is ``torch.backends.cpu.get_cpu_capability()``, the vectorised kernel
    family ATen dispatches to ("AVX2", "AVX512", "DEFAULT", ...; ``ATEN_CPU_CAPABILITY`` lowers
    it). Whether BF16 is *fast* is a measurement (``perf.measure_gemm_rates``), not a flag: the
    flags only say which instructions exist.
    """

    flags: frozenset[str]
    torch_isa: str

    @property
    def bf16_matrix(self) -> bool:
        """AVX-512 BF16, AMX-BF16 or arm64's BF16 extension: BF16 multiplies in hardware."""
        return any(f in self.flags for f in _BF16_MATRIX_FLAGS)

    @property
    def features(self) -> list[str]:
        """The matrix-relevant flags present, by name ("AVX2", "AVX-512", "AMX-BF16", ...)."""
        return [name for flag, name in _CPU_FLAGS.items() if flag in self.flags]

    def summary(self) -> str:
        found = ", ".join(self.features) or "none of AVX2/AVX-512/AMX/SVE detected"
        bf16 = [n for f, n in _CPU_FLAGS.items() if f in _BF16_MATRIX_FLAGS and f in self.flags]
        return (
            f"matrix instructions: {found} (torch kernels: {self.torch_isa}); "
            f"BF16 matrix instructions: {', '.join(bf16) or 'none detected'}"
        )


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, arm
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    import subprocess

    try:  # macOS on Intel: machdep.cpu.features / leaf7_features (upper case, "AVX512F")
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
        flags = {f.lower().replace(".", "_") for f in out.split()}
        arm = subprocess.run(
            ["sysctl", "hw.optional.arm"], capture_output=True, text=True, timeout=5
        ).stdout  # Apple silicon: "...FEAT_BF16: 1"
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    for line in arm.splitlines():
        key, _, value = line.partition(":")
        if key.strip().startswith("hw.optional.arm.FEAT_") and value.strip() == "1":
            flags.add(key.strip().removeprefix("hw.optional.arm.FEAT_").lower())
    return frozenset(flags)


def cpu_capabilities() -> CPUCapabilities:
    """The CPU's matrix-relevant flags and the kernel family torch uses on it."""
    return CPUCapabilities(_cpu_flags(), torch.backends.cpu.get_cpu_capability())


@dataclass(frozen=True)
class DeviceInfo:
    """The device in front of the reader."""

    type: str  # "cuda" or "cpu"
    name: str
    compute_capability: tuple[int, int] | None
    memory_bytes: int | None
    # CUDA: BF16 tensor cores (sm_80+). CPU: BF16 matrix instructions present (AVX-512 BF16,
    # AMX-BF16, arm64 BF16); BF16 runs on any CPU, and whether it is fast there is measured.
    bf16_supported: bool
    fp8_supported: bool  # FP8 tensor-core GEMMs (sm_89+); never on a CPU
    spec: DeviceSpec | None
    cpu: CPUCapabilities | None = None  # on a CPU device: its matrix capabilities

    def summary(self) -> str:
        cc = (
            f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"
            if (self.compute_capability)
            else "no CUDA"
        )
        mem = f"{self.memory_bytes / 2**30:.0f} GiB" if self.memory_bytes else "? GiB"
        if self.cpu is not None:
            return f"{self.name} (cpu, {mem}); {self.cpu.summary()}; fp8 GEMMs: no"
        return (
            f"{self.name} ({self.type}, {cc}, {mem}); bf16 matrix units: "
            f"{'yes' if self.bf16_supported else 'no'}; fp8 GEMMs: "
            f"{'yes' if self.fp8_supported else 'no'}"
        )


def default_device(device: torch.device | str | None = None) -> torch.device:
    """``device`` as a ``torch.device``; if None, the GPU when torch sees one, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"


def _cpu_memory() -> int | None:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe_device(device: torch.device | str | None = None) -> DeviceInfo:
    """Name, compute capability, memory, BF16/FP8 support and datasheet spec of ``device``."""
    device = default_device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        cc = (props.major, props.minor)
        return DeviceInfo(
            type="cuda",
            name=props.name,
            compute_capability=cc,
            memory_bytes=props.total_memory,
            bf16_supported=cc >= (8, 0),
            fp8_supported=cc >= (8, 9),
            spec=lookup_spec(props.name),
        )
    if device.type == "cpu":
        caps = cpu_capabilities()
        return DeviceInfo(
            type="cpu",
            name=_cpu_name(),
            compute_capability=None,
            memory_bytes=_cpu_memory(),
            bf16_supported=caps.bf16_matrix,
            fp8_supported=False,
            spec=None,
            cpu=caps,
        )
    raise ValueError(f"Unsupported device type {device.type!r}; use 'cpu' or 'cuda'.")


def te_available() -> tuple[bool, str]:
    """Whether NVIDIA Transformer Engine's PyTorch backend imports here, and why not if not."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # ImportError, or TE's own errors when its CUDA core is missing
        return False, f"transformer_engine.pytorch does not import: {type(exc).__name__}: {exc}"
    return True, "transformer_engine.pytorch imports"


def fp8_gemm_status(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether FP8 tensor-core GEMMs (``torch._scaled_mm``) run fast on ``device``, and why."""
    info = describe_device(device)
    if info.type != "cuda":
        return False, (
            "no CUDA GPU; the CPU emulates FP8 GEMMs: FP8 operands widened to FP32, an FP32 "
            "matmul, scales applied after"
        )
    if not info.fp8_supported:
        cc = info.compute_capability
        arch = "of unknown compute capability" if cc is None else f"sm_{cc[0]}{cc[1]}"
        return False, f"{info.name} is {arch}; FP8 tensor cores need sm_89+ (Ada/Hopper)"
    return True, f"{info.name} has FP8 tensor cores"


def cuda_capability(device: torch.device | str) -> tuple[str, tuple[int, int]] | None:
    """(name, compute capability) of a CUDA ``device``; None for any other device type.

    The one place that resolves a device index, so every "needs sm_XY" check reads the same GPU.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), (int(major), int(minor))
