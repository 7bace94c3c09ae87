"""``python tests/stop_rank.py RANK STEP -- ARGV...``: ``python -m tutorial_lib ARGV``, in which
the process of torchrun rank RANK stops itself (SIGSTOP, as ``kill -STOP`` or a debugger would:
alive, holding its sockets, answering nothing) as it begins training step STEP (0: the first).
Fault injection for ``tests/test_hung_rank.py``; it lives in the tests, not in the package."""

from __future__ import annotations

import os
import signal
import sys
from unittest import mock

from tutorial_lib.__main__ import main
from tutorial_lib.train import Trainer


def arm(rank: int, step: int) -> None:
    """Patch this process so that, if it is ``rank``, it stops as it begins step ``step``."""
    real_train_step = Trainer.train_step

    def train_step(self: Trainer) -> dict[str, float | None]:
        if self.step == step and int(os.environ["RANK"]) == rank:
            os.kill(os.getpid(), signal.SIGSTOP)
        return real_train_step(self)

    mock.patch.object(Trainer, "train_step", train_step).start()


if __name__ == "__main__":
    rank, step, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: stop_rank.py RANK STEP -- ARGV..."
    arm(int(rank), int(step))
    sys.exit(main(argv))
