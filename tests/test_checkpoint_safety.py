"""Nothing lost, nothing silently wrong: checkpoints under crashes and damage, data tied to its
checkpoint, and run folders (``checkpoint.files``, ``checkpoint.run``, ``checkpoint.folder``).

The fault battery kills ``python -m tutorial_lib train`` (``tests/crash_run.py``) at each step of
a save, in both checkpoint forms, and checks that ``--resume`` continues from the last complete
step and ends bit for bit where an uninterrupted run ends.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from cli_runner import ci_preset  # noqa: F401 (the fixture)

from tutorial_lib.__main__ import main
from tutorial_lib.build import build_model
from tutorial_lib.checkpoint.files import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    state_digest,
)
from tutorial_lib.checkpoint.folder import LOCK_FILE, RunFolder
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.parallel.mesh import ParallelDims
from tutorial_lib.train import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY = 6, 2  # saves at steps 2, 4 and 6; the faults hit the second


pytestmark = pytest.mark.usefixtures("ci_preset")


def _args(out: Path, data: Path, *extra: str, steps: int = STEPS) -> list[str]:
    return [
        "train", "--preset", "ci", "--steps", str(steps), "--batch-size", "2", "--data", str(data),
        "--out", str(out), "--device", "cpu", "--no-progress", "--checkpoint-every", str(EVERY),
        *extra,
    ]  # fmt: skip


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], form: str = "file") -> tuple:
    """``main(argv)`` in this process (the sharded form written from one process): its exit
    status, stdout and stderr."""
    with mock.patch.object(ParallelDims, "sharded", form == "sharded"):
        code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _final(out: Path, form: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The run's losses (metrics.json) and its last checkpoint's model weights (a sharded one
    loaded into a model of the run's shape)."""
    losses = [row["loss"] for row in json.loads((out / "metrics.json").read_text())]
    if form == "file":
        return losses, load_checkpoint(out / "checkpoint.pt")["model"]
    run = load_checkpoint(out / "checkpoint" / "run.pt")
    cfg = GPTConfig(**run["model_config"])
    data = TokenData(torch.zeros(4 * cfg.block_size, dtype=torch.uint8), torch.zeros(
        4 * cfg.block_size, dtype=torch.uint8), cfg.block_size)  # fmt: skip
    trainer = Trainer(build_model(cfg), data, TrainConfig(**run["train_config"]), device="cpu")
    trainer.resume(out / "checkpoint", new_data=True)  # only the weights are wanted here
    return losses, trainer.model.state_dict()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, corpus_file: Path) -> dict[str, Any]:
    """Each form's run of STEPS steps without a fault."""
    runs = {}
    for form in ("file", "sharded"):
        out = tmp_path_factory.mktemp(f"straight-{form}")
        with mock.patch.object(ParallelDims, "sharded", form == "sharded"):
            assert main(_args(out, corpus_file)) == 0
        runs[form] = _final(out, form)
    return runs


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox {i * i}\n" for i in range(1500)))
    return path


# (form, fault, the step --resume continues from, what the start tidies)
FAULTS = [
    ("file", "mid-file", 2, "deleted"),
    ("file", "after-temp-write", 4, "recovered"),
    ("file", "after-rename-1", 4, None),
    ("sharded", "mid-file", 2, "deleted checkpoint.tmp"),
    ("sharded", "after-temp-write", 4, "recovered checkpoint.tmp"),
    ("sharded", "after-rename-1", 4, "recovered checkpoint.tmp"),
    ("sharded", "after-rename-2", 4, None),
]


@pytest.mark.parametrize(("form", "fault", "step", "tidied"), FAULTS)
def test_a_kill_at_any_point_of_a_save_resumes_bit_for_bit(
    tmp_path: Path,
    corpus_file: Path,
    uninterrupted: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    form: str,
    fault: str,
    step: int,
    tidied: str | None,
) -> None:
    out = tmp_path / "run"
    crash = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "crash_run.py"), form, fault, "2", "--",
         *_args(out, corpus_file)],
        env={**os.environ, "TUTORIAL_PRESET": "ci"}, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert crash.returncode == 137, crash.stderr  # killed where the fault was armed
    assert (out / LOCK_FILE).exists()  # the killed run's lock, left behind
    code, stdout, err = _run(_args(out, corpus_file, "--resume"), capsys, form)
    assert code == 0, err
    assert f"resumed from {out / ('checkpoint' if form == 'sharded' else 'checkpoint.pt')} " \
        f"at step {step}" in stdout  # fmt: skip
    assert "left by a run that no longer runs" in stdout  # the stale lock, replaced
    if tidied:
        assert tidied in stdout
    assert not (out / LOCK_FILE).exists()  # released at the end
    losses, weights = _final(out, form)
    want_losses, want_weights = uninterrupted[form]
    assert losses == want_losses  # bit for bit
    for name, value in want_weights.items():
        assert torch.equal(weights[name], value), name
    leftovers = {p.name for p in out.iterdir()} - {"checkpoint.pt", "checkpoint", "metrics.json"}
    assert not leftovers


# ---- integrity -----------------------------------------------------------------------------
def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "step": 7,
        "model": {
            "w": torch.randn(33, 17, generator=g),
            "b": torch.randn(17, generator=g).bfloat16(),
        },
        "optimizer": {"lr": 3e-4, "betas": (0.9, 0.95), "state": {0: torch.ones(5)}},
        "history": [{"loss": 2.5, "val_loss": None}],
    }


def test_a_flipped_byte_anywhere_in_a_checkpoint_file_is_refused_or_changes_nothing(
    tmp_path: Path,
) -> None:
    """Every byte that carries content is covered: a flipped one is refused. A few bytes of the
    zip container carry none (timestamps, alignment padding); flipping those loads exactly the
    saved state, never a different one."""
    good = save_checkpoint(tmp_path / "good.pt", _state()).read_bytes()
    want = state_digest(_state())
    weights = _state()["model"]["w"].numpy().tobytes()
    inside = good.find(weights)
    assert inside > 0
    rng = random.Random(0)
    offsets = [inside + len(weights) // 2] + rng.sample(range(len(good)), 150)
    refused = 0
    for offset in offsets:
        bad = bytearray(good)
        bad[offset] ^= 1 << rng.randrange(8)
        path = tmp_path / "bad.pt"
        path.write_bytes(bytes(bad))
        try:
            state = load_checkpoint(path)
        except CheckpointError as err:  # corrupt, or a damaged name it will not unpickle
            assert "bad.pt" in str(err)
            refused += 1
            continue
        assert offset != offsets[0], "a flipped weight loaded"
        assert state_digest(state) == want, f"byte {offset} changed the content silently"
    assert refused > len(offsets) // 2


def test_a_damaged_sharded_checkpoint_is_refused_naming_the_file(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert _run(_args(out, corpus_file, steps=2), capsys, "sharded")[0] == 0
    shards = out / "checkpoint" / "shards"
    distcp = sorted(shards.glob("*.distcp"))[0]
    pristine = {f: f.read_bytes() for f in shards.iterdir()}
    rng = random.Random(0)
    damages = {
        "flipped": lambda f: f.write_bytes(_flip(pristine[f], rng)),
        "truncated": lambda f: f.write_bytes(pristine[f][: len(pristine[f]) // 2]),
        "deleted": lambda f: f.unlink(),
    }
    for what, damage in damages.items():
        for victim in (distcp, shards / ".metadata"):
            damage(victim)
            code, _, err = _run(_args(out, corpus_file, "--resume", steps=3), capsys, "sharded")
            problem = "is missing" if what == "deleted" else "is corrupt"
            assert code == 1 and f"error: {victim} {problem}" in err, (what, err)
            assert "Traceback" not in err
            victim.write_bytes(pristine[victim])
    code, stdout, err = _run(_args(out, corpus_file, "--resume", steps=3), capsys, "sharded")
    assert code == 0 and "at step 2" in stdout, err  # restored: it resumes


def _flip(data: bytes, rng: random.Random) -> bytes:
    bad = bytearray(data)
    bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
    return bytes(bad)


def test_a_flipped_weight_in_a_run_is_refused_at_resume(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert _run(_args(out, corpus_file, steps=2), capsys)[0] == 0
    path = out / "checkpoint.pt"
    model = load_checkpoint(path)["model"]
    weight = max(model.values(), key=lambda t: t.numel()).numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = bytes(data).find(weight) + 101
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    code, _, err = _run(_args(out, corpus_file, "--resume", steps=3), capsys)
    assert code == 1
    assert f"error: {path} is corrupt: its content does not match the checksum" in err


# ---- the data a checkpoint was trained on --------------------------------------------------
def test_resuming_on_another_tokenizer_or_corpus_is_refused_unless_asked(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    bpe = ("--tokenizer", "bpe", "--vocab-size", "320")
    assert _run(_args(out, corpus_file, *bpe, steps=2), capsys)[0] == 0
    tok = out / "tokenizer.json"
    original = tok.read_text()
    spec = json.loads(original)
    vocab = spec["model"]["vocab"]
    a, b = "a", "b"
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two token ids swapped
    tok.write_text(json.dumps(spec))
    code, _, err = _run(_args(out, corpus_file, "--resume", *bpe, steps=3), capsys)
    assert code == 1 and "trained with another tokenizer than this run's" in err, err
    assert "--new-data" in err
    tok.unlink()  # and another corpus: a new tokenizer is trained on it
    other = tmp_path / "other.txt"
    other.write_text("".join(f"{i} jumps over the lazy dog\n" for i in range(1500)))
    code, _, err = _run(_args(out, other, "--resume", *bpe, steps=3), capsys)
    assert code == 1 and "trained with another tokenizer" in err, err
    assert not tok.exists()  # the refused run saved nothing in the run's place
    tok.write_text(original)  # the run's own tokenizer restored, on another corpus
    code, _, err = _run(_args(out, other, "--resume", *bpe, steps=3), capsys)
    assert code == 1 and "trained with another corpus than this run's" in err, err
    code, stdout, err = _run(_args(out, other, "--resume", "--new-data", *bpe, steps=3), capsys)
    assert code == 0 and "at step 2" in stdout, err  # asked for explicitly
    assert tok.read_text() == original


def test_out_inside_the_data_folder_is_refused(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "corpus.txt").write_text(corpus_file.read_text())
    code, _, err = _run(_args(tmp_path / "run", tmp_path), capsys)
    assert code == 1
    assert f"error: --out {tmp_path / 'run'} is inside --data {tmp_path}" in err
    assert not (tmp_path / "run").exists()


# ---- run folders ---------------------------------------------------------------------------
def test_a_new_run_over_a_checkpoint_is_refused_and_force_starts_again(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert _run(_args(out, corpus_file, steps=4), capsys)[0] == 0
    before = (out / "checkpoint.pt").read_bytes()
    code, _, err = _run(_args(out, corpus_file, steps=2), capsys)
    assert code == 1
    assert "is the checkpoint of an earlier run. Continue it with --resume" in err
    assert "--force" in err
    assert (out / "checkpoint.pt").read_bytes() == before  # untouched
    assert not (out / LOCK_FILE).exists()
    code, stdout, err = _run(_args(out, corpus_file, "--force", steps=2), capsys, "sharded")
    assert code == 0, err
    assert f"moved the earlier run's files to {out / 'previous'}" in stdout
    assert (out / "previous" / "checkpoint.pt").read_bytes() == before  # kept, aside
    code, stdout, err = _run(_args(out, corpus_file, "--resume", steps=3), capsys, "sharded")
    assert code == 0 and f"resumed from {out / 'checkpoint'} at step 2" in stdout, err
    code, _, err = _run(_args(out, corpus_file, "--resume", "--force"), capsys)
    assert code == 1 and "error: --force starts a new run" in err and "choose one" in err


def test_one_run_per_folder_and_a_stale_lock_is_replaced(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(  # another run: it holds the lock
        [sys.executable, "-c", HOLD_LOCK, str(out / LOCK_FILE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, _, err = _run(_args(out, corpus_file, steps=2), capsys)
        assert code == 1
        assert f"error: Another run (process {holder.pid} on " in err
        assert f"is using --out {out}" in err
    finally:
        holder.kill()
        holder.wait()
    code, stdout, err = _run(_args(out, corpus_file, steps=2), capsys)  # its process is gone
    assert code == 0, err
    assert f"replaced {out / LOCK_FILE}, left by a run that no longer runs (process " in stdout
    folder = RunFolder(out)
    folder.open(resume=True)
    with pytest.raises(ValueError, match=f"Another run \\(process {os.getpid()} on "):
        RunFolder(out).open(resume=True)  # two runs at once: the second is refused
    folder.close()
    assert not (out / LOCK_FILE).exists()


HOLD_LOCK = """
import fcntl, json, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "host": os.uname().nodename}).encode())
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("a-file", "is a file (or under one): pass a folder."),
        ("/sys/tutorial_lib_run", "cannot be created ("),  # not permitted, denied, read-only
        ("/sys", "is not writable ("),
    ],
)
def test_a_bad_out_fails_before_the_first_step(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str], where: str,
    message: str,
) -> None:  # fmt: skip
    out = tmp_path / where if where == "a-file" else Path(where)
    if where == "a-file":
        out.write_text("not a folder")
    with mock.patch("tutorial_lib.cli._train") as trains:
        code, _, err = _run(_args(out, corpus_file), capsys)
    assert code == 1 and f"error: --out {out} {message}" in err, err
    trains.assert_not_called()  # nothing was built or trained


def test_stale_temporary_files_are_cleaned_on_start(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    (out / "checkpoint.tmp" / "shards").mkdir(parents=True)  # a directory save that died
    (out / ".checkpoint.pt.x1y2.tmp").write_bytes(b"PK half")  # a file save that died
    (out / "tokenizer.json.tmp").write_text("{")
    code, stdout, err = _run(_args(out, corpus_file, steps=2), capsys)
    assert code == 0, err
    assert "deleted checkpoint.tmp, the half-written checkpoint" in stdout
    assert f"deleted {out / '.checkpoint.pt.x1y2.tmp'}" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "metrics.json"]
    assert (out / "checkpoint.pt").stat().st_mode & 0o044  # as open() makes files, not private


def test_a_damaged_checkpoint_left_by_a_crash_is_set_aside_not_published(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert _run(_args(out, corpus_file, steps=2), capsys, "sharded")[0] == 0
    shutil.copytree(out / "checkpoint", out / "checkpoint.tmp")  # complete, then damaged
    shard = sorted((out / "checkpoint.tmp" / "shards").glob("*.distcp"))[0]
    shard.write_bytes(_flip(shard.read_bytes(), random.Random(1)))
    code, stdout, err = _run(_args(out, corpus_file, "--resume", steps=3), capsys, "sharded")
    assert code == 0, err
    assert "set checkpoint.tmp aside as checkpoint.damaged, kept for inspection" in stdout
    assert f"resumed from {out / 'checkpoint'} at step 2" in stdout  # the last good one


def test_a_checkpoint_that_is_not_a_dict_is_refused(
    tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    torch.save([1, 2, 3], out / "checkpoint.pt")
    code, _, err = _run(_args(out, corpus_file, "--resume"), capsys)
    assert code == 1
    assert f"error: {out / 'checkpoint.pt'} holds a list, not a checkpoint" in err
    assert "Traceback" not in err
