"""``adloco train``'s driver: the public algorithm objects (:mod:`adloco.library.method`) fed from a Config.

It builds what the library leaves to its user (data shards, the replicas and their inner optimizers,
the learning-rate schedule, b_max on CUDA), runs the rounds step by step, evaluates, turns each round's
report into events, prices simulated time, and assembles checkpoints from ``state_dict``s. The round
itself is the library's: there is no second copy of it here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adloco import events, netmodel
from adloco.config import Config
from adloco.data.sampling import ShardStream, trainer_subset
from adloco.data.tokens import Data
from adloco.engine.build import build_algorithm, fixed_rows
from adloco.engine.evaluation import evaluate, perplexity, spread
from adloco.engine.inner import agreed_inner, lr_at
from adloco.errors import UserError
from adloco.library.comm.base import Comm
from adloco.library.method import RoundAborted
from adloco.library.replica import Replica
from adloco.library.round import RoundReport, Traffic
from adloco.models import ModelFactory, sizing
from adloco.profile import AUTO, RoundSums, StepProfile
from adloco.telemetry import trace
from adloco.telemetry.metrics import MetricsSink
from adloco.telemetry.progress import Progress, Work


class TooManyBadRounds(RuntimeError):
    """``faults.max_bad_rounds`` consecutive rounds had a non-finite worker (θ itself stayed finite)."""


class Driver:
    def __init__(
        self,
        cfg: Config,
        comm: Comm,
        data: Data,
        factory: ModelFactory,
        device: torch.device,
        log: Callable[[str], None] = print,
        resumed_optimizer: str | None = None,
    ) -> None:
        self.cfg, self.comm, self.data, self.device, self.log = cfg, comm, data, device, log
        a, net = cfg.algorithm, cfg.network
        if net.emulate:  # wall time held back to the link simulated time prices (run_round's sim_s)
            comm.link = net.model()
        # Every trainer draws from its own subset, keyed by its id (a merge's survivor keeps its own).
        self.subsets = {
            t: trainer_subset(data.n_train, cfg.data.subset_fraction, a.seed, t) for t in range(a.trainers)
        }
        # b_max is never larger than a worker's shard (ALGORITHM.md §5).
        smallest_shard = max(1, min(len(x) for x in self.subsets.values()) // a.workers)
        configured = cfg.switch.b_max if cfg.switch.b_max is not None else 8
        if cfg.switch.b_max is not None and cfg.switch.b_max > smallest_shard:
            log(
                f"switch.b_max lowered to {smallest_shard}: with every worker on one trainer, a worker's shard "
                "holds no more blocks"
            )
        # the inner optimizer as every process builds it (its auto choices agreed: the first lines say them;
        # resumed_optimizer: what the checkpoint's run chose for inner.optimizer auto, which it goes on with)
        self.inner = agreed_inner(cfg.inner, comm, device.type, resumed_optimizer, cfg.model.task)
        built = dataclasses.replace(cfg, inner=self.inner)
        self.algo = build_algorithm(built, comm, factory, device, min(configured, smallest_shard), log)
        if device.type == "cuda" and cfg.switch.b_max is None:
            self._search_b_max(min(smallest_shard, cfg.batch.max))
        # the whole model's parameters (sharded: the worker's, not this rank's P/k)
        self.n_params = self.algo.view.parameters
        self.last_eval: dict[int, float] = {}
        self.last_accuracy: dict[int, float] = {}
        self.initial_metrics: dict[str, Any] = {}
        self.elapsed = 0.0  # seconds of training before this process started (a resumed run)
        self.sim_s = 0.0
        self.idle: list[float] = []  # every round's idle share
        self.restarts = 0  # restarts and resumes of this run so far
        self.rounds_lost = 0  # rounds trained, then lost with the processes that trained them
        # A run bounded by examples (algorithm.budget) indexes its learning-rate schedule by the examples
        # trained on (ALGORITHM.md §10), counted in inner steps of every worker at the initial request: a
        # constant batch's step index exactly, while a growing batch advances it faster, so methods that
        # saw the same examples share a point of it. A run bounded by rounds follows its steps: how many
        # examples a growing batch will see is not known in advance.
        self.lr_unit = a.workers * cfg.batch.initial
        # Simulated compute (ALGORITHM.md §11): each worker's measured seconds, or its steps priced by a
        # profile; with ``auto``, one fitted from this run's own worker rounds once they tell α from β.
        self.auto_profile = cfg.runtime.profile == AUTO
        self.auto_sums = RoundSums()  # what the fit needs of the run's worker rounds so far
        self._warm = False  # this process has trained a round (the first pays for warm-up)
        self.profile = (
            StepProfile.load(cfg.runtime.profile) if cfg.runtime.profile and not self.auto_profile else None
        )
        self.trained = 0  # examples in inner steps so far (probe rows are not steps)
        self.stop_requested: Callable[[], bool] = lambda: False  # set by whoever handles signals
        self.between_steps: Callable[[], object] = lambda: None  # before every inner step (the thread count)
        self.trace_dir: Path | None = None  # where logging.trace writes (the run directory's, on rank 0)
        # Dropout draws from the process's generators, which imports and model loading may have
        # advanced or reseeded by then: seed them from the run's seed and this rank, so a run is
        # reproducible (a resume restores them from its checkpoint instead).
        torch.manual_seed(a.seed * 1_000_003 + comm.rank)
        self._rng: list[torch.Tensor] = []

    @property
    def round(self) -> int:
        return self.algo.round

    @property
    def examples(self) -> int:
        """Training examples read so far (the driver runs the steps itself: always known)."""
        return self.algo.totals.examples or 0

    def _search_b_max(self, hi: int) -> None:
        """b_max on CUDA (ALGORITHM.md §5): the same search on every process, agreed through a gather.

        The workers of a process run their steps one after another, so one worker's activations at a
        time share the budget with every worker's persistent state: the optimizer state still to be
        allocated, what the batch test keeps (the probe's sum and, for the inner-product tests, its
        k chunk gradients: k·P float32 values per worker, 7.4 GiB for a 300M model with k = 8) and the
        error feedback of a compressed Δ (P float32 values per worker, ALGORITHM.md §9.4)."""
        from adloco.engine import memory
        from adloco.library.replica import rows, to_device

        algo, cfg, view = self.algo, self.cfg, self.algo.view
        w0 = view.workers[0]
        rep = view.replica(w0)
        free, _ = torch.cuda.mem_get_info(self.device)
        i, b, P = cfg.inner, cfg.batch, view.first.flat.numel
        buffers = sizing.optimizer_buffers(self.inner.optimizer, i.momentum)
        probe = view.plans[w0].probe
        kept = (
            0
            if probe is None or probe.keep == "none"
            else 1 + (b.probe_chunks if probe.keep == "chunks" else 0)
        )
        feedback = 1 if view.keeps_feedback else 0  # e_m (comm.error_feedback; topk's default)
        state_bytes = (buffers + kept + feedback) * 4 * P
        budget = cfg.switch.memory_fraction * free - (len(view.workers) - 1) * state_bytes
        if view.cuda_graphs:  # the workers step at once, each graph holding its activations: a share each
            budget = state_bytes + (budget - state_bytes) / len(view.workers)
        if budget - state_bytes <= 0:
            raise UserError(
                f"model: {len(view.workers)} worker(s) of {P / 1e6:.1f}M parameters need "
                f"{len(view.workers) * state_bytes / 2**30:.1f} GiB of optimizer, batch-test and error-feedback "
                f"state beyond the replicas, more than {cfg.switch.memory_fraction:g} of the {free / 2**30:.1f} GiB free on "
                f"{self.device}: use fewer workers per device (runtime.workers_per_process) or a smaller model"
            )
        full = self.data.train_batch(np.arange(hi) % self.data.n_train)

        def step(n: int) -> None:
            rep.flat.zero_grad()
            try:
                rep.forward_backward(to_device(rows(full, 0, n), self.device), 1.0)
            finally:
                rep.flat.zero_grad()

        found = memory.cuda_b_max(step, budget, state_bytes, hi, self.device)
        torch.cuda.reset_peak_memory_stats(self.device)  # the summary's peak is training's, not the search's
        algo.set_b_max(dict.fromkeys(view.workers, found))
        self.log(
            f"b_max {min(algo.b_max.values())}: the largest micro-batch under {cfg.switch.memory_fraction:g} of "
            f"free CUDA memory ({free / 2**30:.1f} GiB), beside {state_bytes / 2**30:.2f} GiB of optimizer, "
            f"batch-test and error-feedback state for each of {len(view.workers)} worker(s) (at most {hi})"
        )

    # -- evaluation --------------------------------------------------------------------------------
    def evaluate(self) -> dict[int, float]:
        """Validation loss of every trainer alive (and accuracy, for classification), evaluated by its
        first worker; returns the losses and keeps the accuracies in ``last_accuracy``."""
        algo, view = self.algo, self.algo.view
        members = algo.members()
        indices = spread(self.data.n_val, self.cfg.eval.max_examples)
        rows: dict[int, list[float]] = {w: [math.nan, math.nan] for w in view.workers}
        for t in algo.alive:
            leader = members[t][0]
            if leader in view.workers:
                with algo.holding_theta(leader):  # eager: the worker holds its own start, not θ_t
                    res = evaluate(
                        view.replica(leader).model,
                        self.data.val_batch,
                        indices,
                        self.cfg.eval.batch_size,
                        self.data.task,
                        amp=view.replica(leader).amp_dtype,  # under the run's precision, as training
                    )
                rows[leader] = [res.loss, math.nan if res.accuracy is None else res.accuracy]
        gathered = self.comm.all_gather_rows(rows, 2, "eval", counted=0)  # measurement, not training
        self.last_eval = {t: gathered[members[t][0]][0] for t in algo.alive}
        self.last_accuracy = {t: gathered[members[t][0]][1] for t in algo.alive}
        return self.last_eval

    def reported(self) -> int:
        """The trainer whose validation a round reports: the lowest id alive, trainer 0 (a merge's
        survivor is its lowest id, so trainer 0 lives to the end). Never the best of several on the split
        it reports: that would credit multi-trainer runs with a choice made on the validation data."""
        return min(self.algo.alive)

    def val_metrics(self, t: int) -> dict[str, float | None]:
        """val_loss and val_ppl (language modelling) or val_accuracy (classification) of trainer t."""
        loss = self.last_eval[t]
        if self.data.task == "classification":
            return {
                "val_loss": events.num(loss),
                "val_ppl": None,
                "val_accuracy": events.num(self.last_accuracy[t]),
            }
        return {"val_loss": events.num(loss), "val_ppl": events.num(perplexity(loss))}

    # -- one round ---------------------------------------------------------------------------------
    def run_round(self, on_step: Callable[[int, int], None] = lambda n, rows: None) -> list[events.Event]:
        """One round: the inner steps fed from every local worker's shard, the algorithm's sync, then
        evaluation when due. Returns the round's events; raises :class:`RoundAborted` on a signal."""
        algo, cfg = self.algo, self.cfg
        a = cfg.algorithm
        r = algo.round
        t_start = time.perf_counter()
        streams = {
            w: ShardStream(self.subsets[p.trainer], a.seed, p.trainer, r, p.index, p.of)
            for w, p in algo.view.plans.items()
        }
        total_steps = a.rounds * a.inner_steps
        self._rng = rng_state()
        trained = self.trained
        traced = self.trace_dir is not None and cfg.logging.trace == r + 1
        with trace.profiled(a.inner_steps, self.device) if traced else contextlib.nullcontext() as record:
            self._inner_steps(streams, total_steps, trained, on_step)
        if record is not None and self.trace_dir is not None:
            trace.write(
                record,
                self.trace_dir,
                f"round-{r + 1}",
                f"Round {r + 1}: {a.method}, {len(algo.view.workers)} worker(s) in this process, {self.device.type}",
            )
            self.log(f"trace of round {r + 1}: {self.trace_dir / f'round-{r + 1}.md'}")
        report = algo.last_report
        assert report is not None and report.round == r + 1
        final = algo.round == a.rounds or (a.budget is not None and self.examples >= a.budget)
        if final:  # sync.overlap: the last Δ lands now, behind nothing
            report = _with(report, algo.settle())
        train_s = time.perf_counter() - t_start
        net = cfg.network
        if self.auto_profile:
            self._fit_own_profile(report)
        compute = report.compute_s if self.profile is None else self.priced_compute(report)
        sim_s = netmodel.round_time(
            compute, report.collectives, net.bandwidth, net.latency, behind=report.behind, net=net.model()
        ).seconds
        self.sim_s += sim_s
        val = self.evaluate() if algo.round % cfg.eval.every == 0 or final else None
        out = report.events()
        summary = events.Round(
            round=algo.round,
            trainers_alive=algo.view.trainers_alive,
            requests={e.trainer: e.request for e in report.trainers},
            requests_next=algo.requests,
            allocation=algo.view.allocation,
            switch_mode=report.switch_mode,
            loss=report.loss,
            examples=report.examples or 0,
            examples_total=self.examples,
            bytes=report.bytes,
            bytes_total=algo.totals.bytes,
            communications=report.messages,
            communications_total=algo.totals.messages,
            round_s=time.perf_counter() - t_start,
            train_s=train_s,
            comm_s=report.comm_s,
            max_compute_s=max(report.compute_s.values()),
            collectives=report.collectives,
            collectives_behind=report.behind,
            behind_s=report.behind_s,
            wait_s=report.wait_s,
            sim_s=sim_s,
            sim_total_s=self.sim_s,
            idle_share=report.idle_share,
        )
        self.idle.append(report.idle_share)
        if val is not None:
            shown = self.val_metrics(self.reported())
            summary.val_loss, summary.val_ppl = shown["val_loss"], shown["val_ppl"]
            summary.val_accuracy = shown.get("val_accuracy")
            summary.val_by_trainer = {t: self.val_metrics(t) for t in val}
            out += [events.Eval(round=algo.round, trainer=t, **self.val_metrics(t)) for t in val]
        out.append(summary)
        return out

    def lr_position(self, h: int = 0) -> float:
        """Where the inner lr schedule stands at step ``h`` of this round: with a budget, the examples
        trained so far in units of a step at the initial request (ALGORITHM.md §10), else the step index."""
        a = self.cfg.algorithm
        return self.trained / self.lr_unit if a.budget is not None else self.algo.round * a.inner_steps + h

    def _inner_steps(
        self,
        streams: dict[int, ShardStream],
        total_steps: int,
        trained: int,
        on_step: Callable[[int, int], None],
    ) -> None:
        """The round's H inner steps (the last one synchronizes), fed from every local worker's shard."""
        algo, cfg = self.algo, self.cfg
        a = cfg.algorithm
        for h in range(a.inner_steps):
            lr = lr_at(self.lr_position(h), total_steps, cfg.inner)
            for rep in map(algo.view.replica, algo.view.workers):
                for group in rep.optimizer.param_groups:  # Muon's groups: lr × inner.muon_lr_ratio
                    group["lr"] = lr * group.get("lr_ratio", 1.0)
            batches = {
                w: self.data.train_batch(streams[w].take(algo.batch_size(w))) for w in algo.local_workers
            }
            rows = algo.step_rows  # this round's plan: every worker's rows in one step
            self.between_steps()
            try:
                algo.step_all(batches, stop=self.stop_requested())
            except RoundAborted:
                set_rng_state(self._rng)
                self.trained = trained
                raise
            self.trained += rows
            on_step(len(batches), rows)  # rows: every worker's, this step

    def _probe_passes(self, report: RoundReport) -> dict[int, int]:
        """worker -> forward and backward passes the gradient probe took in its first step."""
        passes = {}
        for t in report.trainers:
            if t.samples:
                k = max(1, round(t.samples / len(t.workers)))
                passes.update({w: k for w in t.workers})
        return passes

    def _fit_own_profile(self, report: RoundReport) -> None:
        """``runtime.profile: auto``: add the round's worker rounds to the run's own and refit α, β, δ on
        all of them (plain float arithmetic: every rank gets the same bits, so shares agree); until the
        rounds tell a step's fixed cost from its cost per row (several micro-batch sizes), compute stays
        measured and rows are shared by rows alone. The first round a process trains is left out: it pays
        for allocations and warm-up that no later step pays."""
        warm, self._warm = self._warm, True
        if not warm:
            return
        emulate, probe = self.algo.view.emulate, self._probe_passes(report)
        for e in report.workers:
            eff = e.micro * e.accum
            steps = (e.examples or 0) // eff if eff else 0
            passes = steps * e.accum + max(0, probe.get(e.worker, 0) - e.accum)
            seconds = e.compute_s * (emulate[e.worker] if emulate else 1.0)  # on the device, not emulated
            self.auto_sums.add(seconds, steps, passes, (e.examples or 0) + e.probe_examples)
        self._refit()

    def _refit(self) -> None:
        try:
            prof = self.auto_sums.fit("runtime.profile auto", " of this run (runtime.profile auto)")
        except UserError:
            return
        self.profile = dataclasses.replace(
            prof,
            device=str(self.device),
            torch=torch.__version__,
            model=self.cfg.model.name or "",
            seq_len=self.cfg.data.seq_len,
            b_max=min(self.algo.b_max.values()),  # what every worker fits
        )
        self.algo.fixed_rows = fixed_rows(self.profile)

    def priced_compute(self, report: RoundReport) -> dict[int, float]:
        """Every worker's compute in the round priced by the profile: its steps at the micro-batches it ran,
        and the passes and rows the gradient probe added to its first step (ALGORITHM.md §11), on a device
        ``runtime.emulate_speed`` times as fast as the profiled one."""
        assert self.profile is not None
        emulate, passes = self.algo.view.emulate, self._probe_passes(report)
        out = {}
        for e in report.workers:
            eff = e.micro * e.accum
            steps = (e.examples or 0) // eff if eff else 0
            extra = max(0, passes.get(e.worker, 0) - e.accum)
            seconds = self.profile.worker_seconds(steps, e.micro, e.accum, extra, e.probe_examples)
            out[e.worker] = seconds / (emulate[e.worker] if emulate else 1.0)
        return out

    # -- whole run ---------------------------------------------------------------------------------
    def run(
        self,
        sink: MetricsSink,
        progress: Progress,
        after_round: Callable[[bool], None] = lambda final: None,
    ) -> events.Summary:
        """Train until ``algorithm.rounds`` (or the budget); ``after_round(final)`` runs after every round
        is logged (the checkpoint hook). A restored driver continues from its round."""
        a, algo = self.cfg.algorithm, self.algo
        t0 = time.perf_counter() - self.elapsed
        budget = a.budget or math.inf
        if not self.initial_metrics:
            self.evaluate()
            self.initial_metrics = self.val_metrics(self.reported())
            sink.log(
                events.Start(
                    round=0,
                    parameters=self.n_params,
                    workers=a.workers,
                    trainers=a.trainers,
                    allocation=algo.view.allocation,
                    task=self.data.task,
                    train_examples=self.data.n_train,
                    val_examples=self.data.n_val,
                    processes=self.comm.world,
                    threads_per_process=torch.get_num_threads(),
                    **self.initial_metrics,
                ).to_dict()
            )
        b = self.cfg.batch
        grows = b.test != "none" or b.schedule != "none"
        work = Work(a.rounds, a.inner_steps, a.workers, b.max, grows, a.budget)
        progress.start(a.rounds, a.inner_steps * len(algo.view.workers), self.initial_metrics, work)
        while algo.round < a.rounds and self.examples < budget:
            progress.round_started(algo.round + 1)
            out = self.run_round(progress.step)
            for e in out:
                sink.log(e.to_dict())
            progress.round_done(out[-1].to_dict())
            self.elapsed = time.perf_counter() - t0
            failing = algo.bad_rounds >= self.cfg.faults.max_bad_rounds
            after_round(algo.round == a.rounds or self.examples >= budget or failing)
            if failing:
                raise TooManyBadRounds(
                    f"round {algo.round}: {algo.bad_rounds} rounds in a row with a non-finite worker loss or "
                    "update (faults.max_bad_rounds); lower inner.lr or inner.clip"
                )
        progress.close()
        self.elapsed = time.perf_counter() - t0
        return self.summary()

    def summary(self, stopped: str | None = None) -> events.Summary:
        """The run as it stands after its last whole round (``summary.json``): a finished run's, or, with
        ``stopped`` (the signal's name), one a signal stopped (its round in progress undone)."""
        a, algo = self.cfg.algorithm, self.algo
        if not self.last_eval:
            self.evaluate()
        shown = self.reported()
        final = self.val_metrics(shown)
        cls = self.data.task == "classification"
        return events.Summary(
            method=a.method,
            rounds=algo.round,
            initial_val_ppl=self.initial_metrics.get("val_ppl"),
            final_val_ppl=final["val_ppl"],
            final_val_loss=final["val_loss"],
            trainers_final=algo.view.trainers_alive,
            requests_final=algo.requests,
            examples_total=self.examples,
            communications_total=algo.totals.messages,
            bytes_total=algo.totals.bytes,
            bytes_by_kind=dict(sorted(algo.totals.by_kind.items())),
            wall_s=self.elapsed,
            sim_s=self.sim_s,
            peak_memory_bytes=_peak_memory(self.device),
            reported_trainer=shown,
            idle_share=sum(self.idle) / len(self.idle) if self.idle else 0.0,
            restarts=self.restarts,
            rounds_lost=self.rounds_lost,
            initial_val_accuracy=self.initial_metrics.get("val_accuracy") if cls else None,
            final_val_accuracy=final.get("val_accuracy") if cls else None,
            stopped=stopped,
        )

    def fingerprint(self) -> str:
        """The model's parameter names and shapes, hashed: a checkpoint must match them."""
        model = self.algo.view.first.model
        text = ";".join(f"{n}:{tuple(p.shape)}" for n, p in model.named_parameters())
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @contextlib.contextmanager
    def _holding(self, t: int) -> Iterator[Replica | None]:
        """For the block, this process's first replica holding trainer t's θ where the root has it (a
        sharded worker: each of its ranks, its shard), None elsewhere; its own start put back after.
        Every process enters it."""
        theta = self.algo.gather_parameters(t)
        if theta is None:
            yield None
            return
        w = self.algo.local_workers[0]
        rep = self.algo.view.replica(w)
        rep.load(theta)
        rep.flat.push()
        try:
            yield rep
        finally:
            rep.load(self.algo.start_of(w))

    def trainer_state_dict(self, t: int) -> dict[str, torch.Tensor] | None:
        """Trainer t's parameters as a model state dict, on the root rank (None elsewhere); every process calls it."""
        with self._holding(t) as rep:
            return None if rep is None else rep.flat.clone_state_dict()

    def save_trainer(self, t: int, path: Path | None, tokenizer: Any, max_file_bytes: int) -> None:
        """Trainer t's model and ``tokenizer`` as a Hugging Face folder at ``path`` (the rank that writes;
        None elsewhere), streamed a parameter at a time (:mod:`adloco.models.export`): a sharded model is
        never whole in one process. Every process calls it."""
        from adloco.models import export

        with self._holding(t) as rep:
            if rep is not None:
                export.save(rep.model, tokenizer, path, max_file_bytes)

    # -- the driver's own state (a checkpoint's ``driver`` component: adloco.engine.checkpoint.state) --
    def state_dict(self) -> dict[str, Any]:
        """The run's progress: what the algorithm object does not hold."""
        return {
            "initial_metrics": self.initial_metrics,
            "last_eval": {str(t): v for t, v in self.last_eval.items()},
            "last_accuracy": {str(t): v for t, v in self.last_accuracy.items()},
            "elapsed_s": self.elapsed,
            "sim_s": self.sim_s,
            "idle": self.idle,
            "restarts": self.restarts,
            "rounds_lost": self.rounds_lost,
            "trained": self.trained,
            "lr_unit": self.lr_unit,
            "auto_profile": self.auto_sums.to_dict(),
            "model": self.fingerprint(),
            "processes": self.comm.world,
            "inner_optimizer": self.inner.optimizer,  # what inner.optimizer auto chose, which a resume keeps
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.initial_metrics = dict(d["initial_metrics"])
        self.last_eval = {int(t): float(v) for t, v in d["last_eval"].items()}
        self.last_accuracy = {int(t): float(v) for t, v in d["last_accuracy"].items()}
        self.elapsed = float(d["elapsed_s"])
        self.sim_s = float(d.get("sim_s", 0.0))
        self.idle = [float(x) for x in d.get("idle", [])]
        self.restarts = int(d.get("restarts", 0))
        self.rounds_lost = int(d.get("rounds_lost", 0))
        self.lr_unit = int(d.get("lr_unit", self.lr_unit))
        if self.auto_profile:  # the run's own profile as it stood: the same shares and prices as before
            self.auto_sums = RoundSums.from_dict(d["auto_profile"]) if "auto_profile" in d else RoundSums()
            self._refit()
        # a checkpoint from before the schedule counted examples: its rounds at the initial request
        self.trained = int(d.get("trained", self.algo.round * self.cfg.algorithm.inner_steps * self.lr_unit))


def _with(report: RoundReport, more: Traffic) -> RoundReport:
    """The round's report with what :meth:`~adloco.library.method.AdLoCo.settle` communicated after it."""
    if not more.messages and not more.bytes:
        return report
    return dataclasses.replace(
        report,
        bytes=report.bytes + more.bytes,
        messages=report.messages + more.messages,
        comm_s=report.comm_s + more.comm_s,
        collectives=report.collectives + more.collectives,
        behind=report.behind + more.behind,
        behind_s=report.behind_s + more.behind_s,
        wait_s=report.wait_s + more.wait_s,
    )


def _peak_memory(device: torch.device) -> int:
    """Peak memory of this process: CUDA allocations on a GPU, resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def rng_state() -> list[torch.Tensor]:
    """This process's torch generators (dropout draws from them): CPU, then its current CUDA device."""
    out = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.append(torch.cuda.get_rng_state())
    return out


def set_rng_state(states: list[torch.Tensor]) -> None:
    if not states:
        return
    torch.set_rng_state(states[0].contiguous())
    if len(states) > 1:
        torch.cuda.set_rng_state(states[1].contiguous())
