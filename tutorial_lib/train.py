"""The training loop: AdamW, warm-up + cosine schedule, accumulation, clipping, eval, checkpoints.

Everything a step does, in order: sample micro-batches -> forward under the precision policy ->
backward (scaled for FP16) -> unscale, clip the gradient norm -> optimizer step -> metrics
(loss, lr, tokens/s, MFU, peak memory) -> progress bar -> periodic validation and checkpoint.

Checkpoints are written atomically (temporary file, fsync, rename) and hold the model, optimizer,
schedule, data-sampler and RNG state, so a resumed run reproduces the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .build import ModelRecipe, build_model, recipe_of
from .checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model_state_dict,
    model_state_dict,
    save_checkpoint,
)
from .config import GPTConfig, get_preset
from .data import TokenData, make_data, preset_data
from .hardware import describe_device
from .model import GPT
from .perf import mfu, peak_memory_bytes, phase, reset_peak_memory, synchronize
from .precision import PrecisionPolicy, get_policy
from .train_config import TrainConfig, lr_at

__all__ = [
    "TrainConfig",
    "lr_at",
    "NonFiniteLossError",
    "Trainer",
    "StepCallback",
    "run_training",
    "save_checkpoint",
    "load_checkpoint",
    "CheckpointError",
]


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss (or, without loss scaling, gradient norm);
    the step was not applied and the last good checkpoint was left in place."""

    def __init__(
        self, step: int, loss: float, checkpoint: Path | None, grad_norm: float | None = None
    ) -> None:
        kept = f"The last good checkpoint is {checkpoint}." if checkpoint else "No checkpoint."
        what = (
            f"loss ({loss})"
            if not math.isfinite(loss)
            else f"gradient norm ({grad_norm}, loss {loss})"
        )
        super().__init__(
            f"Non-finite {what} at step {step}. {kept} Try a lower learning rate, "
            "gradient clipping, or a wider-range precision (bf16 instead of fp16)."
        )
        self.step, self.loss, self.checkpoint = step, loss, checkpoint
        self.grad_norm = grad_norm


def _eager(compiled: bool) -> contextlib.AbstractContextManager[None]:
    """Run a compiled model eagerly: evaluation in eval mode would otherwise compile again."""
    if compiled:
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _check_recipe(model: torch.nn.Module, precision: str, policy: PrecisionPolicy) -> ModelRecipe:
    """The model's ``ModelRecipe``, checked against the precision the Trainer will run."""
    recipe = recipe_of(model)
    if recipe is None:  # built by hand: fine unless the precision needs other layers
        if policy.prepare_model is not None:
            raise ValueError(
                f"Precision {precision!r} trains a model with other Linear layers, and this one "
                f"was built without them. Build it with tutorial_lib.build_model(cfg, "
                f"precision={precision!r}) and pass that to the Trainer."
            )
        return ModelRecipe(precision=precision)
    if recipe.precision != precision:
        raise ValueError(
            f"The model was built for precision {recipe.precision!r} but TrainConfig.precision "
            f"is {precision!r}. Build it with build_model(cfg, precision={precision!r}), or "
            f"train it with TrainConfig(precision={recipe.precision!r})."
        )
    return recipe


StepCallback = Callable[["Trainer", dict[str, float | None]], None]


class Trainer:
    """Trains a ``GPT`` on a ``TokenData`` stream; ``history`` holds one dict of metrics per step."""

    def __init__(
        self,
        model: GPT,
        data: TokenData,
        cfg: TrainConfig,
        device: torch.device | str | None = None,
        out_dir: str | Path | None = None,
    ) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"Device {self.device} was requested, but this torch ({torch.__version__}) sees "
                "no CUDA GPU. Use device='cpu', or install a CUDA build of torch (README)."
            )
        self.policy: PrecisionPolicy = get_policy(cfg.precision, self.device)
        self.recipe = _check_recipe(model, cfg.precision, self.policy)
        self.cfg, self.data = cfg, data
        torch.manual_seed(cfg.seed)
        self.model = model.to(self.device)
        self._first_compiled_step: int | None = None  # the step that paid for compilation
        self.optimizer = self._make_optimizer()
        self.scaler = self.policy.make_grad_scaler(self.device)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.step = 0
        self.history: list[dict[str, float | None]] = []
        self.last_checkpoint: Path | None = None
        info = describe_device(self.device)
        self._spec = info.spec
        self._flops_per_token = model.flops_per_token(training=True, seq_len=data.block_size)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings
        no_decay = [p for p in params if p.dim() < 2]  # biases and LayerNorm gains
        groups = [
            {"params": decay, "weight_decay": self.cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        betas = (self.cfg.beta1, self.cfg.beta2)
        try:  # fused: one kernel for the whole update (CUDA, and CPU in recent torch)
            return torch.optim.AdamW(groups, lr=self.cfg.lr, betas=betas, fused=True)
        except (RuntimeError, TypeError):  # no fused kernel: foreach beats the per-tensor loop
            return torch.optim.AdamW(groups, lr=self.cfg.lr, betas=betas, foreach=True)

    def _param_order(self) -> list[str]:
        """Parameter names in the optimizer's index order (its groups, in order): how a sharded
        trainer keys the optimizer state of the single-process checkpoint format."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]

    @property
    def compile_time_s(self) -> float | None:
        """With ``compile``: the first compiled step's time minus the median of the steps after
        it (None without ``compile`` or before two steps)."""
        first = self._first_compiled_step
        if first is None:
            return None
        rows = {int(r["step"]): float(r["step_time_s"]) for r in self.history}  # type: ignore[arg-type]
        later = sorted(t for k, t in rows.items() if k > first)
        if first not in rows or not later:
            return None
        return max(0.0, rows[first] - later[len(later) // 2])

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.cfg.grad_accum * self.data.block_size

    # ---- one step ----------------------------------------------------------------------------
    def train_step(self) -> dict[str, float | None]:
        """One optimizer step over ``grad_accum`` micro-batches; returns its metrics."""
        cfg, step = self.cfg, self.step
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        reset_peak_memory(self.device)
        synchronize(self.device)
        t0 = time.perf_counter()
        total_loss = torch.zeros((), device=self.device)
        with self.policy.matmul_settings():
            for _ in range(cfg.grad_accum):  # the phases show in profiler traces (perf.trace)
                with phase("forward", self.device):
                    x, y = self._batch("train")
                    with self.policy.autocast(self.device):
                        _, loss = self._forward(x, y)
                    loss = loss / cfg.grad_accum
                    total_loss += loss.detach()
                with phase("backward", self.device):
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
            with phase("optimizer", self.device):
                loss_value, norm_value = self._optimizer_step(step, total_loss)
        synchronize(self.device)
        dt = time.perf_counter() - t0
        tps = self.tokens_per_step / dt
        if self.recipe.compile and self._first_compiled_step is None:
            self._first_compiled_step = step  # tracing + compiling + one step
        self.step += 1
        return {
            "step": step,
            "loss": loss_value,
            "lr": lr,
            "grad_norm": norm_value,
            "step_time_s": dt,
            "tokens_per_s": tps,
            "mfu": mfu(tps, self._flops_per_token, self._spec, self.policy.peak_dtype),
            "peak_mem_bytes": float(peak_memory_bytes(self.device)),
            "val_loss": None,
        }

    def _optimizer_step(self, step: int, total_loss: torch.Tensor) -> tuple[float, float]:
        """Unscale, clip, check for NaN, step, zero the gradients; (loss, gradient norm)."""
        cfg = self.cfg
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip_grad_norm(cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        loss_value = self._mean_over_ranks(total_loss).item()  # synchronises
        norm_value = float(grad_norm)
        # Without a scaler (which skips such steps) one NaN gradient would turn every weight
        # into NaN, clipping included, before the loss shows it: stop here instead.
        if not math.isfinite(loss_value) or (self.scaler is None and not math.isfinite(norm_value)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(step, loss_value, self.last_checkpoint, norm_value)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_value, norm_value

    # ---- what a parallel trainer overrides (parallel.launch.TPTrainer, parallel.dp.DPTrainer)
    def _batch(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's micro-batch: the whole ``cfg.batch_size`` here; a data-parallel rank
        takes its share of the same global batch."""
        return self.data.get_batch(split, self.cfg.batch_size, self.device)

    def _forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's forward pass (a DDP trainer calls its wrapper, which syncs gradients)."""
        return self.model(x, y)

    def _mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """A per-process metric made global (data parallelism averages it over the ranks)."""
        return value

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to ``max_norm`` and return their norm before clipping (a
        tensor-parallel trainer overrides this: its norm spans every rank's shards)."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    @torch.no_grad()
    def evaluate(self, iters: int | None = None) -> float:
        """Mean validation loss over ``iters`` random batches (default ``cfg.eval_iters``)."""
        self.model.eval()
        losses = []
        with self.policy.matmul_settings():
            for _ in range(iters or self.cfg.eval_iters):
                x, y = self._batch("val")
                with self.policy.autocast(self.device), _eager(self.recipe.compile):
                    _, loss = self._forward(x, y)
                losses.append(self._mean_over_ranks(loss.detach()).item())
        self.model.train()
        return sum(losses) / len(losses)

    # ---- the loop ----------------------------------------------------------------------------
    def train(
        self, steps: int | None = None, on_step: StepCallback | None = None
    ) -> list[dict[str, float | None]]:
        """Run until ``steps`` (default ``cfg.steps``) optimizer steps have been taken in total.

        ``on_step(trainer, row)`` is called after each step with that step's metrics, e.g. to
        record a layer's FP8 scales as training goes (``fp8.ScaleTrace``)."""
        target = steps if steps is not None else self.cfg.steps
        bar = tqdm(
            total=target,
            initial=self.step,
            disable=not self.cfg.progress,
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        try:
            while self.step < target:
                row = self.train_step()
                done = self.step
                # Evaluate on the schedule and at the configured end (not at an intermediate
                # `train(n)` target, so a stop-and-resume run matches an uninterrupted one).
                end = self.cfg.steps
                if self.cfg.eval_every and (done % self.cfg.eval_every == 0 or done == end):
                    row["val_loss"] = self.evaluate()
                self.history.append(row)
                if on_step is not None:
                    on_step(self, row)
                bar.update(1)
                bar.set_postfix(
                    loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:,.0f}", refresh=False
                )
                every = self.cfg.checkpoint_every
                if self.out_dir is not None and ((every and done % every == 0) or done == target):
                    self.write_checkpoint(self.out_dir / self.checkpoint_name)
        finally:
            bar.close()
        return self.history

    # ---- checkpoints -------------------------------------------------------------------------
    # What train() writes to out_dir: one file by ``save``, unless parallel.dcp's
    # ``use_sharded_checkpoints`` makes it a DCP directory (every rank writes its own shards).
    checkpoint_name = "checkpoint.pt"

    def write_checkpoint(self, path: Path) -> Path:
        return self.save(path)

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.run_state(),
            "model": model_state_dict(self.model),  # TE's FP8 state without pickle
            "optimizer": self.optimizer.state_dict(),
        }

    def run_state(self) -> dict[str, Any]:
        """Everything a checkpoint holds except the model and the optimizer state: step,
        configs, loss scaler, schedule, RNG, sampler and history (a sharded checkpoint keeps the
        weights apart: ``parallel.dcp``)."""
        return {
            "format": "tutorial_lib.checkpoint/1",
            "step": self.step,
            "model_config": dataclasses.asdict(self.model.config),
            "train_config": dataclasses.asdict(self.cfg),
            "model_recipe": dataclasses.asdict(self.recipe),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "schedule": {"step": self.step, "lr": lr_at(self.step, self.cfg)},
            "rng": _rng_state(),
            "data": self.data.state_dict(),
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_compatible(state)
        self._load_model_and_optimizer(state["model"], state["optimizer"])
        self.load_run_state(state)

    def check_compatible(self, state: dict[str, Any]) -> None:
        """A ValueError unless ``state`` is a checkpoint of this model in this precision."""
        if state.get("format") != "tutorial_lib.checkpoint/1":
            raise ValueError("Not a tutorial_lib checkpoint (missing or unknown 'format').")
        if state["model_config"] != dataclasses.asdict(self.model.config):
            raise ValueError(
                "Checkpoint model config differs from this model's: "
                f"{state['model_config']} vs {dataclasses.asdict(self.model.config)}."
            )
        saved = state.get("model_recipe", {}).get("precision", self.recipe.precision)
        if saved != self.recipe.precision:
            move = {saved, self.recipe.precision} == {"fp8", "te-fp8"}
            hint = (
                f", or convert it: python -m tutorial_lib convert-checkpoint CKPT NEW --to "
                f"{self.recipe.precision}"
                if move
                else ", or start again"
            )
            raise ValueError(
                f"The checkpoint was trained in precision {saved!r}, this model is built for "
                f"{self.recipe.precision!r}: resume with --precision {saved}{hint}."
            )

    def load_run_state(self, state: dict[str, Any]) -> None:
        """Restore what ``run_state`` saved (the model and optimizer are loaded apart)."""
        if state["step"] == 0:  # no step taken yet: AdamW creates its state at the first one
            self.optimizer.state.clear()
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step = state["step"]
        self.history = list(state["history"])
        self.data.load_state_dict(state["data"])
        _set_rng_state(state["rng"])

    def _load_model_and_optimizer(self, model: dict[str, Any], optimizer: dict[str, Any]) -> None:
        """Load the full model and the optimizer state (a sharded trainer scatters them)."""
        load_model_state_dict(self.model, model)
        self.optimizer.load_state_dict(keep_implementation(optimizer, self.optimizer))

    def save(self, path: str | Path) -> Path:
        self.last_checkpoint = save_checkpoint(path, self.state_dict())
        return self.last_checkpoint

    def resume(self, path: str | Path) -> None:
        """Restore everything from a checkpoint written by ``save``; ``train()`` continues."""
        self.load_state_dict(load_checkpoint(path))
        self.last_checkpoint = Path(path)


# AdamW's settings that choose a kernel, not the math: a checkpoint written where the fused kernel
# ran (or could not) must not switch the kernel of the process that resumes it.
_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")


def keep_implementation(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``saved`` (an ``optimizer.state_dict()``) with each param group's kernel choice
    (``fused``, ``foreach``, ...) taken from ``optimizer``, so a run resumed on another layout or
    device keeps the kernel it can run; the hyperparameters and state come from ``saved``."""
    groups = [
        {**g, **{k: mine[k] for k in _IMPLEMENTATION_KEYS if k in mine}}
        for g, mine in zip(saved["param_groups"], optimizer.param_groups, strict=False)
    ]
    return {**saved, "param_groups": groups}


def run_training(
    cfg: GPTConfig,
    train_cfg: TrainConfig,
    *,
    fused: bool = False,
    compile: bool = False,
    device: torch.device | str | None = None,
    seed: int = 0,
    data_seed: int = 0,
    on_step: StepCallback | None = None,
    data: TokenData | None = None,
) -> Trainer:
    """Build a model and train it: the run every chapter compares with another.

    The model is ``build_model(cfg, precision=train_cfg.precision, fused=..., compile=...,
    seed=seed)``; the data is ``data``, else bytes (``make_data(cfg.block_size,
    seed=data_seed)``) for a 256-row vocabulary, or the active preset's BPE (``preset_data``)
    for its vocabulary; any other size raises ValueError. Two runs that differ in one setting start from the same
    weights and see the same batches. Returns the ``Trainer`` after ``train_cfg.steps`` steps:
    ``.history`` holds the metrics, ``.model`` the trained model."""
    if data is None:
        preset = get_preset()
        if cfg.vocab_size == 256:
            data = make_data(cfg.block_size, seed=data_seed)
        elif preset.tokenizer == "bpe" and preset.vocab_size == cfg.vocab_size:
            data = preset_data(preset, seed=data_seed, block_size=cfg.block_size)
        else:
            raise ValueError(
                f"run_training: no tokenizer for a {cfg.vocab_size}-row vocabulary: bytes need "
                f"256 rows and the {preset.name!r} preset's tokenizer has {preset.vocab_size}. "
                "Pass data= tokenized for this model, or a config with one of those sizes."
            )
    model = build_model(
        cfg, precision=train_cfg.precision, fused=fused, compile=compile, device=device, seed=seed
    )
    trainer = Trainer(model, data, train_cfg, device=device)
    trainer.train(on_step=on_step)
    return trainer
