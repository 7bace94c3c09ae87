"""The exercises in which the reader writes code (tutorial_lib.exercises): every worked solution
passes its check; a deliberately wrong solution fails with a message naming the problem; the
untouched stub reports "not written yet" without raising; the stub text fits a notebook cell."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from exercise_solutions import solution, solution_source
from torch import nn

from tutorial_lib import exercises
from tutorial_lib.exercises import (
    ExerciseError,
    ch03,
    check,
    checker,
)
from tutorial_lib.kernels.runtime import tl, triton, triton_status

IDS = list(exercises.REGISTRY)  # in chapter order
TRITON_OK = triton_status()[0]


def stub(exercise_id: str) -> str:
    """The source of the notebook cell the reader edits: imports and the stub function."""
    return exercises.get_exercise(exercise_id).stub


def _load(tmp_path: Path, name: str, text: str) -> ModuleType:
    """Import ``text`` from a file, as a notebook cell would run it (Triton needs the source)."""
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fails(exercise_id: str, fn: Any) -> str:
    with pytest.raises(ExerciseError) as info:
        check(exercise_id, fn)
    message = str(info.value)
    assert message.startswith(f"Code exercise {exercise_id} ")
    assert "Traceback" not in message
    assert info.value.result is not None and info.value.result.status == "failed"
    return message


# ---- the registry --------------------------------------------------------------------------
def test_every_chapter_has_an_exercise() -> None:
    # The chapters are the notebooks that exist (a slot may be empty while its chapter is written).
    notebooks = (Path(__file__).parents[1] / "book" / "chapters").glob("[0-9][0-9]_*.ipynb")
    chapters = sorted(int(p.name[:2]) for p in notebooks)
    assert {ex.chapter for ex in exercises.REGISTRY.values()} == set(chapters)
    assert IDS == [f"{n}.1" for n in chapters]


@pytest.mark.parametrize("exercise_id", IDS)
def test_text_fits_a_notebook_cell(exercise_id: str) -> None:
    ex = exercises.get_exercise(exercise_id)
    assert ex.title and ex.signature.startswith(ex.function + "(") and len(ex.task) > 100
    for text in (stub(exercise_id), solution_source(exercise_id)):
        too_long = [line for line in text.splitlines() if len(line) > 79]
        assert too_long == []
        compile(text, f"<{exercise_id}>", "exec")
    assert re.search(rf"^def {ex.function}\(", stub(exercise_id), re.MULTILINE)
    assert "raise NotImplementedError" in stub(exercise_id)
    assert f"def {ex.function}(" in solution_source(exercise_id)


@pytest.mark.parametrize("exercise_id", IDS)
def test_every_chapter_checks_its_exercise_with_the_registry_text(exercise_id: str) -> None:
    """Every chapter checks its exercise; its stub cell and the worked solution it shows are the
    registry's text, verbatim (the notebook and the checker cannot drift apart)."""
    chapter = exercises.get_exercise(exercise_id).chapter
    (path,) = (Path(__file__).parents[1] / "book" / "chapters").glob(f"{chapter:02d}_*.ipynb")
    code = [
        "".join(c["source"])
        for c in json.loads(path.read_text())["cells"]
        if c["cell_type"] == "code"
    ]
    assert any(f'exercises.check("{exercise_id}"' in src for src in code), (
        f"{path.name} does not check exercise {exercise_id}"
    )
    assert stub(exercise_id).strip() in [src.strip() for src in code]
    markdown = "".join(
        "".join(c["source"])
        for c in json.loads(path.read_text())["cells"]
        if c["cell_type"] == "markdown"
    )
    assert solution_source(exercise_id).strip() in markdown, "the shown solution is not current"


def test_stubs_pass_the_notebook_lint(tmp_path: Path) -> None:
    """``make lint`` runs ruff over the notebooks (E402 and F401 ignored there)."""
    for exercise_id in IDS:
        (tmp_path / f"stub_{exercise_id.replace('.', '_')}.py").write_text(stub(exercise_id))
    ruff = Path(sys.executable).with_name("ruff")
    args = ["--select", "E,F,W,I,B,UP", "--ignore", "E402,F401", "--line-length", "79"]
    args += ["--config", "lint.isort.known-first-party = ['tutorial_lib']", "--no-cache"]
    done = subprocess.run([str(ruff), "check", *args, str(tmp_path)], capture_output=True)
    assert done.returncode == 0, done.stdout.decode()


def test_unknown_id_and_non_function() -> None:
    with pytest.raises(KeyError, match="the exercises are 1.1"):
        check("99.1", lambda: None)
    with pytest.raises(ExerciseError, match=r"needs your function itself.*quantize_e4m3"):
        check("4.1", "quantize_e4m3")  # type: ignore[arg-type]


# ---- solutions pass, stubs are "not written yet" ------------------------------------------
@pytest.mark.parametrize("exercise_id", IDS)
def test_solution_passes(exercise_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    if exercise_id == "7.1" and not TRITON_OK:
        pytest.skip(triton_status()[1])
    result = check(exercise_id, solution(exercise_id))
    assert result.passed and result.cases_passed == result.cases_total >= 3
    assert f"Code exercise {exercise_id} " in capsys.readouterr().out


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_shown_solution_runs_with_only_the_stub_imports(
    exercise_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the notebook shows under "A worked solution", pasted over the stub, defines a
    function that passes (a file, not exec: Triton reads a kernel's source from its file)."""
    if exercise_id == "7.1" and not TRITON_OK:
        pytest.skip(triton_status()[1])
    ex = exercises.get_exercise(exercise_id)
    imports = [ln for ln in stub(exercise_id).splitlines() if ln.startswith(("import ", "from "))]
    path = tmp_path / f"shown_{exercise_id.replace('.', '_')}.py"
    path.write_text("\n".join(imports) + "\n\n" + solution_source(exercise_id))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
        assert check(exercise_id, getattr(module, ex.function)).passed
    finally:
        del sys.modules[path.stem]


@pytest.mark.parametrize("exercise_id", IDS)
def test_stub_is_not_written_yet(
    exercise_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ex = exercises.get_exercise(exercise_id)
    module = _load(tmp_path, f"stub_{exercise_id.replace('.', '_')}", stub(exercise_id))
    result = check(exercise_id, getattr(module, ex.function))  # does not raise
    assert not result.passed
    out = capsys.readouterr().out
    if result.status == "unavailable":  # 7.1 without Triton
        assert "cannot run here" in out
    else:
        assert result.status == "not written" and "not written yet" in out


def test_unavailable_exercise_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ex = dataclasses.replace(checker.REGISTRY["7.1"], unavailable=lambda: "no Triton here")
    monkeypatch.setitem(checker.REGISTRY, "7.1", ex)
    result = check("7.1", solution("7.1"))
    assert result.status == "unavailable" and not result.passed
    assert "no Triton here" in capsys.readouterr().out


def test_check_leaves_the_global_rng_alone() -> None:
    state = torch.get_rng_state()
    check("1.1", solution("1.1"))
    assert torch.equal(state, torch.get_rng_state())


def test_bf16_cases_agree_with_the_exact_rounding() -> None:
    for case in ch03._cases():
        x = case.args["x"]
        a, b = x.to(torch.bfloat16).double(), ch03.exact_reference(x).double()
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), case.label


# ---- general messages ----------------------------------------------------------------------
def test_returning_none_is_named() -> None:
    def forgot_return(x: torch.Tensor) -> None:
        x.to(torch.bfloat16)

    assert "returned None" in _fails("3.1", forgot_return)


def test_wrong_dtype_is_named() -> None:
    msg = _fails("3.1", lambda x: x.to(torch.bfloat16).float())
    assert "wrong dtype: expected torch.bfloat16, got torch.float32" in msg


def test_exception_shows_the_readers_frame_not_ours() -> None:
    def broken(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x / 0 if scale > 1e9 else x.reshape(-1, 7)

    msg = _fails("4.1", broken)
    assert "your function raised RuntimeError" in msg and "in broken" in msg
    assert "checker.py" not in msg


def test_not_implemented_deeper_down_is_a_failure_not_a_stub() -> None:
    def helper(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("no kernel for this dtype")

    def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
        return helper(x)

    msg = _fails("3.1", round_to_bf16)
    assert "your function raised NotImplementedError: no kernel for this dtype" in msg


def test_a_number_expected_and_a_tensor_returned() -> None:
    msg = _fails("11.1", lambda n, k, f: torch.tensor(1.0))
    assert "expected a Python number" in msg and ".item()" in msg


# ---- one wrong solution per exercise --------------------------------------------------------
def attention_without_mask(attn: Any, x: torch.Tensor) -> torch.Tensor:
    B, T, C = x.shape
    hs = attn.head_dim
    q, k, v = (t.view(B, T, -1, hs).transpose(1, 2) for t in attn.qkv(x).split(C, 2))
    y = (q @ k.transpose(-2, -1) / math.sqrt(hs)).softmax(-1) @ v  # no causal mask
    return attn.proj(y.transpose(1, 2).reshape(B, T, C))


def attention_heads_not_merged(attn: Any, x: torch.Tensor) -> torch.Tensor:
    B, T, C = x.shape
    return attn.qkv(x).split(C, 2)[0].view(B, T, -1, attn.head_dim).transpose(1, 2)


def roofline_forgets_the_output(
    m: int, n: int, k: int, dtype_bytes: int, peak: float, bw: float
) -> tuple[float, str]:
    flops, nbytes = 2 * m * n * k, (m * k + k * n) * dtype_bytes  # C is never written
    return max(flops / peak, nbytes / bw), "compute" if flops / peak > nbytes / bw else "memory"


def bf16_by_truncation(x: torch.Tensor) -> torch.Tensor:
    top = (x.view(torch.int32) >> 16).to(torch.int16)  # drops the bits: rounds toward zero
    return top.view(torch.bfloat16)


def e4m3_without_saturation(x: torch.Tensor, scale: float) -> torch.Tensor:
    y = x.float() * scale
    binade = torch.frexp(y.abs()).exponent - 1
    step = torch.exp2((binade.clamp(min=-6) - 3).float())
    return torch.round(y / step) * step  # 460 -> 448 is right, but 500 -> 512 is not


def scaling_ignores_idle_columns(
    history: torch.Tensor, scale: torch.Tensor, fp8_max: float, margin: int
) -> tuple[torch.Tensor, torch.Tensor]:
    window = torch.cat([history[1:], history[:1]])
    rolled = torch.cat([torch.zeros_like(history[:1]), window[1:]])
    return rolled, (fp8_max * 2.0**-margin / window.amax(0)).float()


def scaling_in_place(
    history: torch.Tensor, scale: torch.Tensor, fp8_max: float, margin: int
) -> tuple[torch.Tensor, torch.Tensor]:
    new_history, new_scale = solution("5.1")(history, scale, fp8_max, margin)
    history.copy_(new_history)  # right values, but the caller's tensor is overwritten
    return history, new_scale


def _block_tiles(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    m = x.reshape(-1, x.shape[-1]).float()
    n = -(-m.shape[1] // 128)
    tiles = nn.functional.pad(m, (0, n * 128 - m.shape[1])).reshape(m.shape[0], n, 128)
    return tiles, tiles.abs().amax(2), m.shape[1]


def _block_finish(
    x: torch.Tensor, tiles: torch.Tensor, amax: torch.Tensor, scale: torch.Tensor, cols: int
) -> tuple[torch.Tensor, torch.Tensor]:
    scale = torch.where(amax == 0, 1.0, scale)
    y = (tiles * scale[..., None]).clamp(-448.0, 448.0).reshape(tiles.shape[0], -1)[:, :cols]
    return y.to(torch.float8_e4m3fn).reshape(x.shape), 1.0 / scale


def block_without_power_of_two(
    x: torch.Tensor, fp8_max: float = 448.0
) -> tuple[torch.Tensor, torch.Tensor]:
    tiles, amax, cols = _block_tiles(x)
    return _block_finish(x, tiles, amax, fp8_max / amax, cols)  # 448 / amax as it is


def block_power_of_two_by_log2(
    x: torch.Tensor, fp8_max: float = 448.0
) -> tuple[torch.Tensor, torch.Tensor]:
    tiles, amax, cols = _block_tiles(x)
    scale = torch.exp2(torch.floor(torch.log2(fp8_max / amax)))  # log2(128 - ulp) rounds to 7
    return _block_finish(x, tiles, amax, scale, cols)


@triton.jit
def gelu_without_bias_kernel(x_ptr: Any, y_ptr: Any, N: Any, BLOCK_N: tl.constexpr) -> None:
    cols = tl.arange(0, BLOCK_N)
    offsets = tl.program_id(0) * N + cols
    h = tl.load(x_ptr + offsets, mask=cols < N, other=0.0).to(tl.float32)
    y = 0.5 * h * (2.0 - 2.0 / (1.0 + tl.exp(1.5957691216057308 * (h + 0.044715 * h * h * h))))
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=cols < N)


def gelu_forgets_the_bias(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    gelu_without_bias_kernel[(x.shape[0],)](
        x, y, x.shape[1], BLOCK_N=triton.next_power_of_2(x.shape[1])
    )
    return y


def mfu_without_attention(cfg: Any, batch: int, seconds: float, peak: float) -> float:
    n = 12 * cfg.n_layer * cfg.n_embd**2 + cfg.vocab_size * cfg.n_embd
    return batch * cfg.block_size / seconds * 6 * n / peak  # no 12 L T C


def zero_shards_only_at_stage_3(
    n_params: int, dp: int, stage: int, pb: int = 4, gb: int = 4, ob: int = 8
) -> tuple[float, float, float]:
    split = dp if stage == 3 else 1  # forgets that stages 1 and 2 shard part of the state
    return n_params * pb / split, n_params * gb / split, n_params * ob / split


def column_parallel_remainder_last(
    x: torch.Tensor, linear: nn.Linear, t: int
) -> list[torch.Tensor]:
    base = linear.out_features // t
    bounds = [r * base for r in range(t)] + [linear.out_features]  # the last rank takes the rest
    b = linear.bias
    return [
        nn.functional.linear(x, linear.weight[s:e], None if b is None else b[s:e])
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def survival_binomial(n_gpus: int, k: int, n_failed: int) -> float:
    return (1 - n_failed / n_gpus) ** k  # independent failures: close, not exact


WRONG = [
    ("1.1", attention_without_mask, r"result: wrong value at index \(\d+, \d+, \d+\)"),
    ("1.1", attention_heads_not_merged, r"wrong shape: expected \(2, 7, 12\), got \(2, 3, 7, 4\)"),
    ("2.1", roofline_forgets_the_output, r"case 2 of 5.*\n  seconds: wrong value: expected"),
    ("3.1", bf16_by_truncation, r"wrong value at index \(\d+, \d+\).*exact match needed"),
    (
        "4.1",
        e4m3_without_saturation,
        r"around the largest value.*index \(7,\): expected 448, got 512",
    ),
    (
        "5.1",
        scaling_ignores_idle_columns,
        r"case 2 of 5.*\n  new_history: wrong value at index \(1, 1\)",
    ),
    ("5.1", scaling_in_place, r"changed its input amax_history in place"),
    ("6.1", block_without_power_of_two, r"case 1 of 6: \(1, 128\).*\n  data: wrong value"),
    (
        "6.1",
        block_power_of_two_by_log2,
        r"case 5 of 6.*largest error is at \(0, 5\): expected 224, got 448",
    ),
    ("7.1", gelu_forgets_the_bias, r"case 1 of 3.*\n  result: wrong value at index \(0, \d+\)"),
    ("8.1", mfu_without_attention, r"case 1 of 4: gpt2-124m.*\n  result: wrong value: expected"),
    (
        "9.1",
        zero_shards_only_at_stage_3,
        r"case 2 of 7: GPT-2 small, dp 8, stage 1.*\n  optimizer: wrong value: expected",
    ),
    (
        "10.1",
        column_parallel_remainder_last,
        r"result\[0\]: wrong shape: expected \(2, 3, 4\), got \(2, 3, 3\)",
    ),
    ("11.1", survival_binomial, r"case 1 of 7.*\n  result: wrong value: expected"),
]


@pytest.mark.parametrize(
    ("exercise_id", "fn", "pattern"), WRONG, ids=[w[1].__name__ for w in WRONG]
)
def test_wrong_solution_names_the_problem(exercise_id: str, fn: Any, pattern: str) -> None:
    if exercise_id == "7.1" and not TRITON_OK:
        pytest.skip(triton_status()[1])
    message = _fails(exercise_id, fn)
    assert re.search(pattern, message, re.DOTALL), message
