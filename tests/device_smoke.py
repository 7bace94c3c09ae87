"""The first minute on a GPU: does every GPU-only path run, and agree with its reference?

    python tests/device_smoke.py --preset hopper --json smoke.json

Run by ``scripts/hopper_check.py`` as its first measured stage (and by its ``--dry-run`` on a
CPU, where the kernels run in Triton's interpreter and the FP8 GEMMs have no native path). Three
groups of checks, each written to ``--json`` as soon as it is done, so a run cut short still
returns every check that finished:

1. ``kernel``: each Triton kernel, forward and backward, against its float32 torch reference, in
   FP32, BF16 and FP16 (``tests/test_kernels.py``'s tolerances, relative to the largest
   reference value), the chunked LayerNorm kernels of rows wider than ``MAX_ROW_BLOCK`` and exercise 7.1's
   solution included;
2. ``gemm``: each recipe Hopper runs natively (delayed, current, row-wise, block): one
   ``FP8Linear`` step, its forward, dgrad and wgrad GEMMs on the FP8 tensor cores, against the
   same step emulated;
3. ``train``: two training steps of the preset's model under every policy the device can run
   (the ``-emulated`` variant where it lacks a recipe's math), on random tokens: finite losses,
   and the step time of the second step.

Exit status 1 if a check failed (a check that cannot run here says why and counts as passed).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import tutorial_lib as tl  # noqa: E402  (decides Triton's mode: compiled on a GPU)
from tutorial_lib import kernels as K  # noqa: E402
from tutorial_lib.kernels.attention import attention_reference  # noqa: E402
from tutorial_lib.kernels.layernorm import layer_norm_reference  # noqa: E402
from tutorial_lib.kernels.runtime import MAX_ROW_BLOCK  # noqa: E402

# tests/test_kernels.py's tolerances: (rtol, atol relative to the reference's largest magnitude)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (2e-3, 1e-3)}
GEMM_TOL = 2e-2  # largest |native - emulated| over the largest |emulated|: accumulation order
# and Hopper's fast accumulation differ from the emulation's float32 sums


class Checks:
    """Runs checks and rewrites the JSON file after each one (atomically)."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.rows = path, []

    def run(self, group: str, name: str, fn: Callable[[], str | None]) -> None:
        t0 = time.perf_counter()
        try:
            detail, ok = fn() or "", True
        except Exception as exc:
            detail, ok = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-2)}", False
        row = {"group": group, "check": name, "ok": ok, "detail": detail[:2000]}
        row["seconds"] = round(time.perf_counter() - t0, 2)
        self.rows.append(row)
        print(
            f"[smoke] {group} {name}: {'ok' if ok else 'FAILED'} ({row['seconds']} s) {detail[:200]}",
            flush=True,
        )
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.rows, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> str:
    rtol, atol = TOL[dtype]
    scale = expected.double().abs().max().item() or 1.0
    torch.testing.assert_close(
        actual.double(),
        expected.double(),
        rtol=rtol,
        atol=atol * scale,
        msg=lambda m: f"{what}: {m}",
    )
    return f"max |diff| {(actual.double() - expected.double()).abs().max().item() / scale:.2e} of max |ref|"


def _grads(
    fn: Callable[..., torch.Tensor], *inputs: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    out.float().square().sum().backward()  # a gradient that depends on every output
    return out.detach(), [t.grad for t in leaves if t.grad is not None]


def kernel_checks(
    checks: Checks, device: torch.device, rows: int, width: int, vocab: int, heads: int, seq: int
) -> None:
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        x, r, w, b = (
            rand(rows, width, dtype=dtype),
            rand(rows, width, dtype=dtype),
            rand(width),
            rand(width),
        )
        h, fb = rand(rows, 4 * width, dtype=dtype), rand(4 * width)
        wide, ww = rand(8, 2 * MAX_ROW_BLOCK, dtype=dtype), rand(2 * MAX_ROW_BLOCK)
        cases: dict[
            str, tuple[Callable[..., Any], Callable[..., Any], tuple[torch.Tensor, ...]]
        ] = {
            "bias_gelu": (K.bias_gelu, K.bias_gelu_reference, (h, fb)),
            "layer_norm": (K.layer_norm, layer_norm_reference, (x, w, b)),
            "add_layer_norm": (
                lambda *a: K.add_layer_norm(*a)[1],
                lambda *a: K.add_layer_norm_reference(*a)[1],
                (x, r, w, b),
            ),
            "softmax": (K.softmax, K.softmax_reference, (x,)),
            "flash_attention": (
                K.flash_attention,
                attention_reference,
                tuple(rand(2, heads, seq, width // heads, dtype=dtype) for _ in range(3)),
            ),
        }
        # rows wider than MAX_ROW_BLOCK: the two-pass chunked LayerNorm kernels
        cases["layer_norm wide"] = (K.layer_norm, layer_norm_reference, (wide, ww, ww))
        for kernel, (ours, reference, args) in cases.items():

            def check(ours=ours, reference=reference, args=args, kernel=kernel, dtype=dtype) -> str:
                out, grads = _grads(ours, *args)
                ref, ref_grads = _grads(
                    lambda *a: reference(*(t.float() for t in a)).to(dtype), *args
                )
                text = _close(out, ref, dtype, f"{kernel} forward")
                for i, (gr, gref) in enumerate(zip(grads, ref_grads, strict=True)):
                    _close(gr, gref, dtype, f"{kernel} grad {i}")
                return text

            checks.run("kernel", f"{kernel} {name}", check)
        logits = rand(rows, vocab, dtype=dtype)
        targets = torch.randint(vocab, (rows,), generator=g).to(device)

        def ce(
            logits: torch.Tensor = logits,
            targets: torch.Tensor = targets,
            dtype: torch.dtype = dtype,
        ) -> str:
            out, (grad,) = _grads(lambda z: K.cross_entropy(z, targets), logits)
            ref, (ref_grad,) = _grads(
                lambda z: K.cross_entropy_reference(z.float(), targets), logits
            )
            _close(grad, ref_grad, dtype, "cross_entropy grad")
            return _close(out, ref, dtype, "cross_entropy loss")

        checks.run("kernel", f"cross_entropy {name}", ce)

        def exercise(h: torch.Tensor = h, fb: torch.Tensor = fb, dtype: torch.dtype = dtype) -> str:
            from exercise_solutions import fused_bias_gelu

            return _close(
                fused_bias_gelu(h, fb.to(dtype)),
                K.bias_gelu_reference(h.float(), fb.to(dtype).float()).to(dtype),
                dtype,
                "exercise 7.1",
            )

        checks.run("kernel", f"exercise 7.1 solution {name}", exercise)


def gemm_checks(checks: Checks, device: torch.device, tokens: int, width: int) -> None:
    """Each natively run recipe's three GEMMs (forward, dgrad, wgrad) on the FP8 tensor cores
    against the emulation: one ``FP8Linear`` step each way, same weights, same input."""
    from tutorial_lib.fp8 import autocast
    from tutorial_lib.fp8.linear import FP8Linear
    from tutorial_lib.fp8.native import check_recipe_device
    from tutorial_lib.fp8.recipes import make_recipe

    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(tokens, width, generator=g).to(device)
    dy = torch.randn(tokens, 4 * width, generator=g).to(device)
    base = torch.nn.Linear(width, 4 * width).to(device)

    def step(recipe: str, emulate: bool) -> list[torch.Tensor]:
        layer = FP8Linear.from_linear(copy.deepcopy(base))  # its own parameters and grads
        xi = x.clone().requires_grad_(True)
        with (
            torch.autocast(device.type, dtype=torch.bfloat16),
            autocast(recipe=make_recipe(recipe), emulate=emulate),
        ):
            y = layer(xi)
        y.backward(dy.to(y.dtype))
        return [y.float(), xi.grad.float(), layer.weight.grad.float(), layer.bias.grad.float()]

    for recipe in ("delayed", "current", "rowwise", "block"):

        def check(recipe: str = recipe) -> str:
            if check_recipe_device(recipe, device, None):
                return f"not run: {device.type} has no native {recipe} GEMM (the emulation is the only path)"
            native, emulated = step(recipe, False), step(recipe, True)
            worst = 0.0
            for what, a, b in zip(("y", "dgrad", "wgrad", "dbias"), native, emulated, strict=True):
                rel = ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()
                if not rel <= GEMM_TOL:
                    raise AssertionError(
                        f"{what}: native and emulated differ by {rel:.2e} of the largest value (> {GEMM_TOL})"
                    )
                worst = max(worst, rel)
            return (
                f"forward, dgrad, wgrad: max |native - emulated| = {worst:.2e} of the largest value"
            )

        checks.run("gemm", f"{recipe} ({tokens}x{width} -> {4 * width})", check)


def train_checks(checks: Checks, device: torch.device, preset: Any, steps: int = 2) -> None:
    from tutorial_lib.data import TokenData
    from tutorial_lib.fp8.policy import FP8_RECIPE_POLICIES, runnable_fp8_precision
    from tutorial_lib.precision import available_policies, get_policy
    from tutorial_lib.train import TrainConfig, Trainer

    cfg = preset.model_config()
    g = torch.Generator().manual_seed(2)
    data = TokenData(
        torch.randint(cfg.vocab_size, (200_000,), generator=g, dtype=torch.int32),
        torch.randint(cfg.vocab_size, (50_000,), generator=g, dtype=torch.int32),
        cfg.block_size,
    )
    for name in [p for p in available_policies() if not p.endswith("-emulated")]:

        def check(name: str = name) -> str:
            precision = (
                runnable_fp8_precision(name, device) if name in FP8_RECIPE_POLICIES else name
            )
            try:
                get_policy(precision, device)
            except RuntimeError as exc:  # e.g. fp16 on a CPU, te-fp8 without TE
                return f"not run here: {exc}"
            model = tl.build_model(cfg, precision=precision, device=device, seed=0)
            tcfg = TrainConfig(
                steps=steps,
                batch_size=preset.bench_batch_size,
                precision=precision,
                progress=False,
                eval_every=0,
            )
            trainer = Trainer(model, data, tcfg, device=device)
            rows = [trainer.train_step() for _ in range(steps)]
            losses = [r["loss"] for r in rows]
            if not all(math.isfinite(v) for v in losses):  # type: ignore[arg-type]
                raise AssertionError(f"non-finite losses {losses}")
            ms = 1000 * float(rows[-1]["step_time_s"])  # type: ignore[arg-type]
            return f"{precision}: losses {', '.join(f'{v:.3f}' for v in losses)}; step {steps} took {ms:.1f} ms"

        checks.run("train", name, check)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=os.environ.get("TUTORIAL_PRESET"))
    p.add_argument("--json", type=Path)
    p.add_argument("--groups", default="kernel,gemm,train")
    args = p.parse_args(argv)
    preset = tl.get_preset(args.preset)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = preset.model_config()
    checks = Checks(args.json)
    gpu = device.type == "cuda"
    groups = args.groups.split(",")
    if "kernel" in groups:  # the interpreter runs Python per program: small shapes on a CPU
        kernel_checks(
            checks,
            device,
            1024 if gpu else 64,
            cfg.n_embd,
            cfg.vocab_size,
            cfg.n_head,
            min(cfg.block_size, 256 if gpu else 32),
        )
    if "gemm" in groups:
        gemm_checks(checks, device, 4096 if gpu else 256, cfg.n_embd)
    if "train" in groups:
        train_checks(checks, device, preset)
    failed = [f"{r['group']} {r['check']}" for r in checks.rows if not r["ok"]]
    print(f"[smoke] {len(checks.rows) - len(failed)} passed, {len(failed)} failed", flush=True)
    return int(bool(failed))


if __name__ == "__main__":
    sys.exit(main())
