"""Command line: ``python -m tutorial_lib {info,train,bench,ntp-reproduce} ...`` (``--help`` on
each)."""

from __future__ import annotations

import argparse
import errno
import math
import pickle
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .bench.ladder import FUSIONS
from .bench.results import DEFAULT_DIR
from .config import MODEL_SIZES, PRESETS
from .parallel.launch import DEFAULT_TIMEOUT_S
from .precision import available_policies

__all__ = ["main", "build_parser"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_number(text: str) -> float:
    """A learning rate or a number of seconds: positive and finite (0, inf and nan are not)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 3e-4, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number, got {text}")
    return value


SEED_LIMIT = 2**63  # torch seeds its generators with 64 bits and wraps negatives onto them


def _seed(text: str) -> int:
    """A seed torch and the data sampler take as it is: 0 <= seed < 2**63. (torch.manual_seed
    also takes -2**63 to 2**64 - 1, but -1 is the same seed as 2**64 - 1, and the sampler seeds
    its validation stream with seed + 1.)"""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {text!r}") from None
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected a seed from 0 to 2**63 - 1 = {SEED_LIMIT - 1}, got {text}"
        )
    return value


# A BPE vocabulary: the 256 bytes and the end-of-text token, plus at least one merge; at most
# 2**17, above GPT-2's 50,257 and Llama 3's 128,256 (a larger one takes minutes to train and
# gigabytes for the embedding alone).
VOCAB_RANGE = (258, 2**17)


def _vocab_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    low, high = VOCAB_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"a BPE vocabulary runs from {low} (the 256 bytes, the end-of-text token and one "
            f"merge) to {high:,}, got {value:,}; use --tokenizer bytes for 256 symbols"
        )
    return value


def _device(text: str) -> str:
    """cpu, cuda or cuda:N, refused here when this torch cannot use it."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "was built without CUDA" if torch.version.cuda is None else "sees no CUDA GPU"
            raise argparse.ArgumentTypeError(
                f"{text}: this torch ({torch.__version__}) {why}. Use --device cpu (or leave "
                "--device out), or install a CUDA build of torch on a machine with an NVIDIA GPU"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(
                f"{text}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}"
            )
    elif device.type != "cpu":
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_lib",
        description="Companion package of 'Fast Transformer Training on Hopper'.",
    )
    parser.add_argument("--version", action="version", version=f"tutorial_lib {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{info,train,bench,ntp-reproduce}"
    )

    info = sub.add_parser(
        "info", help="describe the device, its spec, the preset, FP8 and TE; is it workshop-ready?"
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument(
        "--strict", action="store_true", help="exit with status 1 when the machine is not ready"
    )

    train = sub.add_parser("train", help="train the preset's GPT on the byte-level corpus")
    train.add_argument("--preset", choices=list(PRESETS), help="default: $TUTORIAL_PRESET/auto")
    train.add_argument("--model", choices=list(MODEL_SIZES), help="override the preset's size")
    train.add_argument("--steps", type=_positive_int, help="total optimizer steps")
    train.add_argument("--batch-size", type=_positive_int, help="sequences per micro-batch")
    train.add_argument("--grad-accum", type=_positive_int, default=1)
    train.add_argument("--lr", type=_positive_number, help="peak learning rate (default: preset)")
    train.add_argument("--precision", default="fp32", help=f"one of {available_policies()}")
    train.add_argument(
        "--fp8-accumulation",
        choices=("exact", "hopper"),
        help="how an FP8 --precision's emulated GEMMs (on a CPU) are summed: exact (float32, the "
        "default) or hopper (as an H100's FP8 tensor cores sum them, fp8.mma; several times "
        "slower); a GPU's FP8 GEMMs sum as its hardware does. Recorded in the checkpoint",
    )
    train.add_argument(
        "--data",
        type=Path,
        help="a text file, or a folder: its text files, in sorted order (default: the Python "
        "standard library's .py files)",
    )
    train.add_argument(
        "--data-suffix",
        metavar="SUFFIX",
        help="read only the files of the --data folder whose names end in SUFFIX, e.g. .md",
    )
    train.add_argument("--out", type=Path, required=True, help="folder for checkpoint/metrics")
    train.add_argument("--seed", type=_seed, default=0, help="0 to 2**63 - 1 (default: 0)")
    train.add_argument("--device", type=_device, help="cpu or cuda (default: cuda if available)")
    train.add_argument("--checkpoint-every", type=int, default=0, metavar="N")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoint.pt or OUT/checkpoint/ (a sharded run's) if it exists, "
        "written at any layout; with both, the newer",
    )
    train.add_argument(
        "--force",
        action="store_true",
        help="start a new run in an OUT that holds a checkpoint (replaced at the first save)",
    )
    train.add_argument(
        "--new-data",
        action="store_true",
        help="with --resume: continue on another corpus or tokenizer than the checkpoint's",
    )
    train.add_argument(
        "--tokenizer",
        choices=("bytes", "bpe"),
        help="bytes (256 symbols) or a byte-level BPE trained on the corpus, saved as "
        "OUT/tokenizer.json and reused by --resume (default: the preset's)",
    )
    train.add_argument(
        "--vocab-size",
        type=_vocab_size,
        help=f"BPE vocabulary, {VOCAB_RANGE[0]} to {VOCAB_RANGE[1]:,} tokens; the model gets "
        "the tokens the corpus yields, padded to a multiple of 64 (default: the preset's)",
    )
    train.add_argument("--fused", action="store_true", help="our Triton kernels (chapter 7)")
    train.add_argument("--compile", action="store_true", help="torch.compile the training step")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument(
        "--tp",
        type=_positive_int,
        default=1,
        metavar="N",
        help="tensor-parallel degree; run under torchrun --nproc-per-node N",
    )
    train.add_argument(
        "--dp",
        type=_positive_int,
        default=None,
        metavar="N",
        help="data-parallel degree (--batch-size is the global batch); torchrun --nproc-per-node N",
    )
    train.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="with --tp: LayerNorms and residuals on sequence slices (T must divide by --tp)",
    )
    train.add_argument(
        "--vocab-parallel",
        action="store_true",
        help="with --tp: split the embedding, LM head and loss over the vocabulary",
    )
    train.add_argument(
        "--dp-mode",
        choices=("fsdp", "ddp"),
        default="fsdp",
        help="FSDP2 (shards parameters, gradients and optimizer state) or DDP (replicates them)",
    )
    train.add_argument(
        "--dist-timeout",
        type=_positive_number,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="under torchrun: a collective that waits this long fails (on gloo the error names "
        "the rank that stopped responding; on NCCL torch's watchdog ends the job) "
        f"(default: {DEFAULT_TIMEOUT_S:g})",
    )

    bench = sub.add_parser("bench", help="run a benchmark and record it (JSON + Markdown)")
    bench.add_argument(
        "--ladder", action="store_true", help="the ablation ladder, fp32 eager to FP8 (chapter 8)"
    )
    bench.add_argument("--preset", choices=list(PRESETS), help="default: $TUTORIAL_PRESET/auto")
    bench.add_argument(
        "--fusion",
        choices=FUSIONS,
        default="compile",
        help="the fusion rung 4 adds and rung 6 takes away",
    )
    bench.add_argument("--rungs", help="comma-separated rung numbers to run (default: all)")
    bench.add_argument("--steps", type=_positive_int, help="steps per rung (default: preset)")
    bench.add_argument("--batch-size", type=_positive_int, help="sequences per step")
    bench.add_argument(
        "--lr", type=_positive_number, help="learning rate (default: min(preset, 1e-3))"
    )
    bench.add_argument("--device", type=_device, help="cpu or cuda (default: cuda if available)")
    bench.add_argument("--out", type=Path, default=Path(DEFAULT_DIR), help="results folder")
    bench.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    ntp = sub.add_parser("ntp-reproduce", help="the NTP paper's failure figures, simulated")
    ntp.add_argument("--json", action="store_true", help="print JSON (keys: cluster.reproduce)")
    ntp.add_argument("--seed", type=_seed, default=0, help="0 to 2**63 - 1 (default: 0)")
    ntp.add_argument("--samples", type=_positive_int, default=32, help="Monte Carlo repetitions")
    ntp.add_argument("--quick", action="store_true", help="fewer points and one trace (tests)")
    ntp.add_argument(
        "--shard-split",
        choices=("whole", "even"),
        default="whole",
        help="how a degraded TP group splits a layer: whole heads, the busiest rank sets the pace "
        "(default), or evenly over the survivors, the paper's assumption (NTP then needs the "
        "paper's 16 spare domains, not 24)",
    )
    convert = sub.add_parser(
        "convert-checkpoint",
        help="move a delayed-scaling run between fp8 (FP8Linear) and te-fp8 (Transformer Engine)",
    )
    convert.add_argument("src", type=Path, help="a Trainer checkpoint (checkpoint.pt)")
    convert.add_argument("dst", type=Path, help="where to write the converted checkpoint")
    convert.add_argument(
        "--to", required=True, choices=("fp8", "te-fp8"), help="the precision to resume in"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from . import cli

    commands = {
        "info": cli.info,
        "train": cli.train,
        "bench": cli.bench,
        "ntp-reproduce": cli.ntp_reproduce,
        "convert-checkpoint": cli.convert_checkpoint,
    }
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BaseException as exc:  # BaseException: DCP's CheckpointException is one
        print(f"error: {_explain(exc)}", file=sys.stderr)
        return 1


_WRITE_FIX = "free some space, or write to another disk (--out)"
_OS_ERRORS = {  # errno: (what happened to the path, what to do)
    errno.ENOSPC: ("could not write {}: no space left (or file too large)", _WRITE_FIX),
    errno.EFBIG: ("could not write {}: no space left (or file too large)", _WRITE_FIX),
    errno.EDQUOT: ("could not write {}: disk quota exceeded", _WRITE_FIX),
    errno.EACCES: ("permission denied: {}", "check who may read or write it, or use another"),
    errno.EPERM: ("operation not permitted: {}", "check who may read or write it, or use another"),
    errno.EROFS: ("{} is on a read-only file system", "choose a path on a writable disk"),
    errno.ENOTDIR: ("{}: part of this path is a file where a folder is expected", "fix the path"),
    errno.EEXIST: ("{} is in the way: a file where a folder is expected", "use another path"),
    errno.EISDIR: ("{} is a folder where a file is expected", "give the file's path"),
    errno.ENOENT: ("no such file or folder: {}", "check the path"),
}
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")  # torch.save's errno-less errors


def _explain(exc: BaseException) -> str:
    """The one line ``main`` prints for ``exc``: the cause and the fix. An exception nobody
    foresaw (an internal check that failed among them) gets a second line: where its full
    traceback was saved."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else "no detail"
    if isinstance(exc, OSError) and exc.errno is not None:
        what, fix = _OS_ERRORS.get(exc.errno, (f"{exc.strerror or exc}: {{}}", "check the path"))
        where = exc.filename if exc.filename is not None else "a file"
        return f"{what.format(where)}: {fix}."
    if isinstance(exc, RuntimeError) and any(s in text for s in _TORCH_WRITE_FAILED):
        return f"could not write a file: no space left (or file too large) ({first}): {_WRITE_FIX}."
    if isinstance(exc, MemoryError) or "can't allocate memory" in text:  # the CPU's memory
        return f"out of memory ({first}): lower --batch-size, or train a smaller model."
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError: a GPU's
        return f"out of GPU memory ({first}): lower --batch-size, or train a smaller model."
    if isinstance(exc, ValueError | RuntimeError | OSError) and text:
        return text  # ours name the problem and the fix (CheckpointError is a ValueError)
    if isinstance(exc, KeyError) and exc.args and " " in str(exc.args[0]):  # not a bare key
        return str(exc.args[0])
    if isinstance(exc, EOFError | pickle.UnpicklingError):
        return (
            f"a file ended early or is corrupt ({type(exc).__name__}: {first}): if it is a "
            "checkpoint, restore it from a copy or start the run again with --force."
        )
    if type(exc).__name__ == "CheckpointException":  # torch.distributed.checkpoint's
        failures = list(getattr(exc, "failures", {}).items())
        if failures:
            rank, (cause, _) = failures[0]
            return f"the sharded checkpoint failed on rank {rank}: {_explain(cause)}"
    if "not compiled with CUDA" in text:
        return f"{first}: use --device cpu, or install a CUDA build of torch."
    if isinstance(exc, AttributeError) and first.startswith("module "):  # a library's version
        return (
            f"{first}: an installed package is a version tutorial_lib does not support; "
            "`python -m tutorial_lib info` names them; reinstall with `pip install -e .`."
        )
    if isinstance(exc, ImportError):
        return f"{first}: install it, or leave out the option that needs it."
    return f"unexpected {type(exc).__name__}: {first}\n{_save_traceback(exc)}"


def _save_traceback(exc: BaseException) -> str:
    """Write ``exc``'s full traceback to a new file in the temporary folder; say where."""
    report = "".join(traceback.format_exception(exc))
    try:
        fd, path = tempfile.mkstemp(prefix="tutorial_lib-traceback-", suffix=".txt")
        with open(fd, "w") as f:
            f.write(report)
    except OSError:
        return f"the full traceback (please include it in a bug report):\n{report}"
    return f"the full traceback is in {path} (please include it in a bug report)"


if __name__ == "__main__":
    sys.exit(main())
