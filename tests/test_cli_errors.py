"""Every failure of ``python -m tutorial_lib`` is one clear message and an exit status: a bad
argument is a usage error (2); a failure at run time is ``error: <cause>: <fix>`` (1), with the
traceback saved to a file only when nobody foresaw it; Ctrl-C exits with 130. Run in-process."""

from __future__ import annotations

import argparse
import errno
import pickle
import tempfile
import traceback
from pathlib import Path

import pytest
import torch
from cli_runner import ci_preset, run_main, train_argv  # noqa: F401 (the fixture)

from tutorial_lib import cli
from tutorial_lib.__main__ import SEED_LIMIT, VOCAB_RANGE, build_parser
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.config import PRESETS
from tutorial_lib.data import TokenData, load_corpus
from tutorial_lib.tokenizer import BPETokenizer, pad_vocab
from tutorial_lib.train import TrainConfig

pytestmark = pytest.mark.usefixtures("ci_preset")


_run = run_main


_train_args = train_argv


# ---- bad arguments: usage errors (exit status 2) -------------------------------------------


def test_device_cuda_without_cuda_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (so on a GPU machine too)
    code, _, err = _run(["train", "--device", "cuda", "--out", str(tmp_path)], capsys)
    assert code == 2 and "usage:" in err
    assert "argument --device: cuda: this torch" in err
    assert "Use --device cpu (or leave --device out), or install a CUDA build of torch" in err
    assert "Traceback" not in err and not any(tmp_path.iterdir())  # refused before anything
    code, _, err = _run(["bench", "--ladder", "--device", "gpu"], capsys)
    assert code == 2 and "argument --device: expected cpu, cuda or cuda:N, got 'gpu'" in err


@pytest.mark.parametrize("command", ["train", "bench"])
@pytest.mark.parametrize("lr", ["0", "-0.001", "inf", "nan", "fast"])
def test_lr_must_be_positive_and_finite(
    command: str, lr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run([command, "--lr", lr, "--out", "x"], capsys)
    assert code == 2 and "usage:" in err
    expected = (
        "expected a number such as 3e-4, got 'fast'"
        if lr == "fast"
        else f"argument --lr: expected a positive, finite number, got {lr}"
    )
    assert expected in err


def test_lr_zero_through_the_api_is_an_error_not_the_presets_rate() -> None:
    """``--lr 0`` used to become the preset's rate (``lr or preset.lr``)."""
    with pytest.raises(ValueError, match="Need lr > 0"):
        TrainConfig.from_preset(PRESETS["ci"], lr=0.0)
    assert TrainConfig.from_preset(PRESETS["ci"]).lr == PRESETS["ci"].lr


@pytest.mark.parametrize("command", ["train", "ntp-reproduce"])
@pytest.mark.parametrize("seed", ["-1", str(2**63), str(10**23), "1.5"])
def test_seed_outside_what_torch_takes_is_a_usage_error(
    command: str, seed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run([command, "--seed", seed, *(["--out", "x"] * (command == "train"))], capsys)
    assert code == 2 and "usage:" in err
    expected = (
        "expected an integer seed, got '1.5'"
        if seed == "1.5"
        else f"argument --seed: expected a seed from 0 to 2**63 - 1 = {2**63 - 1}, got {seed}"
    )
    assert expected in err


def test_the_largest_seed_seeds_torch_and_the_sampler() -> None:
    """The limit is real: seed and seed + 1 (the validation stream) both seed a generator."""
    args = build_parser().parse_args(["train", "--out", "x", "--seed", str(SEED_LIMIT - 1)])
    with torch.random.fork_rng():
        torch.manual_seed(args.seed)
    data = TokenData(torch.arange(64), torch.arange(64), block_size=8, seed=args.seed)
    assert data.get_batch("val", 2)[0].shape == (2, 8)
    with pytest.raises(ValueError, match="Overflow"):  # torch's largest: seed + 1 overflows
        TokenData(torch.arange(64), torch.arange(64), block_size=8, seed=2**64 - 1)


@pytest.mark.parametrize("vocab", [257, 2**17 + 1, 10**7])
def test_vocab_size_outside_its_range_is_a_usage_error(
    vocab: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(["train", "--vocab-size", str(vocab), "--out", "x"], capsys)
    assert code == 2 and "usage:" in err
    assert (
        f"argument --vocab-size: a BPE vocabulary runs from 258 (the 256 bytes, the end-of-text "
        f"token and one merge) to 131,072, got {vocab:,}; use --tokenizer bytes" in err
    )
    assert VOCAB_RANGE == (258, 131_072)
    assert build_parser().parse_args(["train", "--out", "x", "--vocab-size", "131072"])


# ---- the model's rows follow the tokens the BPE learned ------------------------------------


def test_bpe_rows_follow_the_tokens_learned_and_both_numbers_are_printed(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, asked = tmp_path / "run", "131072"  # 45 KB of text has far fewer pairs seen twice
    argv = _train_args(out, text_file, 1, "--tokenizer", "bpe", "--vocab-size", asked)
    code, stdout, err = _run(argv, capsys)
    assert code == 0, err
    learned = BPETokenizer.load(out).vocab_size
    assert 258 < learned < 131_072
    rows = pad_vocab(learned)
    assert (
        f"tokenizer: byte-level BPE, {learned} tokens of the 131072 asked (the corpus has no "
        f"more pairs seen twice); the model gets {rows} rows; saved as {out / 'tokenizer.json'}"
    ) in stdout
    assert load_checkpoint(out / "checkpoint.pt")["model_config"]["vocab_size"] == rows
    assert not (out / "tokenizer.rows.json").exists()  # tokenizer.json alone says the shape

    again = _train_args(out, text_file, 2, "--tokenizer", "bpe", "--vocab-size", asked)
    code, _, err = _run([*again, "--resume"], capsys)  # the same ask
    assert code == 1
    assert (
        f"error: --vocab-size 131072, but the run being resumed saved a tokenizer of {learned} "
        f"tokens ({out / 'tokenizer.json'}; a corpus can yield fewer than asked): drop "
        "--vocab-size to resume with it, or start a new run in another --out."
    ) in err
    code, stdout, err = _run(
        _train_args(out, text_file, 2, "--tokenizer", "bpe", "--resume"), capsys
    )
    assert code == 0, err
    assert "resumed from" in stdout and "at step 1" in stdout


# ---- --data: a folder's text files, or those ending in --data-suffix -----------------------


def _corpus_folder(root: Path) -> Path:
    for name, data in {
        "b.md": b"# notes\nmarkdown text\n",
        "a.txt": "plain text, caf\u00e9\n".encode(),
        "sub/c.py": b"print('code')\n",
        "model.bin": b"\x00\x01binary",
        "latin1.txt": "caf\u00e9".encode("latin-1"),  # not UTF-8
        ".hidden/notes.txt": b"hidden",
        "__pycache__/d.txt": b"cache",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_data_folder_reads_its_text_files_or_those_ending_in_the_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _corpus_folder(tmp_path / "corpus")
    texts = [b"plain text, caf\xc3\xa9\n", b"# notes\nmarkdown text\n", b"print('code')\n"]
    assert load_corpus(folder, max_bytes=None) == b"\n".join(texts)  # a.txt, b.md, sub/c.py
    assert load_corpus(folder, suffix=".md") == texts[1]

    for tokenizer in ("bytes", "bpe"):  # make_data and the BPE's training read the same corpus
        argv = _train_args(tmp_path / "r", folder, 1, "--data-suffix", ".rst")
        code, _, err = _run([*argv, "--tokenizer", tokenizer], capsys)
        assert code == 1
        assert (
            f"error: The corpus from {folder} is empty: no non-blank files ending in '.rst' "
            "found. Point --data (`path`) at a non-empty text file, or at a folder of text files "
            "(or change --data-suffix)."
        ) in err
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "weights.bin").write_bytes(b"\x00" * 100)
    code, _, err = _run(_train_args(tmp_path / "r2", binary, 1), capsys)
    assert code == 1
    assert f"error: The corpus from {binary} is empty: no non-blank text files found." in err
    code, _, err = _run(
        _train_args(tmp_path / "r3", folder / "a.txt", 1, "--data-suffix", ".md"), capsys
    )
    assert code == 1
    assert (
        f"error: A suffix ('.md', --data-suffix) picks the files of a corpus folder, but the "
        f"corpus is the file {folder / 'a.txt'}: pass a folder, or drop the suffix."
    ) in err


# ---- failures at run time: one line, exit status 1 -----------------------------------------


def _fail_with(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    """Make ``info`` raise ``exc``, as a command might."""

    def command(args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr(cli, "info", command)


def _dcp_failure(cause: BaseException) -> BaseException:
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("load", {0: (cause, traceback.StackSummary())})


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/runs/a/metrics.json"),
            "could not write /runs/a/metrics.json: no space left (or file too large): free some "
            "space, or write to another disk (--out).",
        ),
        (
            OSError(errno.EFBIG, "File too large", "/runs/a/checkpoint.pt"),
            "could not write /runs/a/checkpoint.pt: no space left (or file too large)",
        ),
        (
            RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 5381632 vs 5381524"
            ),
            "could not write a file: no space left (or file too large) ([enforce fail at "
            "inline_container.cc:672] . unexpected pos 5381632 vs 5381524): free some space",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/data/corpus.txt"),
            "permission denied: /data/corpus.txt: check who may read or write it, or use another.",
        ),
        (
            NotADirectoryError(errno.ENOTDIR, "Not a directory", "/runs/file/checkpoint.pt"),
            "/runs/file/checkpoint.pt: part of this path is a file where a folder is expected: "
            "fix the path.",
        ),
        (
            IsADirectoryError(errno.EISDIR, "Is a directory", "/runs/a/tokenizer.json"),
            "/runs/a/tokenizer.json is a folder where a file is expected: give the file's path.",
        ),
        (
            EOFError("Ran out of input"),
            "a file ended early or is corrupt (EOFError: Ran out of input): if it is a "
            "checkpoint, restore it from a copy or start the run again with --force.",
        ),
        (
            pickle.UnpicklingError("invalid load key, 'x'."),
            "a file ended early or is corrupt (UnpicklingError: invalid load key, 'x'.)",
        ),
        (
            _dcp_failure(FileNotFoundError(errno.ENOENT, "No such file", "/r/checkpoint/x.distcp")),
            "the sharded checkpoint failed on rank 0: no such file or folder: "
            "/r/checkpoint/x.distcp: check the path.",
        ),
        (
            AttributeError("module 'torch' has no attribute 'float8_e4m3fn'"),
            "module 'torch' has no attribute 'float8_e4m3fn': an installed package is a version "
            "tutorial_lib does not support",
        ),
        (
            AssertionError("Torch not compiled with CUDA enabled"),
            "Torch not compiled with CUDA enabled: use --device cpu, or install a CUDA build of "
            "torch.",
        ),
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 82 GB"),
            "out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate "
            "82 GB): lower --batch-size, or train a smaller model.",
        ),
        (
            KeyError("Unknown model size 'huge'. Available: tiny, small."),
            "Unknown model size 'huge'. Available: tiny, small.",
        ),
        (
            ModuleNotFoundError("No module named 'triton'"),
            "No module named 'triton': install it, or leave out the option that needs it.",
        ),
        (ValueError("Our own message: the problem and the fix."), "Our own message"),
    ],
    ids=(
        "ENOSPC EFBIG torch-unexpected-pos EACCES ENOTDIR EISDIR EOFError UnpicklingError "
        "CheckpointException AttributeError-module AssertionError-cuda cpu-out-of-memory "
        "KeyError-message ImportError ValueError"
    ).split(),
)
def test_foreseen_failures_are_one_line_with_the_fix(
    exc: BaseException,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _fail_with(monkeypatch, exc)
    code, _, err = _run(["info"], capsys)
    assert code == 1
    assert err.startswith(f"error: {message}"), err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())  # no traceback


@pytest.mark.parametrize(
    ("exc", "first_line"),
    [
        (
            ZeroDivisionError("division by zero"),
            "error: unexpected ZeroDivisionError: division by zero",
        ),
        (
            AssertionError("found is not None"),
            "error: unexpected AssertionError: found is not None",
        ),
        (
            AttributeError("'NoneType' object has no attribute 'step'"),
            "error: unexpected AttributeError: 'NoneType'",
        ),
        (KeyError("model"), "error: unexpected KeyError: 'model'"),
    ],
    ids=["ZeroDivisionError", "AssertionError", "AttributeError", "KeyError"],
)
def test_unforeseen_failures_save_their_traceback(
    exc: BaseException,
    first_line: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _fail_with(monkeypatch, exc)
    code, _, err = _run(["info"], capsys)
    assert code == 1
    first, second = err.strip().splitlines()
    assert first.startswith(first_line), err
    (saved,) = tmp_path.glob("tutorial_lib-traceback-*.txt")
    assert second == f"the full traceback is in {saved} (please include it in a bug report)"
    report = saved.read_text()
    assert report.startswith("Traceback (most recent call last):") and "in command" in report


def test_ctrl_c_exits_130_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fail_with(monkeypatch, KeyboardInterrupt())
    code, _, err = _run(["info"], capsys)
    assert (code, err) == (130, "error: interrupted (Ctrl-C)\n")


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),  # what a file object raises
        # torch's own word for a short write (a file over `ulimit -f` gives exactly this)
        RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 5381632 vs 5381524"
        ),
    ],
    ids=["ENOSPC", "torch-unexpected-pos"],
)
def test_a_full_disk_at_the_checkpoint_names_it_and_leaves_no_temporary_file(
    failure: Exception,
    tmp_path: Path,
    text_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def full_disk(obj: object, f: object, *args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "run"
    code, _, err = _run(_train_args(out, text_file, 1), capsys)
    assert code == 1
    assert err == (
        f"error: could not write {out / 'checkpoint.pt'}: no space left (or file too large): "
        "free some space, or write to another disk (--out).\n"
    )
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))
    assert not (out / "metrics.json").exists()  # nothing claims a finished run
