"""A run's folder (``--out``): checked before the first step, one run at a time, nothing replaced
by surprise.

``RunFolder.open`` runs on rank 0 before anything is trained:

- it creates the folder and proves it writable by creating the lock, so a bad ``--out`` (a file,
  a folder without write permission) fails at once, not at the first checkpoint after hours;
- the lock (``.lock``: the process id and host of the run holding it, created with
  ``O_CREAT | O_EXCL`` so only one of two starting runs gets it) keeps a second run out. A lock
  whose process no longer runs on this host was left by a killed run: it is replaced, and said;
- it finishes what a crash interrupted (``run.settle``: a checkpoint half published is
  recovered, a half-written one deleted) and deletes the temporary files a killed run left;
- a folder that holds a checkpoint is refused to a run started without ``--resume``, unless
  ``--force`` says to start again over it (its checkpoint is replaced at the first save).

``latest`` is what ``--resume`` continues from: the newer of ``checkpoint.pt`` and the
``checkpoint/`` directory, by step.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from .files import load_checkpoint
from .run import RUN_FILE, settle

__all__ = ["LOCK_FILE", "RunFolder"]

LOCK_FILE = ".lock"
CHECKPOINTS = ("checkpoint.pt", "checkpoint")  # a file and a DCP directory (``run.py``)


class RunFolder:
    """The folder ``out`` of one run (module docstring)."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.lock = self.out / LOCK_FILE
        self._held = False

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
            for stale in sorted(self.out.glob("*.tmp")) + sorted(self.out.glob(".*.tmp")):
                if stale.is_file():  # a temporary file of a write that a kill interrupted
                    stale.unlink()
                    notes.append(f"deleted {stale}, left by an interrupted write")
            held = [self.out / name for name in CHECKPOINTS if (self.out / name).exists()]
            if held and not resume and not force:
                raise ValueError(
                    f"{held[0]} is the checkpoint of an earlier run. Continue it with --resume, "
                    "start again over it with --force (it is replaced at the first save), or "
                    "choose another --out."
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
        """Release the lock, if this process holds it."""
        if self._held:
            self.lock.unlink(missing_ok=True)
            self._held = False

    def _acquire(self) -> list[str]:
        """Create the lock; replace one left by a process that is gone. Returns what was done."""
        notes: list[str] = []
        mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
        for _ in range(2):  # a second try after removing a stale lock
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None:
                    raise ValueError(
                        f"Another run ({holder}) is using --out {self.out}. Wait for it to "
                        f"finish, or choose another --out; if no run uses it, delete {self.lock}."
                    ) from None
                self.lock.unlink(missing_ok=True)
                notes.append(f"replaced {self.lock}, left by a run that no longer runs")
                continue
            except OSError as exc:
                raise ValueError(
                    f"--out {self.out} is not writable ({exc.strerror}): choose a folder you can "
                    "write to."
                ) from None
            with os.fdopen(fd, "w") as f:
                f.write(mine)
            self._held = True
            return notes
        raise ValueError(f"Could not lock --out {self.out}: {self.lock} keeps reappearing.")

    def _holder(self) -> str | None:
        """Who holds the existing lock, in words; None if it is stale (its process is gone)."""
        try:
            info = json.loads(self.lock.read_text())
            pid, host = int(info["pid"]), str(info["host"])
        except (OSError, ValueError, KeyError, TypeError):  # unreadable: being written, or torn
            age = time.time() - self.lock.stat().st_mtime if self.lock.exists() else 1e9
            return None if age > 10 else f"lock {self.lock} being written"
        if host != socket.gethostname():
            return f"process {pid} on host {host}"  # cannot tell from here: assume it runs
        try:
            os.kill(pid, 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # it exists, under another user
        return f"process {pid}"
