"""The JAX part of a run: mesh, base model, LoRA, the trainer (train/trainer.py), checkpoints, resume.

Tunix's PeftTrainer runs the loop (jitted step, gradient accumulation with optax.MultiSteps, metrics
buffering); the trainer (trainer.py) gives it our loss (model/loss.py: float32 logits, weighted by token
across micro-batches) and our jitting, and this module hands it a checkpoint manager that also saves the
data iterator and dropout stream, a data hook that feeds Grain batches a whole optimizer step at a time and
stops at a step boundary when asked (max steps reached, early stopping, or SIGTERM), and a training hook that
reports progress (loss, tokens, learning rate; the gradient norm comes from Tunix's own metrics,
trainer.GradNorms), hands each evaluation's loss to eval_tracking.py (the best step, early stopping) and, at each
evaluation, gives greedy answers to a few held-out prompts (samples.py).

The same code runs on each host of a multi-host slice (hosts.py): the mesh spans every host's devices,
each process feeds its own rows of every global batch, and the hosts agree at every step boundary whether
to stop, so a SIGTERM on any host checkpoints the same step everywhere.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx
from tunix.sft import hooks

from tpuforge.api import EarlyStop, GrpoSpec, StepLoss, TrainConfig, resolved_remat
from tpuforge.api.code_eval import quantity_bytes
from tpuforge.api.constants import CHECKER_SPOOL_ENV
from tpuforge_workloads import families
from tpuforge_workloads.data.pipeline import (
    batches,
    eval_batches,
    process_rows,
    real_tokens,
    to_global,
)
from tpuforge_workloads.families.decoder import check_sharding
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.runtime import compile_cache
from tpuforge_workloads.runtime.progress import RunProgress
from tpuforge_workloads.train import grpo
from tpuforge_workloads.train.checkpoints import TrainCheckpoints
from tpuforge_workloads.train.decode import RowLogps, prompt_room
from tpuforge_workloads.train.eval_tracking import EvalTracking
from tpuforge_workloads.train.hosts import Agreement, Hosts
from tpuforge_workloads.train.plan import Plan
from tpuforge_workloads.train.preemption import PreemptionWatch
from tpuforge_workloads.train.samples import Sampler
from tpuforge_workloads.train.trainer import GradNorms, learning_rates, make_trainer

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    step: int  # optimizer steps completed (and checkpointed)
    total_steps: int
    start_step: int
    preempted: bool
    loss: float | None
    compile_cache: dict[str, Any] | None = None  # hits, entries loaded and stored (compile_cache.py)
    best: StepLoss | None = None  # the evaluated step with the lowest eval loss
    last_eval: StepLoss | None = None
    stopped_early: EarlyStop | None = None


class BatchFeed(hooks.DataHooks):  # type: ignore[misc]
    """Feeds the trainer from the Grain iterator (this process's rows, made global arrays by `to_global`).
    Returns None (the loop's stop signal) at an optimizer-step boundary once the run is complete, early
    stopping says so (`early_stop`) or a preemption was requested on any host, so every checkpoint holds whole
    steps.

    At each boundary it reads the step's `accumulation` micro-batches at once, to give each the step's mean
    loss-target count (`loss_denominator`, model/loss.py); between steps nothing is held back, so the
    iterator state a checkpoint saves is at the step boundary."""

    def __init__(
        self,
        iterator: Any,
        accumulation: int,
        total_steps: int,
        watch: PreemptionWatch,
        evals: list[Any],
        to_global: Any = lambda batch: batch,
        stop: Agreement | None = None,
        early_stop: Any = lambda: False,
    ):
        self.iterator = iterator
        self.accumulation = accumulation
        self.total_steps = total_steps
        self.watch = watch
        self.evals = evals
        self.to_global = to_global
        self.stop = stop or Agreement(Hosts(), "stop")
        self.early_stop = early_stop  # same answer on every host: it follows the (global) eval loss
        self.preempted = False  # a SIGTERM on this or another host stopped the run
        self.stopped_early = False
        self._eval_index = 0
        self.step_tokens: dict[int, int] = {}  # optimizer step (1-based) -> real tokens in it
        self.tokens_total = 0
        self.exhausted = False
        self._step_batches: list[dict[str, Any]] = []

    def load_next_train_batch(self, train_ctx: Any) -> Any:
        if train_ctx.iter_steps % self.accumulation == 0:
            if train_ctx.train_steps >= self.total_steps:
                return None
            if self.early_stop():
                self.stopped_early = True
                return None
            if self.stop.any(self.watch.requested):
                self.preempted = True
                return None
            try:
                self._step_batches = self.next_step(train_ctx)
            except StopIteration:
                self.exhausted = True
                return None
        batch = self._step_batches.pop(0)
        step = train_ctx.iter_steps // self.accumulation + 1
        n = real_tokens(batch)
        self.step_tokens[step] = self.step_tokens.get(step, 0) + n
        self.tokens_total += n
        return self.to_global(batch)

    def next_step(self, train_ctx: Any) -> list[dict[str, Any]]:
        """The next optimizer step's micro-batches (this process's rows); StopIteration when the data ends."""
        step_batches = [next(self.iterator) for _ in range(self.accumulation)]
        set_loss_denominator(step_batches)
        return step_batches

    def load_next_eval_batch(self, train_ctx: Any) -> Any:
        if self._eval_index >= len(self.evals):
            self._eval_index = 0
            return None
        self._eval_index += 1
        return self.evals[self._eval_index - 1]


@dataclass
class HeldRollout:
    """A rollout that trains several steps (spec.grpo.iterations): its whole rows (every process holds them all)
    and its figures, from the step that sampled it (`first_step`)."""

    first_step: int
    batch: dict[str, np.ndarray]
    figures: dict[str, Any]

    def state(self) -> dict[str, Any]:
        """As JSON (checkpoints.ROLLOUT_ITEM): each array's dtype, shape and values (float32 values survive JSON's
        float64 exactly)."""
        arrays = {
            k: {"dtype": str(v.dtype), "shape": list(v.shape), "values": v.ravel().tolist()}
            for k, v in self.batch.items()
        }
        return {"first_step": self.first_step, "batch": arrays, "figures": self.figures}

    @staticmethod
    def from_state(state: dict[str, Any]) -> HeldRollout:
        batch = {k: np.asarray(a["values"], dtype=a["dtype"]).reshape(a["shape"]) for k, a in state["batch"].items()}
        return HeldRollout(int(state["first_step"]), batch, dict(state["figures"]))


class RolloutFeed(BatchFeed):
    """GRPO's feed (train/grpo.py): each step's rows are answers the model samples, at the step boundary, to the
    step's prompts (`prompts` problem indices from the iterator per micro-batch), judged by the checker,
    with their group-normalised advantages. Every process samples the whole step (the model spans the slice)
    and feeds its own rows. The step's figures wait in `figures` for its report.

    With spec.grpo.iterations = mu > 1, a rollout is sampled at steps 1, 1 + mu, 1 + 2 mu, ... and trained on
    by the steps up to the next of them, with the sampling policy's per-token log-probabilities (`logps`,
    decode.RowLogps) as pi_old; the figures of the steps after the first repeat the rollout's answers' (reward,
    pass rate, length), with `iteration`, and no rollout or checker time and no refusals (counted once). A
    checkpoint inside a rollout's steps keeps it (`rollout_state`), so a run resumed there trains on the same
    answers; a run resumed elsewhere samples anew at the step it resumes from, and the rollouts fall back in
    line at the next boundary."""

    def __init__(
        self,
        iterator: Any,
        accumulation: int,
        total_steps: int,
        watch: PreemptionWatch,
        problems: list[grpo.RlProblem],
        sampler: grpo.RolloutSampler,
        spec: GrpoSpec,
        check: Any,
        pad_id: int,
        local_rows: list[int],
        prompts: int,
        to_global: Any = lambda batch: batch,
        stop: Agreement | None = None,
        logps: Any = None,
    ):
        super().__init__(iterator, accumulation, total_steps, watch, [], to_global, stop)
        self.logps = logps  # decode.RowLogps where spec.grpo.iterations > 1
        self.held: HeldRollout | None = None
        self.problems = problems
        self.sampler = sampler
        self.spec = spec
        self.check = check
        self.pad_id = pad_id
        self.local_rows = local_rows
        self.prompts = prompts
        self.figures: dict[int, dict[str, Any]] = {}
        self.answers: dict[int, list[dict[str, str]]] = {}  # a few of each step's answers, with their verdicts
        self._started: dict[int, float] = {}

    def next_step(self, train_ctx: Any) -> list[dict[str, Any]]:
        step = train_ctx.train_steps + 1
        now = time.monotonic()
        if step - 1 in self._started and step - 1 in self.figures:
            self.figures[step - 1]["step_seconds"] = now - self._started.pop(step - 1)
        self._started[step] = now
        mu = self.spec.iterations
        if self.held is not None and (step - 1) % mu and step - self.held.first_step < mu:
            batch = self.held.batch
            # The answers trained on, but nothing sampled or checked: no time, no refusal counted twice.
            nothing_new = {"rollout_seconds": 0.0, "checker_seconds": 0.0, "refused": 0, "failures": {}}
            self.figures[step] = {**self.held.figures, **nothing_new}
        else:
            batch = self.sample(train_ctx.model, step)
        if mu > 1 and self.held is not None:
            self.figures[step]["iteration"] = step - self.held.first_step + 1
        rows = len(batch["input_tokens"]) // self.accumulation
        return [
            {k: v[m * rows : (m + 1) * rows][self.local_rows] for k, v in batch.items()}
            for m in range(self.accumulation)
        ]

    def sample(self, model: Any, step: int) -> dict[str, np.ndarray]:
        """A new rollout at `step`: the step's prompts from the iterator, answered and judged; its whole rows."""
        indices = [int(next(self.iterator)) for _ in range(self.accumulation * self.prompts)]
        problems = [self.problems[i] for i in indices]
        r = grpo.rollout(self.sampler, model, problems, self.spec, step, self.check, self.pad_id)
        self.figures[step] = grpo.step_figures(r)
        self.answers[step] = [
            {"prompt": p.prompt, "answer": f"{j.answer}\n\n[reward {j.reward:.3g}; {j.verdict or 'not checked'}]",
             "reference": p.reference}
            for p, j in list(zip(r.problems, r.judged, strict=True))[:: self.spec.group_size][:2]
        ]  # fmt: skip
        if self.spec.iterations > 1:
            b = r.batch
            b["old_logps"] = self.logps(model, b["input_tokens"], b["segment_ids"], b["positions"])
            self.held = HeldRollout(step, b, dict(self.figures[step]))
        return r.batch

    def rollout_state(self, step: int) -> dict[str, Any] | None:
        """What a run resumed after `step` trains on before it samples again (checkpoints.ROLLOUT_ITEM): the held
        rollout when step + 1 is inside its steps, else None."""
        held = self.held
        if (
            held is None
            or step % self.spec.iterations == 0
            or not held.first_step <= step < held.first_step + self.spec.iterations
        ):
            return None
        return held.state()

    def restore_rollout(self, state: dict[str, Any]) -> None:
        self.held = HeldRollout.from_state(state)

    def take_figures(self, step: int) -> dict[str, Any] | None:
        """Step `step`'s rollout figures, with the checker's share of the step's time."""
        figures = self.figures.pop(step, None)
        if figures is None:
            return None
        seconds = figures.pop("step_seconds", None)
        if seconds is None:
            seconds = time.monotonic() - self._started.pop(step, time.monotonic())
        figures["step_seconds"] = seconds
        figures["checker_share"] = figures["checker_seconds"] / seconds if seconds > 0 else 0.0
        return figures


class ProgressHooks(hooks.TrainingHooks):  # type: ignore[misc]
    """Forwards each finished step's loss (and learning rate) to RunProgress. PeftTrainer reports step s once
    step s+1 has been dispatched, so reading the loss never stalls the device. After each evaluation,
    `sampler` (when given) answers its prompts with the model as trained so far; the time it takes is left
    out of the throughput, as the evaluation's is."""

    def __init__(
        self,
        progress: RunProgress,
        feed: BatchFeed,
        after_first_step: Any = None,
        rates: list[float] | None = None,
        sampler: Sampler | None = None,
        evals: EvalTracking | None = None,
    ):
        self.progress = progress
        self.feed = feed
        self.evals = evals
        self.losses: dict[int, float] = {}
        self.after_first_step = after_first_step  # e.g. store the step just compiled, before a preemption
        self.rates = rates or []
        self.sampler = sampler
        self.sample_every = 1  # GRPO: a few of every n-th step's answers, with their verdicts

    def on_train_start(self, train_ctx: Any) -> None:
        self.progress.restart_step_clock()

    def on_train_end(self, train_ctx: Any) -> None:
        pass

    def on_train_step_start(self, train_ctx: Any) -> None:
        pass

    def on_train_step_end(self, train_ctx: Any, train_step: int, train_loss: float) -> None:
        loss = float(train_loss)
        self.losses[train_step] = loss
        if self.after_first_step is not None:
            self.after_first_step()
            self.after_first_step = None
        rate = self.rates[train_step - 1] if 0 < train_step <= len(self.rates) else None
        figures = train_ctx.take_step_preference(train_step)
        if figures is not None:  # before the step's report, which publishes them with it
            self.progress.preference_done(train_step, figures, "train")
        rl = train_ctx.take_step_rl(train_step)
        if isinstance(self.feed, RolloutFeed):
            rollout = self.feed.take_figures(train_step)
            if rollout is not None:
                self.progress.rl_done(train_step, {**rollout, **(rl or {})})
            answers = self.feed.answers.pop(train_step, None)
            if answers and train_step % self.sample_every == 0:
                self.progress.samples_done(train_step, answers)
        self.progress.step_done(
            train_step, loss, self.feed.step_tokens.pop(train_step, 0), self.feed.tokens_total, learning_rate=rate
        )

    def on_eval_step_start(self, train_ctx: Any) -> None:
        pass

    def on_eval_step_end(self, train_ctx: Any, eval_loss: float) -> None:
        step = train_ctx.train_steps
        loss = train_ctx.take_eval_loss()
        self.progress.eval_done(step, loss)
        figures = train_ctx.take_eval_preference()
        if figures is not None:
            self.progress.preference_done(step, figures, "eval")
        if self.evals is not None:
            self.evals.evaluated(step, loss)
        if self.sampler is not None:
            started = time.monotonic()
            try:
                samples = self.sampler.answers(train_ctx.model)
            except Exception:  # the samples are for people to read; training goes on without them
                log.exception("sample answers at step %d failed; the run goes on without them", step)
                self.sampler = None
            else:
                log.info("%d sample answers at step %d in %.1f s", len(samples), step, time.monotonic() - started)
                self.progress.samples_done(step, samples)
        self.progress.restart_step_clock()


def rollout_feed(
    plan: Plan,
    mesh: jax.sharding.Mesh,
    iterator: Any,
    watch: PreemptionWatch,
    local_rows: list[int],
    global_batch: Any,
    stop: Agreement,
) -> RolloutFeed:
    """GRPO's feed: the rollout sampler on the training mesh and the confined checker (train/grpo.py)."""
    import os
    import tempfile

    c = plan.config
    spec = c.grpo or GrpoSpec()
    room = prompt_room([p.tokens for p in plan.problems])
    sampler = grpo.RolloutSampler(
        plan.encoder, mesh, c.training.max_seq_len, spec.max_tokens, spec.temperature, c.training.seed, room
    )
    checker = spec.checker
    check: grpo.Checker | grpo.SpoolChecker | None = None
    spool = os.environ.get(CHECKER_SPOOL_ENV)
    if spec.reward.checker > 0 and spool:
        check = grpo.SpoolChecker(spool, checker.timeout_seconds)
    elif spec.reward.checker > 0:
        check = grpo.Checker(
            checker.command,
            checker.timeout_seconds,
            quantity_bytes(checker.memory),
            checker.parallel or os.cpu_count() or 1,
            tempfile.gettempdir(),
        )
    return RolloutFeed(
        iterator,
        c.training.gradient_accumulation_steps,
        plan.total_steps,
        watch,
        plan.problems,
        sampler,
        spec,
        check,
        plan.batch.pad_id,
        local_rows,
        plan.prompts_per_micro_batch,
        global_batch,
        stop,
        RowLogps(mesh) if spec.iterations > 1 else None,
    )


def set_loss_denominator(group: list[dict[str, Any]], loss_targets: list[int] | None = None) -> None:
    """Give each batch of a group averaged together (one optimizer step's micro-batches, or the eval set)
    the group's mean loss-target count, in every row (default: the batches' `global_loss_tokens`)."""
    counts = loss_targets if loss_targets is not None else [int(b["global_loss_tokens"]) for b in group]
    mean = sum(counts) / len(group)
    for b in group:
        b["loss_denominator"] = np.full(len(b["input_tokens"]), mean, np.float32)


def build_model(
    plan: Plan,
    mesh: jax.sharding.Mesh,
    timings: dict[str, float],
    adapter_dtype: str = lora.ADAPTER_DTYPE,
) -> Any:
    """Base model from model.uri on the mesh, with LoRA adapters stored in `adapter_dtype`. Each process
    reads only its share of the checkpoint (checkpoint_read.py); `timings` gets the bytes it read. The LoRA
    build is set up from shapes before the base is read, so that a quantized base (QLoRA) is quantized as it
    is read (lora.AdapterBuild.placed): the full-precision base is never held whole."""
    cfg = families.of(plan.text).tunix_config(plan.text)
    config = plan.config
    started = time.monotonic()
    with jax.set_mesh(mesh):
        shapes = lora.abstract_base(plan.text)
        check_sharding(nnx.state(shapes), mesh)
        build = lora.AdapterBuild(shapes, config.lora, mesh, config.training.seed, adapter_dtype)
    lora_s = time.monotonic() - started
    started = time.monotonic()
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(config.model_uri, plan.text, cfg, mesh, timings, placed=build.placed)
    timings["model_load_s"] = time.monotonic() - started  # with QLoRA, the base's quantization too
    started = time.monotonic()
    model = adapt_for_training(base, config, mesh, adapter_dtype, build)
    timings["lora_s"] = lora_s + time.monotonic() - started
    return model


def adapt_for_training(
    base: Any,
    config: TrainConfig,
    mesh: jax.sharding.Mesh,
    adapter_dtype: str = lora.ADAPTER_DTYPE,
    build: lora.AdapterBuild | None = None,
) -> Any:
    """The base model as the trainer trains it: LoRA adapters on the configured targets (in `adapter_dtype`),
    remat as configured (unset, as in a config the operator did not write: on), every array laid out by its
    partition spec. `build`: the one whose `placed` saw the base loaded (lora.apply_lora)."""
    seed = config.training.seed
    model = lora.apply_lora(base, config.lora, mesh, seed=seed, adapter_dtype=adapter_dtype, build=build)
    check_sharding(nnx.state(model, nnx.LoRAParam), mesh)
    families.of_model(base).set_remat(model, resolved_remat(config.training, None), config.training.remat_policy)
    place_by_specs(model, mesh)
    return model


def place_by_specs(model: Any, mesh: jax.sharding.Mesh) -> None:
    """Give every array of `model` the sharding its partition spec names, where that is the layout it
    already has. LoRA insertion runs under jit and leaves the shardings XLA chose (a size-1 fsdp axis
    dropped, for one): the same layout, but another program to compile than the one the preflight compiles
    from the specs (compile_cache.py). Nothing is copied: each array is re-labelled from its own shards (on
    every host); an array laid out otherwise keeps its sharding."""
    from jax.sharding import NamedSharding, PartitionSpec

    state = nnx.state(model)
    specs = nnx.get_partition_spec(state)

    def place(x: Any, spec: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        target = NamedSharding(mesh, spec if isinstance(spec, PartitionSpec) else PartitionSpec())  # type: ignore[no-untyped-call]
        if x.sharding == target or not x.sharding.is_equivalent_to(target, x.ndim):
            return x
        return jax.make_array_from_single_device_arrays(x.shape, target, [s.data for s in x.addressable_shards])

    nnx.update(model, jax.tree.map(place, state, specs))


def run(
    plan: Plan, watch: PreemptionWatch, progress_factory: Any, timings: dict[str, float], hosts: Hosts = Hosts()
) -> Outcome:
    """Train per `plan`. `progress_factory(start_step, committed_step)` -> RunProgress is called once the
    resume point is known. With config.compile_cache_uri, compiled programs are loaded from and stored
    in that cache under this run's key."""
    c = plan.config
    mesh = make_mesh(c.mesh.fsdp, c.mesh.tp)
    inputs = compile_cache.key_inputs(plan.text, c, plan.total_steps, mesh.devices)
    with compile_cache.open_cache(c.compile_cache_uri, inputs) as cache:
        outcome = _train(plan, mesh, watch, progress_factory, timings, hosts, cache)
    if cache is not None:
        outcome.compile_cache = cache.stats()
    return outcome


def _train(
    plan: Plan,
    mesh: jax.sharding.Mesh,
    watch: PreemptionWatch,
    progress_factory: Any,
    timings: dict[str, float],
    hosts: Hosts,
    cache: compile_cache.CompileCache | None,
) -> Outcome:
    c = plan.config
    g = c.training.gradient_accumulation_steps
    model = build_model(plan, mesh, timings)

    # Batches are split over fsdp (replicated over tp); this process makes only the rows its devices hold.
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
    local_rows = process_rows(sharding, plan.rows, c.training.max_seq_len)

    def global_batch(batch: dict[str, Any]) -> dict[str, Any]:
        return to_global(batch, sharding, plan.rows)

    rl = c.method == "grpo"
    if rl:
        iterator = grpo.prompt_order(len(plan.problems), c.training.seed)
    else:
        iterator = iter(batches(plan.examples, plan.batch, local_rows))
    whole = eval_batches(plan.eval_examples, plan.rows, c.training.max_seq_len, plan.batch.pad_id)
    local = [{k: v[local_rows] for k, v in b.items()} for b in whole]
    if local:
        set_loss_denominator(local, [int(b["input_mask"][:, 1:].sum()) for b in whole])
    evals = [global_batch(b) for b in local]
    tracking = EvalTracking(c.checkpoint.uri, c.training.early_stopping, write=hosts.primary) if evals else None
    feed: BatchFeed
    if rl:
        feed = rollout_feed(plan, mesh, iterator, watch, local_rows, global_batch, Agreement(hosts, "stop"))
    else:
        feed = BatchFeed(
            iterator,
            g,
            plan.total_steps,
            watch,
            evals,
            global_batch,
            Agreement(hosts, "stop"),
            early_stop=tracking.should_stop if tracking is not None else lambda: False,
        )
    progress_box: list[RunProgress] = []

    checkpoints = TrainCheckpoints(
        c.checkpoint.uri,
        every_steps=c.checkpoint.every_steps,
        keep=c.checkpoint.keep,
        data_iterator=iterator,
        metadata=lambda: {"tokens": feed.tokens_total},
        rollout_state=feed.rollout_state if isinstance(feed, RolloutFeed) else None,
        restore_rollout=feed.restore_rollout if isinstance(feed, RolloutFeed) else None,
        on_saved=lambda step, s: progress_box[0].checkpoint_saved(step, s) if progress_box else None,
        on_committed=lambda step, s, n: progress_box[0].checkpoint_committed(step, s, n) if progress_box else None,
        protect=tracking.protected_steps if tracking is not None and c.checkpoint.select == "best" else None,
    )
    started = time.monotonic()
    grad_norms = GradNorms(lambda step, norm: progress_box[0].grad_norm(step, norm) if progress_box else None)
    with jax.set_mesh(mesh):
        trainer = make_trainer(model, c, plan.total_steps, checkpoints, grad_norms)
    timings["restore_s"] = time.monotonic() - started
    start_step = trainer.train_steps
    if tracking is not None:
        tracking.resumed_at(start_step)
    # The last step is evaluated too (unless a preemption cut the run short), so that select: best weighs it.
    trainer.final_eval = lambda: not feed.preempted
    feed.tokens_total = int(checkpoints.restored_metadata.get("tokens", 0))
    progress = progress_factory(start_step, checkpoints.committed_step)
    progress_box.append(progress)
    sampler = Sampler(plan.samples, plan.encoder, mesh, c.training.max_seq_len) if plan.samples and evals else None
    rates = learning_rates(c.training, plan.total_steps)
    hook = ProgressHooks(progress, feed, cache.push if cache is not None else None, rates, sampler, tracking)
    hook.sample_every = c.checkpoint.every_steps
    trainer.with_data_hooks(feed)
    trainer.with_training_hooks(hook)

    watch.enter_loop()
    log.info(
        "training steps %d..%d of %d on mesh %s, %d examples a step (microBatchSize %d x fsdp %d x accumulation "
        "%d) (%s, rows %s of each batch)",
        start_step + 1,
        plan.total_steps,
        plan.total_steps,
        dict(mesh.shape),
        plan.examples_per_step,
        c.training.micro_batch_size,
        c.mesh.fsdp,
        g,
        hosts,
        f"{local_rows[0]}..{local_rows[-1]}",
    )
    started = time.monotonic()
    try:
        with jax.set_mesh(mesh):
            trainer.train([], evals or None)  # batches come from `feed`; train() closes the trainer
    finally:
        iterator.close()  # stops the prefetch thread
        if isinstance(feed, RolloutFeed) and isinstance(feed.check, grpo.Checker | grpo.SpoolChecker):
            feed.check.close()
    timings["train_s"] = time.monotonic() - started
    step = trainer.train_steps
    if feed.exhausted and step < plan.total_steps:
        raise RuntimeError(f"the data ran out at step {step} of {plan.total_steps}")
    last = max(hook.losses) if hook.losses else None
    return Outcome(
        step=step,
        total_steps=plan.total_steps,
        start_step=start_step,
        preempted=step < plan.total_steps and feed.preempted,
        loss=hook.losses[last] if last is not None else None,
        best=tracking.best() if tracking is not None else None,
        last_eval=tracking.last if tracking is not None else None,
        stopped_early=tracking.stopped_early if tracking is not None and feed.stopped_early else None,
    )
