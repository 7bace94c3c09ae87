"""Tests for tutorial_lib.hardware: the datasheet table and device detection."""

from __future__ import annotations

import math
import platform
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tutorial_lib import hardware
from tutorial_lib.hardware import SPECS, DeviceInfo, describe_device, lookup_spec

# ---- CPU -----------------------------------------------------------------------------------


def test_describe_cpu() -> None:
    info = describe_device("cpu")
    assert isinstance(info, DeviceInfo)
    assert info.type == "cpu"
    assert info.spec is None  # MFU is unavailable on a CPU: no made-up peak
    assert info.fp8_supported is False
    assert info.cpu is not None and info.bf16_supported is info.cpu.bf16_matrix
    assert info.cpu.torch_isa == torch.backends.cpu.get_cpu_capability()
    assert info.compute_capability is None
    assert isinstance(info.name, str) and info.name
    assert info.memory_bytes is None or info.memory_bytes > 0
    summary = info.summary()
    assert "(cpu," in summary and "fp8 GEMMs: no" in summary
    assert "matrix instructions:" in summary and "torch kernels:" in summary


# The two CPU kinds the book runs on (flags abridged from /proc/cpuinfo).
EPYC_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 fma avx f16c avx2 bmi2 sha_ni vaes"
XEON_FLAGS = (
    "fpu sse sse2 ssse3 sse4_1 sse4_2 fma avx f16c avx2 avx512f avx512dq avx512_vnni "
    "avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"
)


@pytest.mark.parametrize(
    "flags,isa,bf16,features",
    [
        (EPYC_FLAGS, "AVX2", "", ["AVX2"]),
        (
            XEON_FLAGS,
            "AVX512",
            "AVX-512 BF16, AMX-BF16",
            ["AVX2", "AVX-512", "AVX-512 BF16", "AVX-512 FP16", "AMX", "AMX-BF16"],
        ),
        ("fpu sse sse2", "DEFAULT", "", []),
        ("fp asimd sve i8mm bf16", "SVE256", "ARM BF16", ["SVE", "ARM BF16", "ARM I8MM"]),
    ],
)
def test_cpu_capabilities_of_each_cpu_kind(
    monkeypatch: pytest.MonkeyPatch, flags: str, isa: str, bf16: str, features: list[str]
) -> None:
    monkeypatch.setattr(hardware, "_cpu_flags", lambda: frozenset(flags.split()))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: isa)
    info = describe_device("cpu")
    assert info.cpu is not None and info.cpu.features == features
    assert info.bf16_supported is bool(bf16) and info.cpu.torch_isa == isa
    summary = info.summary()
    assert f"torch kernels: {isa}" in summary
    assert f"BF16 matrix instructions: {bf16 or 'none detected'}" in summary
    if not features:
        assert "none of AVX2/AVX-512/AMX/SVE detected" in summary


def test_cpu_flags_of_this_machine_are_read() -> None:
    caps = hardware.cpu_capabilities()
    if Path("/proc/cpuinfo").is_file() and platform.machine() in ("x86_64", "aarch64"):
        assert caps.flags  # Linux: a "flags" (x86) or "Features" (arm64) line
    assert caps.torch_isa == torch.backends.cpu.get_cpu_capability()


def test_describe_cpu_accepts_torch_device() -> None:
    assert describe_device(torch.device("cpu")).type == "cpu"


def test_describe_default_device_on_this_machine() -> None:
    if torch.cuda.is_available():
        pytest.skip("a real CUDA device is present")
    assert hardware.default_device() == torch.device("cpu")
    assert describe_device().type == "cpu"


def test_describe_unsupported_device_type() -> None:
    with pytest.raises(ValueError, match="meta"):
        describe_device("meta")


# ---- lookup_spec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("nvidia h100 pcie", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 141GB HBM3e", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_lookup_spec_known(device_name: str, key: str) -> None:
    spec = lookup_spec(device_name)
    assert spec is SPECS[key]
    assert spec.name == key


@pytest.mark.parametrize(
    "device_name",
    ["Tesla T4", "NVIDIA GeForce RTX 4090", "NVIDIA L4", "Tesla V100-SXM2-16GB", "", "cpu"],
)
def test_lookup_spec_unknown(device_name: str) -> None:
    assert lookup_spec(device_name) is None


# ---- the datasheet table -------------------------------------------------------------------


@pytest.mark.parametrize("key", list(SPECS))
def test_spec_peaks_are_ordered(key: str) -> None:
    spec = SPECS[key]
    assert spec.name == key
    fp32, tf32, bf16 = spec.peak("fp32"), spec.peak("tf32"), spec.peak("bf16")
    assert fp32 is not None and tf32 is not None and bf16 is not None
    assert 0 < fp32 < tf32 < bf16
    for value in spec.peak_flops.values():
        assert math.isfinite(value) and value > 0
    # Dense FP16 tensor-core math runs at the BF16 rate on all of these parts.
    assert spec.peak("fp16") == bf16
    # Plausibility: between 1 TFLOP/s and 100 PFLOP/s.
    assert 1e12 < fp32 and bf16 < 1e17


@pytest.mark.parametrize("key", [k for k, s in SPECS.items() if "fp8" in s.peak_flops])
def test_fp8_is_twice_bf16(key: str) -> None:
    spec = SPECS[key]
    assert spec.peak("fp8") == pytest.approx(2 * spec.peak("bf16"), rel=1e-9)


def test_which_parts_have_fp8() -> None:
    assert SPECS["A100"].peak("fp8") is None
    assert "fp8" not in SPECS["A100"].peak_flops
    for key in ("H100 SXM", "H100 PCIe", "H200", "B200"):
        assert SPECS[key].peak("fp8") is not None, key


def test_peak_of_unknown_dtype_is_none() -> None:
    assert SPECS["H100 SXM"].peak("int4") is None


@pytest.mark.parametrize("key", list(SPECS))
def test_spec_memory_and_source(key: str) -> None:
    spec = SPECS[key]
    assert spec.source.strip()
    assert "datasheet" in spec.source.lower()
    assert 1e12 <= spec.hbm_bandwidth <= 20e12  # 1..20 TB/s


def test_known_datasheet_values() -> None:
    # Spot checks against the vendor datasheets (dense, i.e. sparse figures halved).
    h100 = SPECS["H100 SXM"]
    assert h100.peak("bf16") == pytest.approx(989.5e12)
    assert h100.peak("fp8") == pytest.approx(1979e12)
    assert h100.hbm_bandwidth == pytest.approx(3.35e12)
    # H100 PCIe: BF16 1,513 TF and FP8 3,026 TF sparse.
    assert SPECS["H100 PCIe"].peak("bf16") == pytest.approx(1513e12 / 2)
    assert SPECS["H100 PCIe"].peak("fp8") == pytest.approx(3026e12 / 2)
    # H200 has H100 SXM compute and more, faster memory.
    h200 = SPECS["H200"]
    assert h200.peak_flops == h100.peak_flops
    assert h200.hbm_bandwidth > h100.hbm_bandwidth
    assert SPECS["A100"].peak("bf16") == pytest.approx(312e12)
    assert SPECS["A100"].peak("tf32") == pytest.approx(156e12)


@pytest.mark.parametrize("key", list(SPECS))
def test_spec_cites_its_own_datasheet_in_dense_terms(key: str) -> None:
    """Each entry names, in ``source``, the vendor datasheet of *its* part and says the figures
    are dense; and TF32 runs at half the BF16 rate, as on every part in the table (to the
    datasheets' rounding: 378 of 756.5 TF on the H100 PCIe, 1.1 of 2.25 PF on the B200).
    """
    spec = SPECS[key]
    source = spec.source
    assert source.startswith("NVIDIA ") and "datasheet" in source, source
    model = key.split()[0]  # "H100 SXM" -> "H100"
    assert model in source, f"SPECS[{key!r}].source does not name {model}: {source!r}"
    others = {k.split()[0] for k in SPECS} - {model}
    assert not any(other in source for other in others), source
    assert "dense" in source, source
    bf16, tf32 = spec.peak("bf16"), spec.peak("tf32")
    assert bf16 is not None and tf32 is not None
    assert tf32 == pytest.approx(bf16 / 2, rel=0.03)
    assert lookup_spec(f"NVIDIA {key}") is spec  # the name the entry is filed under finds it


# ---- simulated CUDA devices ----------------------------------------------------------------


def _fake_cuda_device(
    monkeypatch: pytest.MonkeyPatch, name: str, major: int, minor: int, memory: int
) -> list[int]:
    """Make torch.cuda report one device; returns the list of indices that were queried."""
    queried: list[int] = []

    def get_device_properties(index: int) -> SimpleNamespace:
        queried.append(index)
        return SimpleNamespace(name=name, major=major, minor=minor, total_memory=memory)

    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return queried


def test_describe_simulated_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    queried = _fake_cuda_device(monkeypatch, "NVIDIA H100 80GB HBM3", 9, 0, 80 * 2**30)
    info = describe_device("cuda")
    assert queried == [0]
    assert info.type == "cuda"
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.compute_capability == (9, 0)
    assert info.memory_bytes == 80 * 2**30
    assert info.bf16_supported is True
    assert info.fp8_supported is True
    assert info.spec is SPECS["H100 SXM"]
    summary = info.summary()
    assert "sm_90" in summary and "80 GiB" in summary
    assert "fp8 GEMMs: yes" in summary and "bf16 matrix units: yes" in summary


def test_describe_simulated_a100(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda_device(monkeypatch, "NVIDIA A100-SXM4-80GB", 8, 0, 80 * 2**30)
    info = describe_device(torch.device("cuda"))
    assert info.compute_capability == (8, 0)
    assert info.bf16_supported is True
    assert info.fp8_supported is False
    assert info.spec is SPECS["A100"]
    assert "sm_80" in info.summary() and "fp8 GEMMs: no" in info.summary()


def test_describe_simulated_t4(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda_device(monkeypatch, "Tesla T4", 7, 5, 15 * 2**30)
    info = describe_device("cuda")
    assert info.compute_capability == (7, 5)
    assert info.bf16_supported is False
    assert info.fp8_supported is False
    assert info.spec is None  # unknown part: MFU unavailable rather than guessed
    assert "sm_75" in info.summary()


def test_describe_simulated_ada_has_fp8_but_no_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda_device(monkeypatch, "NVIDIA L4", 8, 9, 24 * 2**30)
    info = describe_device("cuda")
    assert info.fp8_supported is True and info.bf16_supported is True
    assert info.spec is None


def test_describe_explicit_cuda_index(monkeypatch: pytest.MonkeyPatch) -> None:
    queried = _fake_cuda_device(monkeypatch, "NVIDIA H200", 9, 0, 141 * 10**9)

    def current_device() -> int:
        raise AssertionError("an explicit index must not consult current_device()")

    monkeypatch.setattr(torch.cuda, "current_device", current_device)
    info = describe_device("cuda:3")
    assert queried == [3]
    assert info.spec is SPECS["H200"]


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-40GB"])
def test_variants_with_other_numbers_are_unknown(name: str) -> None:
    """Better no MFU than MFU against another card's datasheet."""
    assert lookup_spec(name) is None


def test_cuda_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutorial_lib.hardware import cuda_capability

    assert cuda_capability("cpu") is None
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Fake GPU {i}")
    assert cuda_capability("cuda") == ("Fake GPU 0", (8, 6))
    assert cuda_capability("cuda:3") == ("Fake GPU 3", (8, 6))
