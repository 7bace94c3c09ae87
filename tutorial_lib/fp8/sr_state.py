"""The stochastic-rounding generator of an ``FP8Linear`` (NVFP4 rounds gradients stochastically):
seeded per layer, saved in the state dict, and restored so that a resumed run draws the same
noise as an uninterrupted one."""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import torch

__all__ = ["SR_STATE_KEY", "StochasticRoundingState"]

SR_STATE_KEY = "fp8_sr_rng_state"  # state-dict entry of the stochastic-rounding generator


class StochasticRoundingState:
    """Mixin for an ``nn.Module`` (before it in the bases): ``sr_generator(device)`` and the
    state-dict entry ``fp8_sr_rng_state`` (``SR_STATE_KEY``). The module calls
    ``_init_sr_state()`` in ``__init__`` and names itself through ``_layer_name()``; loading a
    state dict takes the entry before the other bases load the rest."""

    _sr_generator: torch.Generator | None
    _sr_pending: torch.Tensor | None

    def _init_sr_state(self) -> None:
        self._sr_generator = None
        self._sr_pending = None  # a loaded state, set on the next generator

    def _layer_name(self) -> str:
        raise NotImplementedError

    def sr_generator(self, device: torch.device | str) -> torch.Generator:
        """The layer's stochastic-rounding generator on ``device``, created on first use, seeded
        with this run's torch seed mixed with the layer's name (so layers draw different noise
        and a rerun with the same seed draws the same). Moving to another device reseeds it from
        a draw of the old one, so the stream stays reproducible."""
        device = torch.device(device)
        gen = self._sr_generator
        if gen is not None and gen.device.type == device.type:
            return gen
        new = torch.Generator(device=device)
        state = self._sr_pending
        if state is not None:  # a checkpoint's state: the stream continues
            self._sr_pending = None
            try:
                new.set_state(state)
            except (RuntimeError, TypeError, ValueError):
                seed = zlib.crc32(state.numpy().tobytes())
                new.manual_seed(seed)
                warnings.warn(
                    f"{self._layer_name()}: the checkpoint's stochastic-rounding state is for "
                    f"another device type than {device.type}; the stream restarts from a seed "
                    "taken from that state (deterministic, but not the uninterrupted stream).",
                    RuntimeWarning,
                    stacklevel=2,
                )
        elif gen is None:
            name = zlib.crc32(self._layer_name().encode())
            new.manual_seed((torch.initial_seed() * 0x9E3779B1 + name) % (1 << 63))
        else:
            draw = torch.randint(1 << 62, (1,), generator=gen, device=gen.device)
            new.manual_seed(int(draw))
        self._sr_generator = new
        return new

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)  # type: ignore[misc]
        if self._sr_generator is not None:
            destination[prefix + SR_STATE_KEY] = self._sr_generator.get_state()
        elif self._sr_pending is not None:  # loaded, not used yet: keep it
            destination[prefix + SR_STATE_KEY] = self._sr_pending.clone()

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """A saved stochastic-rounding state waits for the layer's next draw: it is set on a
        generator of the device the layer then runs on (``sr_generator``), so a checkpoint
        loads on the CPU before the model moves to its GPU."""
        state = state_dict.get(prefix + SR_STATE_KEY)
        if isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.dim() == 1:
            self._sr_pending = state.detach().to("cpu").clone()
            self._sr_generator = None
        elif state is not None:
            error_msgs.append(
                f"{prefix}{SR_STATE_KEY}: a generator state is a 1-D uint8 tensor, got "
                f"{type(state).__name__} {getattr(state, 'dtype', '')}."
            )
        args = (state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys)
        super()._load_from_state_dict(*args, error_msgs)  # type: ignore[misc]
        if prefix + SR_STATE_KEY in unexpected_keys:  # not a buffer: taken here
            unexpected_keys.remove(prefix + SR_STATE_KEY)
