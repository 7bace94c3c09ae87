"""Which dtype does each operation run in under a precision policy? Record it and count.

``record_op_dtypes`` runs a function under a ``TorchDispatchMode`` and notes every ATen operator
that reaches the dispatcher below autocast (so it sees the *casts* autocast inserts, as
``aten._to_copy``, and the dtypes the kernels really get). ``autocast_summary`` does this for
one forward pass and loss of a model and counts the ops per output dtype.

What ``torch.autocast("cpu", dtype=torch.bfloat16)`` does to the book's GPT (torch 2.13):

- **Linear layers** (``aten.addmm``; the tied LM head ``aten.mm``) and **attention**
  (``aten._scaled_dot_product_flash_attention_for_cpu``) are on CPU autocast's
  lower-precision list: their FP32 inputs and weights are cast to BF16 (``aten._to_copy``,
  FP32 -> BF16) and they output BF16.
- **GELU** is on no list; it runs in its input's dtype, BF16 (the ``mlp.fc`` output).
- **Residual adds** promote: FP32 stream + BF16 branch gives FP32, so the residual stream,
  and the embeddings before it, stay FP32.
- **LayerNorm** (``aten.native_layer_norm``) is *not* on CPU autocast's FP32 list in torch
  2.13 (it is on CUDA's). It runs in its input's dtype: FP32 here, because it reads the FP32
  residual stream. Fed a BF16 tensor under CPU autocast, it returns BF16.
- **The loss**: ``GPT.forward`` calls ``logits.float()`` (``aten._to_copy`` BF16 -> FP32),
  so ``aten._log_softmax`` and ``aten.nll_loss_forward`` run in FP32. (``cross_entropy`` is on
  CPU autocast's FP32 list anyway: it returns FP32 even for BF16 logits.)

Under the ``fp32`` and ``tf32`` policies nothing is cast and every floating op is FP32; TF32 is
a CUDA matmul setting and changes no dtype.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .precision import get_policy

__all__ = [
    "OpRecord",
    "SKIPPED_OPS",
    "record_op_dtypes",
    "autocast_summary",
]

# Ops that only re-describe memory (views, splits) or the autograd graph (detach): they keep the
# dtype of their input and would make up half the log.
SKIPPED_OPS: frozenset[str] = frozenset(
    f"aten.{name}"
    for name in (
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "transpose",
        "permute",
        "expand",
        "squeeze",
        "unsqueeze",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "as_strided",
        "alias",
        "detach",
        "_reshape_alias",
        "view_as",
    )
)


@dataclass(frozen=True)
class OpRecord:
    """One ATen call: ``op`` like "aten.addmm"; dtypes as short names like "bfloat16"."""

    op: str
    input_dtypes: tuple[str, ...]
    output_dtype: str | None  # dtype of the first tensor output; None if there is none


def _tensor_dtypes(tree: Any) -> tuple[str, ...]:
    """The dtypes of the tensors in ``tree``, as short names like "bfloat16"."""
    leaves, _ = tree_flatten(tree)
    return tuple(str(t.dtype).removeprefix("torch.") for t in leaves if isinstance(t, torch.Tensor))


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[OpRecord] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = str(func.overloadpacket)  # "aten.addmm" (the overload, ".default", dropped)
        if op not in SKIPPED_OPS:
            outputs = _tensor_dtypes(out)
            self.records.append(
                OpRecord(op, _tensor_dtypes((args, kwargs)), outputs[0] if outputs else None)
            )
        return out


def record_op_dtypes(fn: Callable[[], object]) -> list[OpRecord]:
    """Run ``fn()`` and return the ATen ops it called, in order, with their tensor dtypes.

    Ops named in ``SKIPPED_OPS`` (views, reshapes, splits, transposes and ``detach``, which
    never change a dtype) are left out. The mode sits below autocast and
    autograd in the dispatcher: it records the casts autocast inserts, and, if ``fn`` calls
    ``backward()``, the backward ops too (CPU autograd runs on the calling thread).
    The first call in a process takes a few seconds: entering a dispatch mode imports
    ``torch._dynamo`` (about 4 s on the book's 2-core CPU machines).
    """
    recorder = _Recorder()
    with recorder:
        fn()
    return recorder.records


def autocast_summary(
    model: torch.nn.Module,
    idx: torch.Tensor,
    targets: torch.Tensor,
    policy_name: str,
    device: torch.device | str = "cpu",
) -> list[dict[str, Any]]:
    """Run one forward pass and loss under the policy; count the ops per output dtype.

    Rows ``{"op", "output_dtype", "count", "input_dtypes"}``, sorted by op name then dtype;
    ``input_dtypes`` lists (comma-separated) every input dtype seen for that row. The forward
    runs with gradients enabled, as in training.
    Raises ``RuntimeError`` if ``device`` cannot run the policy (``fp16`` on CPU).
    """
    policy = get_policy(policy_name, device)

    def forward() -> None:
        with policy.matmul_settings(), policy.autocast(device):
            model(idx.to(device), targets.to(device))

    counts: Counter[tuple[str, str]] = Counter()
    inputs: dict[tuple[str, str], set[str]] = {}
    for rec in record_op_dtypes(forward):
        key = (rec.op, rec.output_dtype or "-")
        counts[key] += 1
        inputs.setdefault(key, set()).update(rec.input_dtypes)
    return [
        {
            "op": op,
            "output_dtype": dtype,
            "count": counts[(op, dtype)],
            "input_dtypes": ", ".join(sorted(inputs[(op, dtype)])),
        }
        for op, dtype in sorted(counts)
    ]
