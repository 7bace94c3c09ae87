"""The commands of ``python -m tutorial_lib`` (``__main__`` parses the arguments): ``info``, the
machine and the book's readiness; ``train``, a run from its arguments (one process, or this
rank's place in ``--dp`` x ``--tp`` under torchrun), resumed, trained, reported; ``bench``, the
ablation ladder; ``ntp-reproduce``; ``convert-checkpoint``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from datetime import timedelta

import torch

from . import __version__
from .checkpoint.folder import RunFolder
from .config import GPTConfig, RunPreset, get_preset
from .data import load_corpus, make_data, train_split_bytes
from .hardware import default_device, describe_device, fp8_gemm_status, te_available
from .parallel.launch import init_from_env, watch_ranks
from .parallel.mesh import check_layout, groups_2d, local_rows
from .precision import available_policies
from .runs import parallel_trainer
from .tokenizer import TOKENIZER_FILE, BPETokenizer, train_bpe
from .train import TrainConfig

__all__ = ["bench", "convert_checkpoint", "info", "ntp_reproduce", "train"]


def convert_checkpoint(args: argparse.Namespace) -> int:
    from .checkpoint import convert_checkpoint_file

    path = convert_checkpoint_file(args.src, args.dst, args.to)
    train = f"python -m tutorial_lib train --precision {args.to}"
    if path.name == "checkpoint.pt":
        print(f"wrote {path}; resume it with: {train} --out {path.parent} --resume")
    else:
        print(
            f"wrote {path}; to resume it, save it as DIR/checkpoint.pt and run: "
            f"{train} --out DIR --resume"
        )
    return 0


def info(args: argparse.Namespace) -> int:
    from .readiness import check_readiness, format_readiness

    dev = describe_device()
    try:
        preset: RunPreset | None = get_preset()
        preset_why = ""
    except ValueError as exc:  # a bad TUTORIAL_PRESET: report it below instead of failing
        preset, preset_why = None, str(exc)
    fp8_ok, fp8_why = fp8_gemm_status()
    te_ok, te_why = te_available()
    host = describe_device("cpu")
    assert host.cpu is not None
    report = {
        "tutorial_lib": __version__,
        "torch": torch.__version__,
        "device": dev.summary(),
        "cpu": {
            "name": host.name,
            "matrix_instructions": host.cpu.features,
            "torch_kernels": host.cpu.torch_isa,
            "bf16_matrix": host.cpu.bf16_matrix,
        },
        "spec": None
        if dev.spec is None
        else {
            "name": dev.spec.name,
            "peak_tflops": {k: v / 1e12 for k, v in dev.spec.peak_flops.items()},
            "hbm_tb_s": dev.spec.hbm_bandwidth / 1e12,
            "source": dev.spec.source,
        },
        "preset": None if preset is None else preset.name,
        "precision_policies": available_policies(),
        "fp8_gemms": {"available": fp8_ok, "reason": fp8_why},
        "transformer_engine": {"available": te_ok, "reason": te_why},
    }
    ready = check_readiness()
    status = 1 if args.strict and not ready.ready else 0
    if args.json:
        report["readiness"] = ready.to_dict()
        print(json.dumps(report, indent=2))
        return status
    print(f"tutorial_lib {__version__}, torch {torch.__version__}")
    print(f"device:  {report['device']}")
    if dev.type != "cpu":  # on a CPU device the line above already says it
        print(f"cpu:     {host.name}; {host.cpu.summary()}")
    if dev.spec is None:
        print("spec:    not in the spec table -> MFU is reported as unavailable")
    else:
        peaks = ", ".join(f"{k} {v / 1e12:.0f}" for k, v in dev.spec.peak_flops.items())
        hbm_tb_s = dev.spec.hbm_bandwidth / 1e12
        print(f"spec:    {dev.spec.name}: peak TFLOP/s {peaks}; HBM {hbm_tb_s} TB/s")
    if preset is None:
        print(f"preset:  none ({preset_why})")
    else:
        print(f"preset:  {preset.name} (model {preset.model}, {preset.steps} steps)")
    print(f"precision policies: {', '.join(available_policies())}")
    print(f"FP8 GEMMs: {'yes' if fp8_ok else 'no'} ({fp8_why})")
    print(f"Transformer Engine: {'yes' if te_ok else 'no'} ({te_why})")
    print()
    print(format_readiness(ready))
    return status


def _rung_numbers(text: str, count: int) -> list[int]:
    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"--rungs takes comma-separated numbers, e.g. 1,3,4; got {text!r}."
        ) from None
    bad = [n for n in numbers if not 1 <= n <= count]
    if bad or not numbers:
        raise ValueError(f"--rungs: rung numbers run from 1 to {count}; got {text!r}.")
    return numbers


def bench(args: argparse.Namespace) -> int:
    if not args.ladder:
        raise ValueError(
            "Choose a benchmark: --ladder (the others are scripts: benchmarks/precision.py, "
            "benchmarks/fp8.py, benchmarks/fusion.py)."
        )
    from .bench import environment_stamp, write_and_print
    from .bench.ladder import ladder_meta, ladder_rungs, ladder_table, run_ladder

    preset = get_preset(args.preset)
    rungs = ladder_rungs(args.fusion)
    if args.rungs:
        rungs = [rungs[n - 1] for n in _rung_numbers(args.rungs, len(rungs))]
    device = default_device(args.device)
    rows = run_ladder(
        preset,
        device,
        rungs,
        steps=args.steps,
        batch=args.batch_size,
        lr=args.lr,
        progress=not args.no_progress,
    )
    env = {**environment_stamp(device), "preset": preset.name}
    meta = {
        **ladder_meta(preset, rows),
        "fusion": args.fusion,
        "losses": {r["rung"]: r.get("losses") for r in rows},
    }
    table = ladder_table(rows)
    write_and_print("ladder", f"ablation ladder, preset {preset.name}", table, args.out, meta, env)
    return 0


def ntp_reproduce(args: argparse.Namespace) -> int:
    from .cluster.replica_cost import TrainingJob
    from .cluster.report import format_report
    from .cluster.reproduce import ntp_reproduce

    job = TrainingJob.paper(shard_split=args.shard_split)
    report = ntp_reproduce(seed=args.seed, samples=args.samples, quick=args.quick, job=job)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def train(args: argparse.Namespace) -> int:
    """``python -m tutorial_lib train``: open ``--out`` (``RunFolder``: checked, locked, tidied;
    rank 0), build the run from the parsed arguments (one process, or this rank's place in
    ``--dp`` x ``--tp`` under torchrun), resume with ``--resume``, train, and on rank 0 write
    ``metrics.json`` and report."""

    if (
        args.data is not None
        and args.data.is_dir()
        and args.out.resolve().is_relative_to(args.data.resolve())
    ):
        raise ValueError(
            f"--out {args.out} is inside --data {args.data}: the run's own files would become "
            "training data. Put --out outside the corpus folder."
        )
    if args.force and args.resume:
        raise ValueError(
            "--force starts a new run (the earlier one moves to OUT/previous/) and --resume "
            "continues the earlier one: choose one of them."
        )
    if args.fp8_accumulation is not None:  # the FP8 policy that sums so (refused for others)
        from .fp8.policy import fp8_policy_name

        args.precision = fp8_policy_name(args.precision, args.fp8_accumulation)
    folder = RunFolder(args.out)
    if int(os.environ.get("RANK", "0")) == 0:  # before anything is written or trained
        for note in folder.open(resume=args.resume, force=args.force):
            print(note)
    try:
        return _train(args, folder)
    finally:
        folder.close()


def _train(args: argparse.Namespace, folder: RunFolder) -> int:
    preset = get_preset(args.preset)
    # A named size gets its vocabulary from the tokenizer below (bytes: 256 rows).
    model_cfg = (
        preset.model_config()
        if args.model is None
        else GPTConfig.from_name(args.model, vocab_size=256)
    )
    cfg = TrainConfig.from_preset(
        preset,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        grad_accum=args.grad_accum,
        checkpoint_every=args.checkpoint_every,
        precision=args.precision,
        seed=args.seed,
        progress=not args.no_progress,
    )
    tokenizer, trained = _tokenizer(args, preset)
    if tokenizer is not None:  # the rows of the tokens it learned, padded
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.padded_vocab_size)
    elif model_cfg.vocab_size != 256:  # a BPE preset trained --tokenizer bytes
        model_cfg = dataclasses.replace(model_cfg, vocab_size=256)
    block, suffix = model_cfg.block_size, args.data_suffix
    data = make_data(block, args.data, seed=args.seed, tokenizer=tokenizer, suffix=suffix)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.dp is None:  # torchrun with N processes: data parallelism over what --tp leaves
        args.dp = max(1, world // args.tp) if world > 1 else 1
    elif args.dp == 1 and args.tp == 1 and world > 1:
        raise ValueError(
            f"--dp 1 with {world} processes: each would train alone into the same --out. Drop "
            f"--dp (all {world} processes then train together) or start one process."
        )
    if (args.sequence_parallel or args.vocab_parallel) and args.tp == 1:
        raise ValueError(
            "--sequence-parallel and --vocab-parallel split over the tensor-parallel ranks: "
            "use them with --tp 2 or more under torchrun."
        )
    groups, device = (None, None, None), default_device(args.device)  # one process
    if args.dp * args.tp > 1:  # torchrun: one process per (data-parallel, tensor-parallel) rank
        check_layout(args.dp, args.tp, world, model_cfg)
        local_rows(cfg.batch_size, args.dp, 0)  # a batch that does not split: the error, first
        cpu = args.device is not None and torch.device(args.device).type == "cpu"
        joined = init_from_env("gloo" if cpu else None, args.dist_timeout)  # NCCL on GPUs
        timeout = timedelta(seconds=args.dist_timeout)  # each group needs it: not inherited
        found = groups_2d(args.dp, args.tp, range(world), timeout=timeout)
        assert found is not None  # every process takes part
        groups, device = found, torch.device(args.device) if args.device else joined
    trainer = parallel_trainer(
        model_cfg,
        data,
        cfg,
        groups,
        args.dp_mode,
        device=device,
        fused=args.fused,
        compile=args.compile,
        out_dir=args.out,
        seed=args.seed,
        sequence_parallel=args.sequence_parallel,
        vocab_parallel=args.vocab_parallel,
    )
    ckpt = trainer.checkpoint_path
    latest = folder.latest() if args.resume else None
    if latest is not None:
        trainer.resume(latest, new_data=args.new_data)
        print(f"resumed from {latest} at step {trainer.step}")
    elif args.resume and trainer.parallel.is_rank0:
        print(f"--resume: no checkpoint in {args.out}; starting at step 0")
    if trained is not None and trainer.parallel.is_rank0:  # only now: a refused resume keeps
        trained.save(args.out / TOKENIZER_FILE)  # the run's own tokenizer.json
    if args.dp * args.tp > 1:  # a rank that stops responding ends the run, named
        with watch_ranks(trainer.step, args.dist_timeout) as on_step:
            history = trainer.train(on_step=on_step)
    else:
        history = trainer.train()
    if not trainer.parallel.is_rank0:
        return 0  # only rank 0 writes files and reports
    metrics = args.out / "metrics.json"
    metrics.with_name(".metrics.json.tmp").write_text(json.dumps(history, indent=1))
    metrics.with_name(".metrics.json.tmp").replace(metrics)  # atomically, as checkpoints are
    last = history[-1] if history else None
    if last is not None:
        print(
            f"step {trainer.step}: loss {last['loss']:.4f}, "
            f"{last['tokens_per_s']:,.0f} tokens/s on {describe_device(trainer.device).name}; "
            f"wrote {ckpt} and {args.out / 'metrics.json'}"
        )
    return 0


def _tokenizer(
    args: argparse.Namespace, preset: RunPreset
) -> tuple[BPETokenizer | None, BPETokenizer | None]:
    """(the tokenizer, the same if it was trained now and is to be saved once the run has
    started). None for bytes; for BPE, OUT/tokenizer.json when resuming a run that saved one,
    else one trained on the corpus's training split (the same on every rank: training is
    deterministic)."""
    name = args.tokenizer or preset.tokenizer
    if name == "bytes":
        if args.vocab_size is not None:
            raise ValueError("--vocab-size sets the BPE vocabulary: use it with --tokenizer bpe.")
        return None, None
    saved = args.out / TOKENIZER_FILE
    if args.resume and saved.exists():
        tokenizer = BPETokenizer.load(saved)
        if args.vocab_size is not None and args.vocab_size != tokenizer.vocab_size:
            raise ValueError(
                f"--vocab-size {args.vocab_size}, but the run being resumed saved a tokenizer of "
                f"{tokenizer.vocab_size} tokens ({saved}; a corpus can yield fewer than asked): "
                "drop --vocab-size to resume with it, or start a new run in another --out."
            )
        return tokenizer, None
    vocab = args.vocab_size or preset.bpe_vocab
    corpus = load_corpus(args.data, suffix=args.data_suffix)
    tokenizer = train_bpe(train_split_bytes(corpus), vocab)
    if int(os.environ.get("RANK", "0")) == 0:
        learned = f"{tokenizer.vocab_size} tokens"
        if tokenizer.vocab_size < vocab:  # too few pairs seen twice for the merges asked for
            learned += f" of the {vocab} asked (the corpus has no more pairs seen twice)"
        print(
            f"tokenizer: byte-level BPE, {learned}; the model gets "
            f"{tokenizer.padded_vocab_size} rows; saved as {saved} once the run starts"
        )
    return tokenizer, tokenizer
