"""Exercise 8.1: MFU from a measured step time, checked against ``perf.mfu`` with the FLOP
count of ``flops.training_flops_per_token`` (what ``GPT.flops_per_token`` returns)."""

from __future__ import annotations

from ..config import MODEL_SIZES, GPTConfig
from ..flops import training_flops_per_token
from ..hardware import SPECS, DeviceSpec
from ..perf.mfu import mfu
from .base import Case, Exercise

STUB = '''\
def mfu_from_step(
    cfg, batch_size: int, step_seconds: float, peak_flops: float
) -> float:
    """Model FLOPs utilisation of one training step, as a fraction.

    cfg: a tutorial_lib.GPTConfig (n_layer, n_embd, block_size,
         vocab_size); each step trains batch_size sequences of
         cfg.block_size tokens in step_seconds.
    peak_flops: the device's datasheet peak, FLOP/s.
    Model FLOPs per token: 6 N + 12 L T C with N = 12 L C^2 + V C.
    """
    raise NotImplementedError
'''

TASK = (
    "The ladder's table reports MFU next to every step time. Compute it: the tokens per second "
    "of the step (`batch_size` x `cfg.block_size` tokens in `step_seconds`), times the model's "
    "training FLOPs per token (6N + 12LTC with N = 12LC^2 + VC: the matmul weights, forward "
    "and backward, plus the attention scores over the full T x T matrix), divided by the "
    "device's peak FLOP/s."
)


def _cases() -> list[Case]:
    out = []
    odd = GPTConfig(vocab_size=257, block_size=29, n_layer=3, n_head=3, n_embd=36)
    for cfg_name, cfg, batch, seconds, device, dtype in [
        ("gpt2-124m", MODEL_SIZES["gpt2-124m"], 8, 0.095, "H100 SXM", "bf16"),
        ("an odd tiny model", odd, 5, 0.0031, "A100", "fp32"),
        ("fp8-2.7b", MODEL_SIZES["fp8-2.7b"], 4, 0.87, "H200", "fp8"),
        ("tiny", MODEL_SIZES["tiny"], 16, 0.25, "H100 PCIe", "bf16"),
    ]:
        peak = SPECS[device].peak(dtype)
        args = {"cfg": cfg, "batch_size": batch, "step_seconds": seconds, "peak_flops": peak}
        label = f"{cfg_name}, batch {batch}, {seconds} s per step, {device} {dtype} peak"
        out.append(Case(label, args))
    return out


def _reference(cfg: GPTConfig, batch_size: int, step_seconds: float, peak_flops: float) -> float:
    tps = batch_size * cfg.block_size / step_seconds  # tokens per second
    fpt = training_flops_per_token(cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size)
    spec = DeviceSpec("exercise", {"peak": peak_flops}, 1.0, "exercise 8.1")
    value = mfu(tps, fpt, spec, "peak")
    assert value is not None  # the spec has this peak
    return value


EXERCISES = [
    Exercise(
        id="8.1",
        title="MFU from a step time",
        function="mfu_from_step",
        signature=(
            "mfu_from_step(cfg: GPTConfig, batch_size: int, step_seconds: float, "
            "peak_flops: float) -> float"
        ),
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name="tutorial_lib.perf.mfu with flops.training_flops_per_token",
    )
]
