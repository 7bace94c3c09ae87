"""Sharded checkpoints (``checkpoint.run``'s DCP form, ``checkpoint.dcp``) in one process: a
round trip that continues the run, an atomic directory, and refusals of what could run code.
The multi-rank cases (dp 2 to one process and back) are in ``tests/test_data_parallel.py``."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from tutorial_lib.build import build_model
from tutorial_lib.checkpoint.dcp import SafeLoadPlanner
from tutorial_lib.checkpoint.files import (
    CheckpointError,
    file_sha256,
    load_checkpoint,
    save_checkpoint,
)
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import TokenData
from tutorial_lib.parallel.mesh import ParallelDims
from tutorial_lib.train import TrainConfig, Trainer

CFG = GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _trainer(seed: int = 0) -> Trainer:
    tokens = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(0))
    data = TokenData(tokens[:2700].to(torch.uint8), tokens[2700:].to(torch.uint8), 16, seed=0)
    cfg = TrainConfig(steps=4, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=0, progress=False)
    return Trainer(build_model(CFG, device="cpu", seed=seed), data, cfg, device="cpu")


def save_sharded(trainer: Trainer, path: Path) -> Path:
    """The DCP form, from one process (whose layout would write a file)."""
    with mock.patch.object(ParallelDims, "sharded", True):
        return trainer.save(path)


def load_sharded(trainer: Trainer, path: Path) -> None:
    trainer.resume(path)


def test_a_sharded_checkpoint_continues_the_run(tmp_path: Path) -> None:
    straight = _trainer()
    straight.train()
    first = _trainer()
    first.train(2)
    (tmp_path / "ckpt.tmp").mkdir()  # what a save that died halfway leaves
    (tmp_path / "ckpt.tmp" / "junk").write_text("x")
    path = save_sharded(first, tmp_path / "ckpt")
    assert sorted(p.name for p in path.iterdir()) == ["run.pt", "shards"]
    assert not (tmp_path / "ckpt.tmp").exists()
    second = _trainer(seed=1)  # other weights: the checkpoint replaces them
    load_sharded(second, path)
    assert second.step == 2
    second.train()
    assert [r["loss"] for r in second.history] == [r["loss"] for r in straight.history]
    resumed = second.model.state_dict()
    for name, value in straight.model.state_dict().items():
        assert torch.equal(resumed[name], value), name


def test_a_save_before_the_first_step_changes_nothing(tmp_path: Path) -> None:
    """torch's get_state_dict creates missing optimizer state with an lr=0 step (AdamW's step
    count 1); saving at step 0 must not change the run, nor resuming from that checkpoint."""
    straight = _trainer()
    straight.train()
    saved = _trainer()
    path = save_sharded(saved, tmp_path / "step0")
    assert not saved.optimizer.state  # still lazy
    saved.train()
    resumed = _trainer(seed=1)
    load_sharded(resumed, path)
    assert not resumed.optimizer.state
    resumed.train()
    want = [r["loss"] for r in straight.history]
    assert [r["loss"] for r in saved.history] == want
    assert [r["loss"] for r in resumed.history] == want


def _crafted(path: Path) -> None:
    """Record the SHA-256 of the checkpoint's files as they are now: what someone who crafts a
    checkpoint can do (its checksums catch damage, not intent), so the safe reader must hold."""
    run = load_checkpoint(path / "run.pt")
    run["files"] = {f.name: file_sha256(f) for f in (path / "shards").iterdir()}
    save_checkpoint(path / "run.pt", run)


def test_a_shard_path_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    path = save_sharded(_trainer(), tmp_path / "ckpt")
    meta = path / "shards" / ".metadata"
    metadata = pickle.loads(meta.read_bytes())
    for bad in ("/etc/passwd", "../elsewhere.distcp"):
        for info in metadata.storage_data.values():
            info.relative_path = bad
        meta.write_bytes(pickle.dumps(metadata))
        with pytest.raises(CheckpointError, match=r"\.metadata is corrupt"):  # damage
            load_sharded(_trainer(), path)
        _crafted(path)
        with pytest.raises(CheckpointError, match="outside the checkpoint's directory"):
            load_sharded(_trainer(), path)


def test_a_missing_or_foreign_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a sharded checkpoint"):
        load_sharded(_trainer(), tmp_path)
    path = save_sharded(_trainer(), tmp_path / "ckpt")
    other = Trainer(
        build_model(GPTConfig(vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=32)),
        _trainer().data,
        _trainer().cfg,
        device="cpu",
    )
    with pytest.raises(ValueError, match="model config differs"):
        load_sharded(other, path)


class _RunsCode:
    """A pickle that would create a file when unpickled: what a crafted checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))


def test_crafted_metadata_or_values_do_not_run(tmp_path: Path) -> None:
    path = save_sharded(_trainer(), tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    (path / "shards" / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    _crafted(path)
    with pytest.raises(CheckpointError, match=r"names posix\.mkdir.*refusing to unpickle"):
        load_sharded(_trainer(), path)
    assert not marker.exists()
    planner = SafeLoadPlanner()
    planner.state_dict, planner.flatten_state_dict = {}, False
    item = ReadItem(LoadItemType.BYTE_IO, MetadataIndex("x"), (), MetadataIndex("x"), (), ())
    with pytest.raises(CheckpointError, match="Refusing to load 'x'"):
        planner.load_bytes(item, io.BytesIO(_torch_saved(_RunsCode(marker))))
    assert not marker.exists()
    planner.load_bytes(item, io.BytesIO(_torch_saved({"lr": 1e-3, "betas": (0.9, 0.95)})))
    assert planner.state_dict["x"] == {"lr": 1e-3, "betas": (0.9, 0.95)}


def _torch_saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()
