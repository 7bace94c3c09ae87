"""Every Triton kernel compiles for Hopper (sm_90) and Ampere (sm_80) with the installed Triton.

The CPU interpreter (``TRITON_INTERPRET=1``), which every other kernel test uses, never compiles:
a kernel that no GPU would accept passes there. ``tests/triton_targets.py`` compiles each launch
the package makes, at each preset's shapes and in FP32, BF16 and FP16, for a stand-in GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Shared memory one thread block may use (the CUDA C++ Programming Guide's table of compute
# capabilities: "Maximum amount of shared memory per thread block": 227 KB on 9.0, 163 KB on 8.0).
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}


def _compile(arch: int, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"sm{arch}.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "triton_targets.py"),
            "--arch",
            str(arch),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("arch", [90, 80])
def test_every_kernel_compiles_for_the_gpu(arch: int, tmp_path: Path, record_property) -> None:
    report = _compile(arch, tmp_path)
    errors = [f"{e['case']}: {e['kernel']}: {e['error'][:600]}" for e in report["errors"]]
    assert not errors, f"sm_{arch}, Triton {report['triton']}:\n" + "\n".join(errors)
    launched = set(report["kernels"]) - set(report["device_functions"])
    compiled = {c["kernel"] for c in report["compiled"]}
    assert launched <= compiled, f"never compiled: {sorted(launched - compiled)}"
    # every preset and dtype reached the kernels
    cases = {c["case"] for c in report["compiled"]}
    for preset in ("ci", "hopper"):
        for dtype in ("fp32", "bf16", "fp16"):
            assert f"{preset} gpt step {dtype}" in cases
            assert f"{preset} flash attention {dtype}" in cases
        assert f"{preset} gpt step fp8 bf16" in cases  # the fused FP8 rung: GELU without bias
    over = [
        f"{c['case']}: {c['kernel']} {c['constexprs']} needs {c['shared_bytes']} B"
        for c in report["compiled"]
        if c["shared_bytes"] > SHARED_LIMIT[arch]
    ]
    assert not over, (
        f"shared memory over sm_{arch}'s {SHARED_LIMIT[arch]} B per block:\n" + "\n".join(over)
    )
    most = max(report["compiled"], key=lambda c: c["shared_bytes"])
    variants = {
        (c["kernel"], json.dumps(c["constexprs"]), tuple(c["dtypes"])) for c in report["compiled"]
    }
    record_property(
        "report",
        f"Triton {report['triton']} for sm_{arch}: {len(variants)} kernel variants of "
        f"{len(compiled)} kernels compiled; most shared memory {most['shared_bytes'] / 1024:.0f} KB "
        f"({most['kernel']}, {most['case']}) of {SHARED_LIMIT[arch] // 1024} KB",
    )


def test_harness_finds_a_kernel_that_does_not_compile(tmp_path: Path) -> None:
    """The check can fail: a kernel annotated with a typing name (what broke every kernel
    before) is reported, with Triton's message, and the others still compile."""
    script = tmp_path / "bad.py"
    script.write_text(
        "import sys, json\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import triton_targets as tt\n"
        "from typing import Any\n"
        "import torch\n"
        "from tutorial_lib.kernels.runtime import tl, triton\n"
        "@triton.jit\n"
        "def bad(x_ptr: Any, N, BLOCK: tl.constexpr):\n"
        "    tl.store(x_ptr + tl.arange(0, BLOCK), 1.0, mask=tl.arange(0, BLOCK) < N)\n"
        "@triton.jit\n"
        "def good(x_ptr, N, BLOCK: tl.constexpr):\n"
        "    tl.store(x_ptr + tl.arange(0, BLOCK), 1.0, mask=tl.arange(0, BLOCK) < N)\n"
        "with tt.compile_only(90) as rec:\n"
        "    x = torch.zeros(16)\n"
        "    bad[(1,)](x, 16, BLOCK=16)\n"
        "    good[(1,)](x, 16, BLOCK=16)\n"
        "print(json.dumps({'errors': rec.errors, 'compiled': rec.compiled}))\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [e["kernel"] for e in result["errors"]] == ["bad"]
    assert "Cannot access global variable Any" in result["errors"][0]["error"]
    assert [c["kernel"] for c in result["compiled"]] == ["good"]


def test_only_the_kernels_go_unannotated() -> None:
    """pyproject.toml lets mypy accept unannotated functions in the kernel modules, for the
    ``@triton.jit`` kernels alone (Triton reads annotations); everything else stays annotated."""
    import ast

    # (not imported from triton_targets.py: importing it switches this process's Triton mode)
    paths = [
        p
        for p in (ROOT / "tutorial_lib" / "kernels").glob("*.py")
        if "\n@triton.jit\n" in p.read_text()  # a decorator, not a docstring's mention
    ]
    assert len(paths) == 6
    missing = []
    for path in paths:
        name = path.stem
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            jit = any("jit" in ast.unparse(d) for d in node.decorator_list)
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            bare = [a.arg for a in args if a.annotation is None and a.arg not in ("self", "cls")]
            if jit:
                assert all(
                    a.annotation is None or "constexpr" in ast.unparse(a.annotation) for a in args
                ), f"{name}.{node.name}: a kernel parameter annotated with a type Triton rejects"
            elif bare or node.returns is None:
                missing.append(f"{name}.{node.name}: {bare or 'return'}")
    assert not missing, missing
