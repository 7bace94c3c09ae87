"""Command line: ``python -m tutorial_lib {info,train,bench,ntp-reproduce} ...`` (``--help`` on
each)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .bench.ladder import FUSIONS
from .bench.results import DEFAULT_DIR
from .config import MODEL_SIZES, PRESETS
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
    train.add_argument("--lr", type=float, help="peak learning rate")
    train.add_argument("--precision", default="fp32", help=f"one of {available_policies()}")
    train.add_argument("--data", type=Path, help="text file or folder (default: Python stdlib)")
    train.add_argument("--out", type=Path, required=True, help="folder for checkpoint/metrics")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    train.add_argument("--checkpoint-every", type=int, default=0, metavar="N")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoint.pt or OUT/checkpoint/ (a sharded run's) if it exists, "
        "written at any layout; with both, the newer",
    )
    train.add_argument(
        "--tokenizer",
        choices=("bytes", "bpe"),
        help="bytes (256 symbols) or a byte-level BPE trained on the corpus, saved as "
        "OUT/tokenizer.json and reused by --resume (default: the preset's)",
    )
    train.add_argument(
        "--vocab-size", type=_positive_int, help="BPE vocabulary (default: the preset's)"
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
    bench.add_argument("--lr", type=float, help="learning rate (default: min(preset, 1e-3))")
    bench.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    bench.add_argument("--out", type=Path, default=Path(DEFAULT_DIR), help="results folder")
    bench.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    ntp = sub.add_parser("ntp-reproduce", help="the NTP paper's failure figures, simulated")
    ntp.add_argument("--json", action="store_true", help="print JSON (keys: cluster.reproduce)")
    ntp.add_argument("--seed", type=int, default=0)
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
    except (ValueError, FileNotFoundError, RuntimeError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
