"""A run's folder (``--out``): checked before the first step, one run at a time, nothing replaced
by surprise.

``RunFolder.open`` runs on rank 0 before anything is trained:

- it creates the folder and proves it writable by creating the lock, so a bad ``--out`` (a file,
  a folder without write permission) fails at once, not at the first checkpoint after hours;
- the lock: ``.lock``, held with ``flock`` (a lock the kernel releases when its process ends,
  however it ends), records the process id and host of the run. A second run is refused, naming
  it; a ``.lock`` left by a killed run is not held, so it is taken over, and said;
- it finishes what a crash interrupted: a sharded checkpoint half published is recovered
  (``run.settle``); a complete temporary checkpoint file newer than ``checkpoint.pt`` (written,
  synced and verified, not yet renamed) is renamed into place, a half-written one deleted, as
  are other temporary files of killed writes;
- a folder that holds a checkpoint is refused to a run started without ``--resume``, unless
  ``--force`` says to start again: the earlier run's files then move to ``previous/``.

``latest`` is what ``--resume`` continues from: the newer of ``checkpoint.pt`` and the
``checkpoint/`` directory, by step.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from pathlib import Path

from .files import CheckpointError, load_checkpoint
from .run import RUN_FILE, settle

__all__ = ["LOCK_FILE", "RunFolder"]

LOCK_FILE = ".lock"
CHECKPOINTS = ("checkpoint.pt", "checkpoint")  # a file and a DCP directory (``run.py``)
RUN_FILES = (*CHECKPOINTS, "metrics.json", "tokenizer.json")  # what --force moves aside


class RunFolder:
    """The folder ``out`` of one run (module docstring)."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.lock = self.out / LOCK_FILE
        self._fd: int | None = None

    def open(self, resume: bool, force: bool = False) -> list[str]:
        """Create, lock and tidy the folder; refuse one holding a checkpoint unless ``resume``
        or ``force``. Returns what was done to the folder, in words."""
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ValueError(f"--out {self.out} is a file (or under one): pass a folder.") from None
        except OSError as exc:
            raise ValueError(
                f"--out {self.out} cannot be created ({exc.strerror}): choose a folder you can "
                "write to."
            ) from None
        notes = self._acquire()
        try:
            notes += [f"{self.out}: {note}" for note in settle(self.out / "checkpoint")]
            notes += self._tidy_files()
            held = [self.out / name for name in CHECKPOINTS if (self.out / name).exists()]
            if held and force:
                notes.append(self._move_aside())
            elif held and not resume:
                raise ValueError(
                    f"{held[0]} is the checkpoint of an earlier run. Continue it with --resume, "
                    "start again with --force (the earlier run's files move to "
                    f"{self.out / 'previous'}), or choose another --out."
                )
        except BaseException:
            self.close()
            raise
        return notes

    def latest(self) -> Path | None:
        """The checkpoint ``--resume`` continues from: the one with the most steps (the file on
        a tie); None if the folder holds none."""
        found = [self.out / name for name in CHECKPOINTS if (self.out / name).exists()]
        if not found:
            return None

        def step(path: Path) -> int:
            return int(load_checkpoint(path / RUN_FILE if path.is_dir() else path).get("step", 0))

        return max(found, key=step)  # max keeps the first of equals

    def close(self) -> None:
        """Release the lock, if this process holds it (its file goes while still held)."""
        if self._fd is not None:
            self.lock.unlink(missing_ok=True)
            os.close(self._fd)  # closing releases the flock
            self._fd = None

    def _acquire(self) -> list[str]:
        """Hold ``.lock``; refuse if another process holds it. Returns what was done."""
        while True:
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_RDWR, 0o644)
            except OSError as exc:
                raise ValueError(
                    f"--out {self.out} is not writable ({exc.strerror}): choose a folder you can "
                    "write to."
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode(errors="replace")
                os.close(fd)
                raise ValueError(
                    f"Another run ({_describe(holder)}) is using --out {self.out}. Wait for it to "
                    "finish, or choose another --out."
                ) from None
            try:  # the file we hold must still be the one at the path (a closing run unlinks it)
                same = os.stat(self.lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        left = os.read(fd, 4096).decode(errors="replace")
        os.ftruncate(fd, 0)
        mine = {"pid": os.getpid(), "host": socket.gethostname()}
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        self._fd = fd
        if left.strip():  # a lock file nobody held: its run was killed
            return [f"replaced {self.lock}, left by a run that no longer runs ({_describe(left)})"]
        return []

    def _tidy_files(self) -> list[str]:
        """Temporary files of killed writes: a complete, verified checkpoint file newer than
        ``checkpoint.pt`` is renamed into place; every other one is deleted."""
        notes, target = [], self.out / "checkpoint.pt"
        for temp in sorted(self.out.glob(".checkpoint.pt.*.tmp")):
            step, current = _step(temp), _step(target)
            if step is not None and (current is None or step > current):
                os.replace(temp, target)
                notes.append(f"recovered {temp} (step {step}), written but not yet renamed")
        for stale in sorted(self.out.glob("*.tmp")) + sorted(self.out.glob(".*.tmp")):
            if stale.is_file():
                stale.unlink()
                notes.append(f"deleted {stale}, left by an interrupted write")
        return notes

    def _move_aside(self) -> str:
        """``--force``: the earlier run's files into ``previous/`` (an older one there goes)."""
        previous = self.out / "previous"
        if previous.exists():
            shutil.rmtree(previous)
        previous.mkdir()
        for name in RUN_FILES:
            if (self.out / name).exists():
                os.replace(self.out / name, previous / name)
        return f"moved the earlier run's files to {previous} (--force); delete it when done"


def _step(path: Path) -> int | None:
    """The step of the checkpoint file ``path``; None if there is none, or it does not verify."""
    try:
        return int(load_checkpoint(path)["step"]) if path.is_file() else None
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None


def _describe(lock_text: str) -> str:
    """A lock file's content in words: the process and host that wrote it."""
    try:
        info = json.loads(lock_text)
        return f"process {int(info['pid'])} on {info['host']}"
    except (ValueError, KeyError, TypeError):
        return "a process that left no details"
