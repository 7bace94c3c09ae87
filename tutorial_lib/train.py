"""The training loop: AdamW, warm-up + cosine schedule, accumulation, clipping, eval, checkpoints.

Everything a step does, in order: sample micro-batches -> forward under the precision policy ->
backward (scaled for FP16) -> unscale, clip the gradient norm -> optimizer step -> metrics
(loss, lr, tokens/s, MFU, peak memory) -> progress bar -> periodic validation and checkpoint.

The same ``Trainer`` trains a model in one process or as one rank of a parallel run: the model
carries its layout (``model.parallel``, a ``ParallelDims`` that ``build_model`` applied), from
which the step takes this rank's rows of the global batch, the ranks its loss is averaged over
and its gradient norm taken over, and whether this process shows progress and writes files.

Checkpoints (``checkpoint``) hold the model, optimizer, schedule, data-sampler and RNG state, so
a resumed run reproduces the uninterrupted one; they are written atomically, as one file or, for
a sharded model, a DCP directory, and either resumes at any layout.
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

from .build import ModelRecipe, recipe_of
from .checkpoint import CHECKPOINT_FORMAT, checkpoint_name, load_run, save_run
from .data import TokenData
from .hardware import default_device, describe_device
from .model import GPT
from .parallel.mesh import ParallelDims, clip_grad_norm_, local_rows, parallel_of
from .perf import mfu, peak_memory_bytes, phase, reset_peak_memory, synchronize
from .precision import PrecisionPolicy, get_policy
from .train_config import TrainConfig, lr_at

__all__ = [
    "TrainConfig",
    "lr_at",
    "NonFiniteLossError",
    "Trainer",
    "StepCallback",
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
    """Trains a ``GPT`` on a ``TokenData`` stream; ``history`` holds one dict of metrics per step.

    ``cfg.batch_size`` is the global batch: a data-parallel rank trains on its rows of it. Only
    rank 0 of a parallel run shows the progress bar; every rank takes part in a checkpoint."""

    def __init__(
        self,
        model: GPT,
        data: TokenData,
        cfg: TrainConfig,
        device: torch.device | str | None = None,
        out_dir: str | Path | None = None,
    ) -> None:
        self.device = default_device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"Device {self.device} was requested, but this torch ({torch.__version__}) sees "
                "no CUDA GPU. Use device='cpu', or install a CUDA build of torch (README)."
            )
        self.policy: PrecisionPolicy = get_policy(cfg.precision, self.device)
        self.recipe = _check_recipe(model, cfg.precision, self.policy)
        self.parallel: ParallelDims = parallel_of(model)
        if not self.parallel.is_rank0:
            cfg = dataclasses.replace(cfg, progress=False)
        self._rows = local_rows(cfg.batch_size, self.parallel.dp, self.parallel.dp_rank)
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
        per_token = model.flops_per_token(training=True, seq_len=data.block_size)
        self._flops_per_token = per_token / self.parallel.world  # MFU per GPU: 1/(dp t) of it

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
                    x, y = self.batch("train")
                    with self.policy.autocast(self.device):
                        _, loss = self.model(x, y)
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
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = clip_grad_norm_(self.model, max_norm, self.parallel)  # over every rank's shards
        loss_value = self.parallel.mean_over_dp(total_loss).item()  # synchronises
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

    def batch(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's rows of the global batch (all of them without data parallelism)."""
        return self.data.get_batch(split, self.cfg.batch_size, self.device, self._rows)

    @torch.no_grad()
    def evaluate(self, iters: int | None = None) -> float:
        """Mean validation loss over ``iters`` random batches (default ``cfg.eval_iters``)."""
        self.model.eval()
        losses = []
        compiled = self.recipe.compile  # runs eagerly here: in eval mode it would compile again
        with self.policy.matmul_settings():
            for _ in range(iters or self.cfg.eval_iters):
                x, y = self.batch("val")
                eager = torch.compiler.set_stance("force_eager") if compiled else None
                with self.policy.autocast(self.device), eager or contextlib.nullcontext():
                    _, loss = self.model(x, y)
                losses.append(self.parallel.mean_over_dp(loss.detach()).item())
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
                    self.save(self.checkpoint_path)  # type: ignore[arg-type]
        finally:
            bar.close()
        return self.history

    # ---- checkpoints (the design: ``checkpoint.run``) ----------------------------------------
    @property
    def checkpoint_path(self) -> Path | None:
        """Where ``train()`` writes checkpoints: ``out_dir/checkpoint.pt``, or for a sharded
        model the DCP directory ``out_dir/checkpoint``."""
        return None if self.out_dir is None else self.out_dir / checkpoint_name(self.parallel)

    def run_state(self) -> dict[str, Any]:
        """Everything a checkpoint holds except the model and the optimizer state: step,
        configs, loss scaler, schedule, RNG, sampler and history."""
        rng: dict[str, Any] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "model_config": dataclasses.asdict(self.model.config),
            "train_config": dataclasses.asdict(self.cfg),
            "model_recipe": dataclasses.asdict(self.recipe),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "schedule": {"step": self.step, "lr": lr_at(self.step, self.cfg)},
            "rng": rng,
            "data": self.data.state_dict(),
            "trained_on": self.data.fingerprint(),
            "history": self.history,
        }

    def check_compatible(self, state: dict[str, Any], new_data: bool = False) -> None:
        """A ValueError unless ``state`` is a checkpoint of this model in this precision, trained
        on this data (its tokenizer and corpus), or ``new_data`` says to continue on other data."""
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"Not a checkpoint of this tutorial_lib (format {state.get('format')!r}, expected "
                f"{CHECKPOINT_FORMAT!r}): start the run again (--force)."
            )
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
        saved_data, data = state["trained_on"], self.data.fingerprint()
        if saved_data != data and not new_data:
            changed = "tokenizer" if saved_data["tokenizer"] != data["tokenizer"] else "corpus"
            raise ValueError(
                f"The checkpoint was trained with another {changed} than this run's (the "
                "checkpoint records their checksums). Resume with the same --data and the "
                "run's tokenizer.json, or pass --new-data to continue on this data on purpose."
            )

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint (every rank of a parallel run calls it)."""
        self.last_checkpoint = save_run(path, self.model, self.optimizer, self.run_state())
        return self.last_checkpoint

    def resume(self, path: str | Path, new_data: bool = False) -> None:
        """Restore everything from a checkpoint file or directory, written at any layout;
        ``train()`` continues. ``new_data``: continue on other data than the checkpoint's."""
        state = load_run(
            path, self.model, self.optimizer, check=lambda s: self.check_compatible(s, new_data)
        )
        # then what ``run_state`` saved (load_run restored the model and the optimizer)
        if state["step"] == 0:  # no step taken yet: AdamW creates its state at the first one
            self.optimizer.state.clear()
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step = state["step"]
        self.history = list(state["history"])
        self.data.load_state_dict(state["data"])
        _set_rng_state(state["rng"])
        self.last_checkpoint = Path(path)
