"""GRPO (spec.method grpo): reinforcement learning with the checker's verdict as the reward, in the trainer's own
loop. The same train step, optimizer, checkpoints and resume as SFT; what differs is where a step's rows come
from and the loss they are scored with.

- Problems are chat records with a `test`, read as functional evaluation reads them (the last assistant turn
  is the reference answer; VerilogEval's layout is converted by data/verilogeval.py), with the same held-out
  split (data/split.py) as every other method.
- Each step (`RolloutFeed`, the trainer's data hook) takes its prompts from a checkpointed Grain iterator of
  problem indices, samples groupSize answers to each from the model as trained so far (`RolloutSampler`:
  train/decode.py, with a KV cache and a temperature), and has the hardened checker (evaluate.check: each
  answer in a scratch directory of its own, under a uid of its own) judge the code taken from each, up to its CPUs at
  once: in this process (`Checker`), or in the checker sidecar beside the trainer on a cluster
  (`SpoolChecker`, through the spool of evaluate.check --serve). An answer's reward is a weighted sum
  (`rewards`): the checker's pass (or its share of the test's samples that match), an exact match with the
  reference, and a format reward.
- Advantages are group-normalised: (reward - the group's mean) / (its standard deviation + eps), or only
  centred (scaleRewards false, Dr. GRPO).
- The loss (`make_loss_fn`), per answer token: -min(ratio x A, clip(ratio, 1 - eps, 1 + eps) x A) + beta x KL,
  ratio = pi / pi_old, KL = exp(ref - logp) - (ref - logp) - 1 (the k3 estimator) to the reference, which is
  the model with its adapters off (train/preference.adapters_off). Each answer's mean over its tokens, then
  the mean over the answers. pi_old is the policy that sampled. At one optimizer step per rollout (the
  default) the step's own forward computes it (stop_gradient), so the ratio is 1 and the clip bounds nothing;
  with `iterations` steps per rollout (GRPO's mu) its per-token log-probabilities are computed once as the
  rollout is made (decode.RowLogps, `old_logps` in the rows) and every step on that rollout is clipped
  against them. A checkpoint inside a rollout's steps keeps the rollout (checkpoints.ROLLOUT_ITEM), so a
  resumed run trains on the answers the interrupted one sampled.

Rollouts draw from a key folded with the step number, so a run resumed from a checkpoint (its data position
included) samples what the uninterrupted run would have.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tpuforge.api import GrpoSpec, RewardSpec
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.pipeline import pad_example
from tpuforge_workloads.data.records import Record
from tpuforge_workloads.evaluate.passk import code_hint, extract_code

# The Verilog checker's line of the testbench's counters (evaluate.verilog), for checkerScore: fraction.
_COUNTERS = re.compile(r"verdict: (?P<mismatches>\d+) mismatches in (?P<samples>\d+) samples")
FIGURES = ("reward", "pass_rate", "kl", "response_tokens", "refused", "checker_seconds", "rollout_seconds")
TRUNCATED = "truncated"
EPS = 1e-6


class ProblemError(ValueError):
    """A record GRPO cannot train on; the message names it and the fix."""


@dataclass(frozen=True)
class RlProblem:
    prompt: str  # the last user turn, for people to read
    tokens: np.ndarray  # the generation prompt, int32
    reference: str  # the record's own last assistant turn
    test: Any
    where: str


def rl_problems(records: Sequence[Record], encoder: ChatEncoder, max_seq_len: int, spec: GrpoSpec) -> list[RlProblem]:
    """Each record's prompt (every turn before its last assistant turn) and reference answer. Raises
    ProblemError for a record without a test (when the checker is weighed) or whose prompt leaves less than
    grpo.maxTokens of room within training.maxSeqLen."""
    out = []
    for record in records:
        messages = list(record.messages)
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
        if last is None or not any(m.role == "user" for m in messages[:last]):
            raise ProblemError(f"{record.where}: a user turn and then an assistant turn (the reference) are needed")
        if spec.reward.checker > 0 and not isinstance(record.test, dict):
            raise ProblemError(
                f'{record.where}: no "test" object beside "messages": grpo\'s reward runs the checker on each '
                'answer against its record\'s test (for Verilog {"files": {"tb.v": "..."}}); add one, or set '
                "spec.grpo.reward.checker: 0"
            )
        tokens = encoder.prompt(messages[:last])
        if len(tokens) + spec.max_tokens > max_seq_len:
            raise ProblemError(
                f"{record.where}: the prompt's {len(tokens)} tokens and grpo.maxTokens {spec.max_tokens} do not fit "
                f"in training.maxSeqLen {max_seq_len}; raise maxSeqLen or lower maxTokens"
            )
        user = next(m.content for m in reversed(messages[:last]) if m.role == "user")
        out.append(RlProblem(user.strip(), tokens, messages[last].content.strip(), record.test, record.where))
    return out


def problem_records(uri: str) -> list[dict[str, Any]] | None:
    """The records of a local directory in VerilogEval's layout (data/verilogeval.py), or None when `uri` is
    not one."""
    from tpuforge_workloads.data import verilogeval

    path = Path(uri)
    if "://" in uri or not path.is_dir() or not any(path.glob(f"*{verilogeval.PROMPT_SUFFIX}")):
        return None
    return [verilogeval.to_record(p) for p in verilogeval.read_problems(path)]


# ---- rewards and advantages -------------------------------------------------------------------------------


@dataclass
class Judged:
    """One answer with its verdict and reward."""

    answer: str
    code: str
    stopped: bool  # ended by itself within maxTokens
    passed: bool = False
    failure: str | None = None
    score: float = 0.0  # the checker's: 1/0, or the share of samples that match
    reward: float = 0.0
    verdict: str = ""


def checker_score(verdict: dict[str, Any], score: str) -> float:
    """1 or 0 by the verdict; with `fraction`, the share of the test's samples that matched where the checker
    reports its counters (a passed answer is 1 either way)."""
    if verdict.get("passed"):
        return 1.0
    if score == "fraction":
        found = _COUNTERS.search(str(verdict.get("stderr", "")))
        if found and int(found["samples"]) > 0:
            return max(0.0, 1.0 - int(found["mismatches"]) / int(found["samples"]))
    return 0.0


def exact_match(answer: str, reference: str) -> bool:
    return answer.strip() == reference.strip()


def rewards(judged: Sequence[Judged], references: Sequence[str], spec: RewardSpec) -> list[float]:
    """Each answer's weighted sum: checker x its score + exactMatch x [answer == reference] + format x [the
    answer holds code and ended by itself]."""
    return [
        spec.checker * j.score
        + spec.exact_match * float(exact_match(j.answer, ref))
        + spec.format * float(bool(j.code.strip()) and j.stopped)
        for j, ref in zip(judged, references, strict=True)
    ]


def group_advantages(rewards: np.ndarray, scale: bool) -> np.ndarray:
    """rewards [P, G] -> advantages [P, G]: each centred on its group's mean, divided by the group's standard
    deviation (+ eps) when `scale`. A group whose answers all scored alike has none."""
    centred: np.ndarray = rewards - rewards.mean(axis=1, keepdims=True)
    if scale:
        centred = centred / (rewards.std(axis=1, keepdims=True) + EPS)
    return centred.astype(np.float32)


# ---- the checker --------------------------------------------------------------------------------------------


class Checker:
    """The evaluation's confined checker (evaluate.check.Runner), in this process, `parallel` answers at once.
    Needs root with CAP_SETUID and CAP_SETGID, as the evaluation's `check` container has."""

    def __init__(self, command: list[str], timeout_seconds: float, memory_bytes: int, parallel: int, scratch: str):
        from tpuforge_workloads.evaluate.check import Runner, cannot_confine, scratch_root
        from tpuforge_workloads.evaluate.jail import Limits

        why = cannot_confine()
        if why is not None:
            raise ProblemError(f"grpo's reward checker cannot run: {why}")
        self.runner = Runner(command, Limits(timeout_seconds, memory_bytes), scratch_root(Path(scratch)))
        self.parallel = max(1, parallel)
        self._pool = ThreadPoolExecutor(max_workers=self.parallel)

    def __call__(self, items: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
        """(code, test) -> verdict (evaluate.check.Verdict.to_json()) each, in order."""
        verdicts = self._pool.map(lambda it: self.runner.run(str(it[0]), it[1][0], it[1][1]), enumerate(items))
        return [v.to_json() for v in verdicts]

    def close(self) -> None:
        self._pool.shutdown(wait=False)


class CheckerUnavailable(RuntimeError):
    """The checker sidecar did not answer: it died, was killed, or never started."""


class SpoolChecker:
    """The checker beside the trainer (the pod's `checker` sidecar, evaluate.check --serve, with the evaluation's
    confinement): each call writes the answers as one batch to spool/requests and waits for its verdicts in
    spool/verdicts. Fails with CheckerUnavailable, naming why, when the sidecar's heartbeat is missing or stale
    or the batch outlives its deadline: a step never hangs on a dead checker."""

    START_SECONDS = 120.0  # the first heartbeat, after the sidecar's start
    STALE_SECONDS = 30.0  # a heartbeat older than this: the sidecar is gone

    def __init__(self, spool: str, timeout_seconds: float, poll_seconds: float = 0.05):
        from tpuforge_workloads.evaluate import check

        self.requests = Path(spool) / check.SPOOL_REQUESTS
        self.verdicts = Path(spool) / check.SPOOL_VERDICTS
        self.alive = self.verdicts / check.SPOOL_ALIVE
        self.stop_marker = self.requests / check.SPOOL_STOP
        self.requests.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.requests.chmod(0o755)  # the trainer's alone: a sample's uid must not add a batch or the stop
        self.timeout_seconds = timeout_seconds
        self.poll_seconds = poll_seconds
        self.started = time.monotonic()
        self._prefix = f"{socket.gethostname()}-{os.getpid()}"
        self._batches = 0
        self._seen = False  # a heartbeat, once: its absence then means the sidecar stopped

    def _heartbeat_problem(self) -> str | None:
        try:
            age = time.time() - self.alive.stat().st_mtime
            self._seen = True
        except FileNotFoundError:
            if self._seen:
                return f"the checker sidecar stopped ({self.alive} is gone; see the pod's `checker` container)"
            if time.monotonic() - self.started > self.START_SECONDS:
                return (
                    f"no heartbeat at {self.alive} {self.START_SECONDS:g} s after the trainer started: the checker "
                    "sidecar is not running (see the pod's `checker` container)"
                )
            return None
        if age > self.STALE_SECONDS:
            return (
                f"the checker sidecar's heartbeat ({self.alive}) is {age:.0f} s old: it died or was killed (see the "
                "pod's `checker` container: its logs and last state)"
            )
        return None

    def __call__(self, items: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
        """(code, test) -> verdict (evaluate.check.Verdict.to_json()) each, in order."""
        from tpuforge_workloads.evaluate.check import write_atomically

        self._batches += 1
        name = f"{self._prefix}-{self._batches:07d}.jsonl"
        lines = (json.dumps({"id": str(i), "code": code, "test": test}) for i, (code, test) in enumerate(items))
        write_atomically(self.requests / name, "".join(line + "\n" for line in lines))
        # Every answer one after the other, each to its limit, and the launcher's own time: a deadline no
        # working checker reaches.
        deadline = time.monotonic() + max(60.0, len(items) * (self.timeout_seconds + 5.0))
        answer = self.verdicts / name
        try:
            while not answer.exists():
                problem = self._heartbeat_problem()
                if problem is None and time.monotonic() > deadline:
                    problem = f"no verdicts for {len(items)} answers in {self.requests / name} by its deadline"
                if problem is not None:
                    raise CheckerUnavailable(f"grpo's reward checker: {problem}")
                time.sleep(self.poll_seconds)
            verdicts = [json.loads(line) for line in answer.read_text().splitlines() if line.strip()]
        finally:
            (self.requests / name).unlink(missing_ok=True)  # the sidecar then removes its verdicts
        if len(verdicts) == 1 and "error" in verdicts[0]:
            raise CheckerUnavailable(f"grpo's reward checker refused a batch: {verdicts[0]['error']}")
        by_id = {str(v["id"]): v for v in verdicts}
        return [by_id[str(i)] for i in range(len(items))]

    def close(self) -> None:
        """Nothing to do: the kubelet stops a native sidecar once the trainer has ended (a sidecar that exited
        by itself would only be restarted, the pod still running)."""

    def stop(self) -> None:
        """Stop the checker now (a checker started by hand beside a trainer, tests)."""
        from tpuforge_workloads.evaluate.check import write_atomically

        write_atomically(self.stop_marker, "")


def judge(
    answers: Sequence[str],
    stopped: Sequence[bool],
    problems: Sequence[RlProblem],
    check: Callable[[Sequence[tuple[str, Any]]], list[dict[str, Any]]] | None,
    spec: RewardSpec,
) -> list[Judged]:
    """The answers (problems[i]'s answer at i) judged: the code taken from each (as evaluate.sample takes it)
    checked, an answer cut at maxTokens failed as "truncated" whatever the checker said (as evaluate.score
    fails it), and rewarded."""
    out = [Judged(a, extract_code(a, code_hint(p.test)), s) for a, s, p in zip(answers, stopped, problems, strict=True)]
    if check is not None and spec.checker > 0:
        verdicts = check([(j.code, p.test) for j, p in zip(out, problems, strict=True)])
        for j, v in zip(out, verdicts, strict=True):
            j.passed, j.failure, j.verdict = bool(v["passed"]), v.get("failure"), str(v.get("verdict", ""))
            j.score = checker_score(v, spec.checker_score)
            if not j.stopped:
                j.passed, j.failure, j.score = False, TRUNCATED, 0.0
    for j, r in zip(out, rewards(out, [p.reference for p in problems], spec), strict=True):
        j.reward = r
    return out


# ---- the loss -----------------------------------------------------------------------------------------------

SUMS = ("loss_sum", "kl_sum", "answers", "tokens")


def grpo_terms(
    logp: Any, ref_logp: Any, old_logp: Any, mask: Any, advantages: Any, clip_epsilon: float, kl_coefficient: float
) -> tuple[Any, Any]:
    """(loss per answer, KL per answer): the per-token terms over [B, T] averaged over each answer's tokens."""
    import jax.numpy as jnp

    ratio = jnp.exp(logp - old_logp)
    a = advantages[:, None]
    policy = -jnp.minimum(ratio * a, jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon) * a)
    d = ref_logp - logp
    kl = jnp.exp(d) - d - 1.0
    count = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    per_answer = jnp.sum((policy + kl_coefficient * kl) * mask, axis=-1) / count
    return per_answer, jnp.sum(kl * mask, axis=-1) / count


def make_loss_fn(spec: GrpoSpec) -> Any:
    """The trainer's loss (PeftTrainer.with_loss_fn(..., has_aux=True)) for spec.method grpo; the batch is a
    rollout's rows (RolloutFeed) with each row's advantage. Every micro-batch holds whole groups of real
    answers, so Tunix's mean over micro-batches is the mean over the step's answers."""
    import jax
    import jax.numpy as jnp

    from tpuforge_workloads.families import attention
    from tpuforge_workloads.model import lora
    from tpuforge_workloads.model.loss import token_logps
    from tpuforge_workloads.train.preference import adapters_off

    def logps(model: Any, input_tokens: Any, positions: Any, attention_mask: Any) -> Any:
        with lora.adapters_in_compute_dtype(model):
            logits, _ = model(input_tokens, positions, None, attention.for_model(model, attention_mask))
        return token_logps(logits[:, :-1], input_tokens[:, 1:])

    def loss_fn(
        model: Any,
        input_tokens: Any,
        input_mask: Any,
        positions: Any,
        attention_mask: Any,
        loss_denominator: Any,
        advantages: Any,
        old_logps: Any = None,
    ) -> tuple[Any, dict[str, Any]]:
        mask = input_mask[:, 1:].astype(jnp.float32)
        logp = logps(model, input_tokens, positions, attention_mask)
        with adapters_off(model):
            ref = jax.lax.stop_gradient(logps(model, input_tokens, positions, attention_mask))
        # pi_old: the sampling policy's, kept with the rollout when it trains several steps (iterations > 1);
        # at one step per rollout the step's own forward is that policy.
        old = jax.lax.stop_gradient(logp) if old_logps is None else old_logps[:, :-1]
        per_answer, kl = grpo_terms(logp, ref, old, mask, advantages, spec.clip_epsilon, spec.kl_coefficient)
        real = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
        answers = jnp.sum(real)
        aux = {
            "loss_sum": jnp.sum(per_answer * real),
            "kl_sum": jnp.sum(kl * real),
            "answers": answers,
            "tokens": jnp.sum(mask),
        }
        return aux["loss_sum"] / jnp.maximum(answers, 1.0), aux

    return loss_fn


# ---- rollouts -----------------------------------------------------------------------------------------------


class RolloutSampler:
    """groupSize answers to each prompt, sampled at `temperature` from the model as it is (its LoRA weights of
    the step just taken), on the training mesh: train/decode.py's decode with its KV cache, compiled once per
    batch shape. `room`: the prompts' width (decode.prompt_room of every problem the run asks), so the steps
    share one compile."""

    def __init__(
        self, encoder: ChatEncoder, mesh: Any, length: int, max_new: int, temperature: float, seed: int, room: int = 0
    ):
        from tpuforge_workloads.train.decode import Decoder

        self.encoder = encoder
        self.length = length
        self.max_new = max_new
        self.temperature = temperature
        self.seed = seed
        self.room = room
        self.decoder = Decoder(mesh, max_new)

    def sample(self, model: Any, prompts: Sequence[np.ndarray], step: int, temperature: float | None = None) -> Any:
        """Token rows [len(prompts), length]: each prompt followed by its answer (then whatever the decode left
        there: read up to the answer's end, `answer_span`). Call under the run's mesh, on every process."""
        import jax

        from tpuforge_workloads.train.decode import left_padded, prompt_room

        pad = self.encoder.tokens.pad
        tokens, lengths = left_padded(prompts, prompt_room(prompts, self.room), pad)
        key = jax.random.fold_in(jax.random.key(self.seed), step)
        new = self.decoder(model, tokens, lengths, self.temperature if temperature is None else temperature, key)
        out = np.full((len(prompts), self.length), pad, np.int32)
        for row, p in enumerate(prompts):
            fits = min(self.max_new, self.length - len(p))
            out[row, : len(p)] = p
            out[row, len(p) : len(p) + fits] = new[row, :fits]
        return out

    def answer_span(self, row: np.ndarray, start: int) -> tuple[int, bool]:
        """(tokens of the answer from `start`, its stop token included; whether it stopped by itself)."""
        t = self.encoder.tokens
        for i in range(start, min(start + self.max_new, self.length)):
            if int(row[i]) in (t.turn_end, t.eos):
                return i - start + 1, True
        return min(self.max_new, self.length - start), False

    def text(self, row: np.ndarray, start: int, count: int) -> str:
        return str(self.encoder.tokenizer.decode(row[start : start + count].tolist(), skip_special_tokens=True)).strip()

    def answers(self, out: np.ndarray, problems: Sequence[RlProblem]) -> tuple[list[str], list[tuple[int, bool]]]:
        """(each row's answer text, its (token count, stopped)); row i answers problems[i]."""
        spans = [self.answer_span(out[i], len(p.tokens)) for i, p in enumerate(problems)]
        texts = [self.text(out[i], len(p.tokens), n) for i, (p, (n, _)) in enumerate(zip(problems, spans, strict=True))]
        return texts, spans


@dataclass
class Rollout:
    """One step's answers: the training rows and what the answers earned."""

    batch: dict[str, np.ndarray]  # input_tokens, input_mask, segment_ids, positions, loss_denominator, advantages
    judged: list[Judged]
    problems: list[RlProblem]
    response_tokens: list[int]
    rollout_seconds: float
    checker_seconds: float
    figures: dict[str, Any] = field(default_factory=dict)


def rollout(
    sampler: RolloutSampler,
    model: Any,
    problems: Sequence[RlProblem],
    spec: GrpoSpec,
    step: int,
    check: Callable[[Sequence[tuple[str, Any]]], list[dict[str, Any]]] | None,
    pad_id: int,
) -> Rollout:
    """groupSize answers to each of `problems` (rows problem by problem, its group together), judged, with
    their group-normalised advantages, as training rows of `sampler.length` tokens with the loss on the answers."""
    g = spec.group_size
    asked = [p for p in problems for _ in range(g)]
    started = time.monotonic()
    out = sampler.sample(model, [p.tokens for p in asked], step)
    answers, spans = sampler.answers(out, asked)
    rollout_s = time.monotonic() - started
    started = time.monotonic()
    judged = judge(answers, [s for _, s in spans], asked, check, spec.reward)
    checker_s = time.monotonic() - started if check is not None and spec.reward.checker > 0 else 0.0
    adv = group_advantages(np.array([j.reward for j in judged], np.float64).reshape(-1, g), spec.scale_rewards)
    rows = []
    for i, (p, (n, _)) in enumerate(zip(asked, spans, strict=True)):
        start = len(p.tokens)
        tokens = out[i, : start + n].astype(np.int32)
        mask = np.zeros(start + n, bool)
        mask[start:] = True
        rows.append(pad_example({"tokens": tokens, "loss_mask": mask}, sampler.length, pad_id))
    batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    batch["loss_denominator"] = np.ones(len(rows), np.float32)
    batch["advantages"] = adv.reshape(-1)
    return Rollout(batch, judged, list(asked), [n for n, _ in spans], rollout_s, checker_s)


def step_figures(r: Rollout) -> dict[str, Any]:
    """A step's figures: mean reward, pass rate, mean answer length, refusals, failures by category, the
    rollout's and the checker's seconds."""
    n = max(len(r.judged), 1)
    failures = Counter(j.failure for j in r.judged if j.failure is not None)
    return {
        "reward": sum(j.reward for j in r.judged) / n,
        "pass_rate": sum(j.passed for j in r.judged) / n,
        "response_tokens": sum(r.response_tokens) / n,
        "refused": int(failures.get("refused", 0)),
        "failures": dict(failures),
        "rollout_seconds": r.rollout_seconds,
        "checker_seconds": r.checker_seconds,
    }


def summary(sums: dict[str, float]) -> dict[str, float]:
    """Means over a step's answers of the loss's summed aux values: the GRPO loss and the KL to the base."""
    n = max(sums.get("answers", 0.0), 1.0)
    return {"loss": sums.get("loss_sum", 0.0) / n, "kl": sums.get("kl_sum", 0.0) / n}


def greedy_pass_rate(
    sampler: RolloutSampler,
    model: Any,
    problems: Sequence[RlProblem],
    check: Callable[[Sequence[tuple[str, Any]]], list[dict[str, Any]]],
    spec: RewardSpec,
    step: int = 0,
) -> tuple[float, list[Judged]]:
    """pass@1 of greedy answers to `problems` (the held-out split's), and the judged answers."""
    out = sampler.sample(model, [p.tokens for p in problems], step, temperature=0.0)
    spans = [sampler.answer_span(out[i], len(p.tokens)) for i, p in enumerate(problems)]
    answers = [
        sampler.text(out[i], len(p.tokens), n) for i, (p, (n, _)) in enumerate(zip(problems, spans, strict=True))
    ]
    judged = judge(answers, [s for _, s in spans], problems, check, spec)
    return (sum(j.passed for j in judged) / max(len(judged), 1)), judged


def prompt_order(problems: int, seed: int) -> Any:
    """The problems' indices, shuffled each epoch and repeated without end: a Grain iterator whose state (a
    position) the checkpoints save. (Unbatched: Grain's batch of an endless dataset fails for batches of 1.)"""
    import grain

    ds = grain.MapDataset.range(problems).shuffle(seed=seed).repeat(None)
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
