"""Checkpoints, in one place: ``run`` is the design (a file when one process holds the whole
state, a DCP directory when it is sharded, and one loader for both at any layout); ``files``
writes files atomically and opens them without running code from them; ``dcp`` is what a sharded
checkpoint needs from ``torch.distributed.checkpoint`` (a safe reader, and each rank's state as
pieces of the full tensors). ``convert_checkpoint_file`` moves a run between ``fp8`` and
``te-fp8``: a tool beside the design.
"""

from .files import (
    convert_checkpoint_file,
    load_checkpoint,
    load_model_state_dict,
    model_state_dict,
)
from .run import (
    CHECKPOINT_FORMAT,
    checkpoint_name,
    load_run,
    save_run,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "checkpoint_name",
    "convert_checkpoint_file",
    "load_checkpoint",
    "load_model_state_dict",
    "load_run",
    "model_state_dict",
    "save_run",
]
