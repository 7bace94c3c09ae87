"""``python tests/crash_run.py FORM FAULT SAVE -- ARGV...``: ``python -m tutorial_lib ARGV``, killed
(``os._exit(137)``, as by ``kill -9``: no cleanup runs) at one point of its SAVE-th checkpoint
save. Fault injection for ``tests/test_checkpoint_safety.py``; it lives in the tests, not in the
package.

FORM: ``file`` (``checkpoint.pt``) or ``sharded`` (the DCP directory, written from one process).
FAULT, in the order a save reaches them:

- ``mid-file``: a file of the save is half written (the temporary checkpoint file, or the first
  ``.distcp`` shard), then the process dies;
- ``after-temp-write``: everything is written (the temporary file; the ``.tmp`` directory with
  its ``run.pt``), nothing renamed yet;
- ``after-rename-1``: the first rename is done (the file: into place; the directory: the current
  checkpoint moved aside to ``.old``);
- ``after-rename-2``: the directory's second rename is done (``.tmp`` into place), ``.old`` not
  yet deleted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import torch

from tutorial_lib import train as train_module
from tutorial_lib.__main__ import main
from tutorial_lib.parallel.mesh import ParallelDims

KILLED = 137


def _die() -> None:
    sys.stdout.flush()
    os._exit(KILLED)


def arm(form: str, fault: str, save: int) -> None:
    """Patch this process so that it dies at ``fault`` of its ``save``-th checkpoint save."""
    if form == "sharded":
        mock.patch.object(ParallelDims, "sharded", True).start()
    saves = [0]
    real_save_run, real_replace, real_fsync = train_module.save_run, os.replace, os.fsync

    def counting_save_run(*args: object, **kwargs: object) -> Path:
        saves[0] += 1
        return real_save_run(*args, **kwargs)  # type: ignore[arg-type]

    def armed() -> bool:
        return saves[0] == save

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        shard = name.endswith(".distcp") if form == "sharded" else ".checkpoint.pt." in name
        if armed() and fault == "mid-file" and shard:
            os.ftruncate(fd, os.fstat(fd).st_size // 2)
            _die()
        real_fsync(fd)

    renames = [0]

    def replace(src: str | Path, dst: str | Path) -> None:
        ours = Path(dst).name in ("checkpoint.pt", "checkpoint", "checkpoint.old")
        if armed() and ours and fault == "after-temp-write":
            _die()
        real_replace(src, dst)
        renames[0] += ours and armed()
        if fault == f"after-rename-{renames[0]}" and ours and armed():
            _die()

    mock.patch.object(train_module, "save_run", counting_save_run).start()
    mock.patch.object(os, "fsync", fsync).start()
    mock.patch.object(os, "replace", replace).start()


if __name__ == "__main__":
    form, fault, save, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: crash_run.py FORM FAULT SAVE -- ARGV..."
    torch.set_num_threads(1)  # as in the tests' process (conftest): the same float sums
    arm(form, fault, int(save))
    code = main(argv)
    print(f"the fault {fault!r} was never reached", file=sys.stderr)
    sys.exit(3 if code == 0 else code)
