"""The trainer of a run, and of its preflight: Tunix's PeftTrainer with our loss, checkpoints and jitting.

The preflight compiles this trainer's own train step for the TPU slice (preflight/step.py), so whatever
shapes the step (optimizer, gradient accumulation, model inputs, loss, donation, output layout) is set here,
once; train/loop.py runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from tunix.sft import metrics_logger, peft_trainer

from tpuforge.api import GrpoSpec, PreferenceSpec, TrainConfig, TrainingSpec
from tpuforge.api.finetune import PREFERENCE_METHODS
from tpuforge_workloads.families.attention import model_inputs
from tpuforge_workloads.model import loss
from tpuforge_workloads.model.lora_provider import without_dropout
from tpuforge_workloads.train import grpo, preference
from tpuforge_workloads.train.checkpoints import TrainCheckpoints

# What the jitted train step takes over from its caller. PeftTrainer donates the optimizer only; the step's
# outputs are all of the model's state as well (nnx.jit returns every argument's state), so without the
# model donated XLA writes a second copy of the unchanged base weights on every chip: for the 31B on a v5p-8,
# 15.6 GB per chip. Donated, the outputs alias the inputs and the weights stay where they are.
DONATED = ("model", "optimizer")


def jit_train_step(step: Any) -> Any:
    """The train step as the trainer jits it (and the preflight compiles it)."""
    return nnx.jit(step, donate_argnames=DONATED)


class SftTrainer(peft_trainer.PeftTrainer):  # type: ignore[misc]
    """PeftTrainer with our loss and checkpoint manager. The base class restores from its own manager in
    __init__; given no checkpoint directory that is a no-op, so the restore is redone here with ours. The
    evaluation's loss is the token-weighted mean of its batches (`take_eval_loss`), computed without LoRA
    dropout (`create_eval_step_fn`). When the run ends on a step not evaluated yet, that step is evaluated
    before its final save (while `final_eval()` says so), so every run's last step has an eval loss.

    With a preference loss (train/preference.py, `make_trainer` sets it) the evaluation's loss is the mean
    preference loss over its pairs, and each step's and each evaluation's preference figures (accuracy,
    reward margin, rewards) are kept for `take_step_preference` / `take_eval_preference`."""

    def __init__(
        self,
        model: nnx.Module,
        optimizer: Any,
        config: peft_trainer.TrainingConfig,
        checkpoints: TrainCheckpoints,
        step_metrics: metrics_logger.MetricsLogger | None = None,
    ):
        super().__init__(model, optimizer, config, metrics_logger=step_metrics)
        self.checkpoint_manager = checkpoints
        self._train_steps, self._restored_custom_metadata = checkpoints.maybe_restore(
            self.model, self.optimizer, restore_only_lora_params=self._lora_enabled
        )
        self._iter_steps = self._train_steps * config.get_with_default("gradient_accumulation_steps", 1)
        self.with_loss_fn(loss.loss_fn, has_aux=True)
        self._eval_aux: list[dict[str, Any]] = []
        self._train_aux: list[dict[str, Any]] = []  # the current step's micro-batches' (preference losses)
        self.preference = False
        self.rl = False  # GRPO: each step's aux kept for take_step_rl
        self._step_preference: dict[int, list[dict[str, Any]]] = {}  # step -> its micro-batches' aux
        self._eval_preference: dict[str, float] | None = None
        self._eval_ds: Any = None
        self._evaluated_step: int | None = None
        self.final_eval: Any = lambda: True

    def train(self, train_ds: Any, eval_ds: Any = None, skip_jit: bool = False, **kwargs: Any) -> None:
        self._eval_ds = eval_ds
        super().train(train_ds, eval_ds, skip_jit, **kwargs)

    def _run_eval(self, eval_ds: Any, eval_step_fn: Any) -> None:
        super()._run_eval(eval_ds, eval_step_fn)
        self._evaluated_step = self._train_steps

    def close(self) -> None:
        """PeftTrainer's close (the last step saved, the manager closed), after evaluating the last step."""
        eval_step = self._jitted_eval_step_fn
        if self._eval_ds and eval_step is not None and self._evaluated_step != self._train_steps and self.final_eval():
            self._run_eval(self._eval_ds, eval_step)
        super().close()

    def jit_train_and_eval_step(self, skip_jit: bool = False, cache_nnx_graph: bool = False) -> Any:
        """PeftTrainer's, but the train step is jitted by `jit_train_step` (the model donated too), and the
        evaluation step donates the model (it too returns the model's state)."""
        if skip_jit or self._jitted_train_step_fn is not None:  # type: ignore[has-type]
            return super().jit_train_and_eval_step(skip_jit, cache_nnx_graph)
        from jax.interpreters import pxla

        self._shard_optimizer(pxla.thread_resources.env.physical_mesh)
        train_step = jit_train_step(self.create_train_step_fn())
        eval_step = nnx.jit(self.create_eval_step_fn(), donate_argnames=("model",))
        # As PeftTrainer binds them: the outer partial is how it reaches the jitted function (`.func`).
        bind = nnx.cached_partial if cache_nnx_graph else functools.partial
        self._jitted_train_step_fn = functools.partial(bind(train_step, self.model, self.optimizer))
        self._jitted_eval_step_fn = functools.partial(bind(eval_step, self.model))
        return self._jitted_train_step_fn, self._jitted_eval_step_fn

    def _train_step(self, model: nnx.Module, optimizer: Any, inputs: Any) -> tuple[Any, Any, Any]:
        """Tunix's train step (gradient of our loss on the LoRA weights, the optimizer's update), but the
        gradient norm it reports is the one the clip sees: that of the step's averaged gradient
        (`step_grad_norm`), not Tunix's norm of each micro-batch's own gradient."""
        inputs = self.gen_model_input_fn(inputs)
        wrt = nnx.DiffState(0, nnx.LoRAParam) if self._lora_enabled else 0
        (loss, aux), grads = nnx.value_and_grad(self.loss_fn, argnums=wrt, has_aux=True)(model, **inputs)
        pure = nnx.as_pure(nnx.state(grads, optimizer.wrt, graph=optimizer.graph))
        accumulation = self.config.get_with_default("gradient_accumulation_steps", 1) or 1
        norm = step_grad_norm(nnx.as_pure(optimizer.opt_state), pure, accumulation)
        optimizer.update(model, grads)
        return loss, aux, norm

    def create_train_step_fn(self) -> Any:
        """Tunix's step, whose model and optimizer state leave it laid out as they came in: by their partition
        specs (`place_by_specs`, `_shard_optimizer`). Left to XLA, the adapters and their optimizer moments
        come back laid out otherwise (a replicated LoRA matrix returns split over tp and fsdp), so the second
        step would be a second program: another full compile on every fresh attempt, and one the preflight's
        cache entry (compiled from the specs) does not cover."""
        step = super().create_train_step_fn()

        def train_step(model: nnx.Module, optimizer: Any, inputs: Any) -> Any:
            out = step(model, optimizer, inputs)
            for module in (model, optimizer):
                state = nnx.state(module)
                nnx.update(module, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))  # type: ignore[no-untyped-call]
            return out

        return train_step

    def create_eval_step_fn(self) -> Any:
        """Tunix's evaluation step, traced with LoRA dropout off (lora_provider.without_dropout): the same
        weights and data always give the same loss, the evaluation Job's, and evaluating draws nothing from
        the dropout stream training uses."""
        step = super().create_eval_step_fn()

        def eval_step(model: nnx.Module, inputs: Any) -> Any:
            with without_dropout():
                return step(model, inputs)

        return eval_step

    def _post_process_eval_step(self, aux: dict[str, Any]) -> None:
        self._eval_aux.append(aux)

    def _post_process_train_step(self, aux: dict[str, Any]) -> None:
        """Keeps a preference step's aux (device arrays: nothing waits) until its last micro-batch; the
        step's figures are read on the host when it is reported, as its loss is."""
        if not (self.preference or self.rl):
            return
        self._train_aux.append(aux)
        accumulation = self.config.get_with_default("gradient_accumulation_steps", 1) or 1
        if len(self._train_aux) == accumulation:
            self._step_preference[self._train_steps + 1] = self._train_aux
            self._train_aux = []

    def take_step_preference(self, step: int) -> dict[str, float] | None:
        """Step `step`'s preference figures over all its pairs (train/preference.py, `summary`)."""
        if not self.preference:
            return None
        auxes = self._step_preference.pop(step, None)
        return preference.summary(_sums(auxes)) if auxes else None

    def take_step_rl(self, step: int) -> dict[str, float] | None:
        """Step `step`'s GRPO loss and KL to the base, means over its answers (train/grpo.py, `summary`)."""
        if not self.rl:
            return None
        auxes = self._step_preference.pop(step, None)
        return grpo.summary(_sums(auxes)) if auxes else None

    def take_eval_preference(self) -> dict[str, float] | None:
        """The last evaluation's preference figures (None for SFT); read after `take_eval_loss`."""
        out, self._eval_preference = self._eval_preference, None
        return out

    def take_eval_loss(self) -> float:
        """The last evaluation's loss: summed NLL over summed loss targets of all its batches (SFT), or the
        mean preference loss over all its pairs."""
        sums = _sums(self._eval_aux)
        self._eval_aux.clear()
        if self.preference and sums:
            self._eval_preference = preference.summary(sums)
            return self._eval_preference["loss"]
        return sums.get("nll_sum", 0.0) / max(sums.get("tokens", 0.0), 1.0)


def _sums(auxes: list[dict[str, Any]]) -> dict[str, float]:
    """Each aux value summed over the batches, as host floats."""
    return {k: sum(float(a[k]) for a in auxes) for k in auxes[0]} if auxes else {}


def step_grad_norm(opt_state: Any, grads: Any, accumulation: int = 1) -> Any:
    """The global norm of the gradient the clip sees for this micro-batch's optimizer step, in the form Tunix
    reports it. Without accumulation: this gradient's norm. With optax.MultiSteps (k micro-batches a step),
    the step's averaged gradient is known at its last micro-batch, as MultiSteps forms it (its running mean of
    the earlier ones, `acc_grads`, updated with this one): its norm times k there and 0 on the others, so that
    Tunix's mean over the step's k reports is that norm."""
    import jax.numpy as jnp

    if accumulation == 1 or not isinstance(opt_state, optax.MultiStepsState):
        return optax.global_norm(grads)
    n = opt_state.mini_step
    mean = jax.tree.map(lambda g, a: a + (g - a) / (n + 1), grads, opt_state.acc_grads)
    return jnp.where(n == accumulation - 1, optax.global_norm(mean) * accumulation, 0.0)


class GradNorms(metrics_logger.MetricsLogger):  # type: ignore[misc]
    """Tunix's metrics logger, without backends, that also hands each training step's gradient norm to
    `on_grad_norm(step, norm)`. PeftTrainer logs step s's metrics (the 1-based step, as its training hooks
    get it) once step s+1 has been dispatched, from values already on the host: nothing waits on the device.
    The norm is that of the step's gradient before clipping, averaged over its micro-batches: the gradient
    the clip scales down when it is over `maxGradNorm` (SftTrainer._train_step, step_grad_norm)."""

    def __init__(self, on_grad_norm: Callable[[int, float], None]):
        super().__init__(None)
        self.on_grad_norm = on_grad_norm

    def log(self, metrics_prefix: str, metric_name: str, scalar_value: Any, mode: Any, step: int | None) -> None:
        super().log(metrics_prefix, metric_name, scalar_value, mode, step)
        if metric_name == "grad_norm" and str(mode) == str(metrics_logger.Mode.TRAIN) and step is not None:
            self.on_grad_norm(int(step), float(np.asarray(scalar_value)))


def learning_rate_schedule(training: TrainingSpec, total_steps: int) -> optax.Schedule:
    """The learning rate by optimizer-step count (0 for the first step): warmup-cosine to 0 at the end."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=training.learning_rate,
        warmup_steps=training.warmup_steps,
        decay_steps=total_steps,
        end_value=0.0,
    )


def learning_rates(training: TrainingSpec, total_steps: int) -> list[float]:
    """The learning rate step s (1-based) updates with, at index s-1: computed once on the host CPU, so
    reporting it costs nothing per step and it is the rate the update used, not the next one."""
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        return [float(x) for x in np.asarray(learning_rate_schedule(training, total_steps)(np.arange(total_steps)))]


def optimizer(training: TrainingSpec, total_steps: int) -> optax.GradientTransformation:
    """The gradient clipped to a global norm of `maxGradNorm`, then AdamW on a warmup-cosine schedule over the
    optimizer steps. Gradient accumulation is PeftTrainer's optax.MultiSteps around this, so the schedule
    advances once per optimizer step and the clip applies to the whole step's (accumulated) gradient."""
    schedule = learning_rate_schedule(training, total_steps)
    adamw = optax.inject_hyperparams(optax.adamw)(learning_rate=schedule, weight_decay=training.weight_decay)
    return clipped(adamw, training.max_grad_norm)


def clipped(inner: optax.GradientTransformation, max_norm: float) -> optax.GradientTransformation:
    """`inner` given the gradient scaled down to a global norm of at most `max_norm`. The clip keeps no state,
    so the optimizer state is `inner`'s alone (optax.chain would nest it in a tuple): checkpoints written
    before clipping existed, and runs whose maxGradNorm changed, resume."""
    clip = optax.clip_by_global_norm(max_norm)

    def update(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> Any:
        updates, _ = clip.update(updates, optax.EmptyState())
        return inner.update(updates, state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(inner.init, update)


def make_trainer(
    model: Any,
    c: TrainConfig,
    total_steps: int,
    checkpoints: Any,
    step_metrics: metrics_logger.MetricsLogger | None = None,
) -> SftTrainer:
    """The trainer of a run, and of its preflight: the preflight compiles this trainer's own train step
    (`create_train_step_fn`) for the TPU slice, so whatever shapes the step (optimizer, gradient
    accumulation, model inputs, loss) is set here, once. Call under the run's mesh. `step_metrics` receives
    Tunix's per-step metrics (e.g. GradNorms); None: Tunix's default logger."""
    g = c.training.gradient_accumulation_steps
    config = peft_trainer.TrainingConfig(
        eval_every_n_steps=c.checkpoint.every_steps,
        max_steps=total_steps,
        gradient_accumulation_steps=g if g > 1 else None,
        checkpoint_root_directory=None,
        data_sharding_axis=("fsdp",),
        pbar_description=None,
    )
    trainer = SftTrainer(model, optimizer(c.training, total_steps), config, checkpoints, step_metrics)
    trainer.with_gen_model_input_fn(model_inputs)
    if c.method in PREFERENCE_METHODS:
        trainer.with_loss_fn(preference.make_loss_fn(c.method, c.preference or PreferenceSpec()), has_aux=True)
        trainer.preference = True
    elif c.method == "grpo":
        trainer.with_loss_fn(grpo.make_loss_fn(c.grpo or GrpoSpec()), has_aux=True)
        trainer.rl = True
    return trainer
