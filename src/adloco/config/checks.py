"""Rules across sections, checked once the sections are built: every trainer has a worker, the layout of
workers over processes, one emulated speed per worker, and that a preset model fits where it will run;
and, once, by the process that trains (:func:`check_placement`), what the config asks of this machine: a
backend of several processes for sharded workers, a CUDA device, mixed precision and CUDA graphs on it,
the metrics sinks' packages.
Each is one :class:`~adloco.errors.UserError` naming the field, the value and what is allowed."""

from __future__ import annotations

import os
from typing import Any

from adloco.config.schema import Config
from adloco.errors import UserError
from adloco.library.fields import check_speeds
from adloco.library.settings import OUTER_PRESETS
from adloco.models import sizing
from adloco.profile import StepProfile


def _need(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise UserError(f"config: {name} = {value!r}: must be {allowed}")


def check_plan(cfg: Config) -> None:
    """The rules of a run that ``adloco simulate`` prices without running it: the algorithm's sections
    between themselves and the links, not this machine (its memory, devices, checkpoint location)."""
    a = cfg.algorithm
    _need(
        a.trainers <= a.workers,
        "algorithm.trainers",
        a.trainers,
        f"<= algorithm.workers ({a.workers}): every trainer needs at least one worker",
    )
    check_sites(cfg.network.sites, a.workers)
    try:
        cfg.sync.check_round(a.inner_steps, a.method == "ddp", cfg.comm)
        cfg.comm.check_codec(cfg.batch, a.method == "ddp")
    except ValueError as exc:
        raise UserError(f"config: {exc}") from None


def check(cfg: Config, resuming: bool = False) -> None:
    """``resuming``: a run that continues may have more trainers than workers (they merge, ALGORITHM.md
    §9.2)."""
    a, rt = cfg.algorithm, cfg.runtime
    _need(
        resuming or a.trainers <= a.workers,
        "algorithm.trainers",
        a.trainers,
        f"<= algorithm.workers ({a.workers}): every trainer needs at least one worker",
    )
    _need(
        a.workers % rt.workers_per_process == 0,
        "runtime.workers_per_process",
        rt.workers_per_process,
        f"a divisor of algorithm.workers ({a.workers})",
    )
    if rt.shards > 1:  # a worker spans several processes (ALGORITHM.md §12)
        _need(
            rt.workers_per_process == 1,
            "runtime.workers_per_process",
            rt.workers_per_process,
            "1 with runtime.shards > 1 (a worker spans processes, not the other way round)",
        )
        _need(
            rt.backend != "inprocess",
            "runtime.backend",
            rt.backend,
            "torchdist or auto with runtime.shards > 1 (shards are processes: adloco train --nproc N)",
        )
        _need(
            cfg.model.precision != "fp16",
            "model.precision",
            cfg.model.precision,
            "fp32 or bf16 with runtime.shards > 1 (fp16's loss scaling is not shared across a worker's ranks)",
        )
        _need(
            a.method != "ddp",
            "algorithm.method",
            a.method,
            "adloco, diloco or localsgd with runtime.shards > 1",
        )
    check_sites(cfg.network.sites, a.workers)
    check_checkpoint_dir(cfg.checkpoint.dir)
    check_compute(cfg)
    check_wd_scaling(cfg)
    outer = outer_state(cfg)
    try:
        cfg.sync.check_round(a.inner_steps, a.method == "ddp", cfg.comm)
        cfg.comm.check_codec(cfg.batch, a.method == "ddp")
        check_speeds(rt.emulate_speed, a.workers)
    except ValueError as exc:
        raise UserError(f"config: {exc}") from None
    if rt.profile is not None and rt.profile != "auto":  # read now: a run must not fail at its first round
        StepProfile.load(rt.profile, where=f"config: runtime.profile = {rt.profile!r}")
    check_memory(cfg, outer)


def outer_state(cfg: Config) -> tuple[float, str]:
    """Bytes of outer state each trainer keeps per value of θ, for the memory estimate, and "" or why it is
    not counted. A preset's is known (:func:`adloco.models.sizing.outer_buffers`); a factory named as
    ``outer.optimizer`` (``module:function``, imported when its section was built) is tried once over a
    small θ (:func:`adloco.library.algorithms.outer.state_bytes`): what it returns if not a ``torch.optim.Optimizer``
    is refused now rather than at the first outer step, and where it cannot take a θ not its model's, its
    state is not counted (said with a refusal of the estimate). DDP takes no outer step."""
    name = str(cfg.outer.optimizer)
    if cfg.algorithm.method == "ddp":
        return 0.0, ""
    if name in OUTER_PRESETS:
        return float(sizing.outer_buffers(name) * sizing.FLOAT), ""
    from adloco.library.algorithms.outer import NotAnOptimizer, state_bytes

    try:
        return state_bytes(cfg.outer.factory), ""  # type: ignore[arg-type]
    except NotAnOptimizer as exc:
        raise UserError(f"config: outer.optimizer = {name!r}: {exc.reason}") from None
    except Exception as exc:  # the factory's own code, on a θ that is not its model's: left to the run
        return (
            0.0,
            f"outer.optimizer {name}'s state not counted: its probe failed ({type(exc).__name__}: {exc})",
        )


def check_checkpoint_dir(where: str) -> None:
    """``checkpoint.dir``: a path, or a URL whose filesystem fsspec knows and can load here."""
    if "://" not in where:
        return
    import fsspec

    protocol = where.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise UserError(
            f"config: checkpoint.dir = {where!r}: no filesystem for {protocol!r} (a path, or a URL fsspec "
            f"knows: file://, memory://, s3://, gs://, ...)"
        ) from None
    except ImportError as exc:
        raise UserError(
            f"config: checkpoint.dir = {where!r}: the filesystem for {protocol!r} needs a package that is not "
            f"installed ({exc})"
        ) from None


def check_wd_scaling(cfg: Config) -> None:
    """batch.wd_scaling timescale: it scales a weight decay there is, outside a CUDA graph."""
    if cfg.batch.wd_scaling == "none":
        return
    _need(
        cfg.inner.weight_decay > 0,
        "batch.wd_scaling",
        cfg.batch.wd_scaling,
        "none with inner.weight_decay = 0 (there is no weight decay to scale)",
    )
    _need(
        cfg.runtime.cuda_graphs is not True,
        "runtime.cuda_graphs",
        cfg.runtime.cuda_graphs,
        "false or auto with batch.wd_scaling timescale (a captured step keeps the weight decay it was captured with)",
    )


def check_compute(cfg: Config) -> None:
    """runtime.cuda_graphs and runtime.compile: the combinations that cannot work (ALGORITHM.md §14). Only
    ``cuda_graphs: true`` is refused; ``auto`` turns itself off for them (:func:`cuda_graphs_choice`)."""
    rt, a = cfg.runtime, cfg.algorithm
    if rt.cuda_graphs is True:
        _need(
            cfg.model.precision != "fp16",
            "model.precision",
            cfg.model.precision,
            "fp32 or bf16 with runtime.cuda_graphs (fp16's loss scaling decides on the host whether a step is "
            "skipped)",
        )
        _need(
            a.method != "ddp",
            "algorithm.method",
            a.method,
            "adloco, diloco or localsgd with runtime.cuda_graphs (DDP averages gradients inside the step)",
        )
        _need(
            rt.shards == 1,
            "runtime.shards",
            rt.shards,
            "1 with runtime.cuda_graphs (a sharded step runs collectives)",
        )
        _need(rt.device != "cpu", "runtime.device", rt.device, "auto or cuda with runtime.cuda_graphs")
        _need(
            not (rt.compile and rt.compile_mode in ("reduce-overhead", "max-autotune")),
            "runtime.compile_mode",
            rt.compile_mode,
            "default or max-autotune-no-cudagraphs with runtime.cuda_graphs (the other modes capture graphs of "
            "their own)",
        )
    if rt.compile:
        _need(
            rt.shards == 1,
            "runtime.shards",
            rt.shards,
            "1 with runtime.compile (the engine does not compile a model sharded with FSDP2)",
        )
        from torch._dynamo import list_backends

        shown = sorted({*list_backends(), "aot_eager", "eager"})
        _need(
            rt.compile_backend in list_backends(exclude_tags=()),
            "runtime.compile_backend",
            rt.compile_backend,
            f"a backend of torch.compile ({', '.join(shown)})",
        )


# What keeps a captured step from working, in the order runtime.cuda_graphs: auto names them (the
# first that holds is the reason it gives): (holds, what the run's line says)
def _graph_obstacles(cfg: Config) -> list[tuple[bool, str]]:
    rt = cfg.runtime
    return [
        (rt.device == "cpu", "runtime.device cpu"),
        (cfg.model.precision == "fp16", "model.precision fp16: its loss scaling decides on the host"),
        (cfg.algorithm.method == "ddp", "algorithm.method ddp: gradients are averaged inside the step"),
        (rt.shards > 1, f"runtime.shards {rt.shards}: a sharded step runs collectives"),
        (
            rt.compile and rt.compile_mode in ("reduce-overhead", "max-autotune"),
            f"runtime.compile_mode {rt.compile_mode}: it captures CUDA graphs of its own",
        ),
        (
            cfg.batch.wd_scaling != "none",
            f"batch.wd_scaling {cfg.batch.wd_scaling}: a captured step keeps its weight decay",
        ),
    ]


def cuda_graphs_choice(cfg: Config, cuda: bool) -> tuple[bool, str]:
    """Whether a run whose process is on CUDA (``cuda``) captures its workers' steps, and why, in words
    (ALGORITHM.md §14): ``runtime.cuda_graphs`` true or false as written (true where it cannot work is
    refused before, by :func:`check` and :func:`check_placement`); ``auto``: on where the process is on
    CUDA and nothing the engine refuses with graphs is set, else off, naming the first obstacle."""
    rt = cfg.runtime
    if rt.cuda_graphs != "auto":
        return bool(rt.cuda_graphs), f"runtime.cuda_graphs: {str(rt.cuda_graphs).lower()}"
    if not cuda:
        return False, "auto: " + ("runtime.device cpu" if rt.device == "cpu" else "no CUDA")
    why = next((what for holds, what in _graph_obstacles(cfg) if holds), None)
    return (False, f"auto: {why}") if why else (True, "auto: CUDA")


def check_memory(cfg: Config, outer: tuple[float, str] = (0.0, "")) -> None:
    """Refuse a config whose preset model cannot fit where it will run (a checkpoint's size is known only
    once it is loaded): one line naming the field that makes it too large, the estimate and the memory.
    ``outer``: each trainer's outer state per value of θ and why it is not counted (:func:`outer_state`)."""
    shape = sizing.SHAPES.get(cfg.model.name)
    if shape is None:
        return
    a, d, b, s, rt = cfg.algorithm, cfg.data, cfg.batch, cfg.switch, cfg.runtime
    bpe = d.tokenizer.startswith("bpe:") and d.tokenizer[4:].isdigit()
    vocab = int(d.tokenizer[4:]) if bpe else 0  # another tokenizer's size is known once it is loaded
    logits = vocab if cfg.model.task == "causal_lm" else 0
    n_params = sizing.llama_parameters(shape, vocab)
    layers = int(shape["num_hidden_layers"])
    # Replicas where the run puts them: in-process every worker in this process; under torchrun each
    # process hosts workers_per_process (and LOCAL_WORLD_SIZE processes share this machine). An --nproc
    # parent resolves in-process, and its children all run here.
    inprocess = rt.backend == "inprocess" or (rt.backend == "auto" and "WORLD_SIZE" not in os.environ)
    per_process = a.workers if inprocess else rt.workers_per_process
    here = per_process * (1 if inprocess else int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    # The largest micro-batch the run may form: requests grow to batch.max unless the test and the
    # schedule are off, and a worker runs at most b_max rows at once (null: 8 on CPU, searched on CUDA).
    grows = b.test != "none" or b.schedule != "none"
    request = b.max if grows else b.initial
    b_max = s.b_max if s.b_max is not None else (8 if rt.device == "cpu" else 1)
    micro = min(request, b_max)
    eval_rows = min(cfg.eval.batch_size, cfg.eval.max_examples or cfg.eval.batch_size)
    # The inner-product tests with the pooled estimator keep a gradient per probe chunk: k of them, k the
    # request's examples up to batch.probe_chunks (probe_chunks single examples when a request is 1).
    kept = b.test in ("inner_product", "augmented_inner_product") and b.estimator == "pooled"
    chunks = (min(request, b.probe_chunks) if request >= 2 else b.probe_chunks) if kept else 0

    def at(replicas: int) -> tuple[sizing.Estimate, sizing.Estimate]:
        opt = (cfg.inner.optimizer, cfg.inner.momentum, min(a.trainers, replicas), layers)
        per_token = sizing.activation_bytes_per_token(shape, logits)
        fb = cfg.comm.feedback  # an error-feedback P-vector per replica
        train = sizing.estimate(
            n_params, replicas, *opt, micro, request, d.seq_len, per_token, chunks, fb, *outer
        )
        val = sizing.estimate(n_params, replicas, *opt, feedback=fb, outer_state=outer[0], uncounted=outer[1])
        # validation keeps no activations, but a whole batch's logits and their log-softmax
        step = eval_rows * d.seq_len * 2 * sizing.FLOAT * logits
        return train, sizing.Estimate(replicas, n_params, val.state, step, uncounted=val.uncounted)

    train, val = at(here)
    available, where = sizing.physical_memory(), "this machine has"
    if max(train.total, val.total) > available and rt.device != "cpu":
        gpu = sizing.cuda_memory()  # the replicas may live on a GPU with more memory than this machine
        if gpu is not None:
            (train, val), available, where = at(per_process), gpu, "the GPU has"
    name = cfg.model.name
    if train.state > available:
        if chunks > 2 + sizing.optimizer_buffers(cfg.inner.optimizer, cfg.inner.momentum):
            field, value = (
                ("batch.probe_chunks", b.probe_chunks) if chunks == b.probe_chunks else ("batch.max", b.max)
            )
        else:
            field, value = "algorithm.workers", a.workers
        sizing.refuse_if_over(train, available, where, field, value, name)
    if micro <= d.seq_len:
        field, value = "data.seq_len", d.seq_len
    elif s.b_max is not None and s.b_max < request:
        field, value = "switch.b_max", s.b_max
    else:
        field, value = ("batch.max", b.max) if grows else ("batch.initial", b.initial)
    what = f"a micro-batch of {micro:,} x {d.seq_len:,} tokens through {name}"
    sizing.refuse_if_over(train, available, where, field, value, what)
    what = f"a validation batch of {eval_rows:,} x {d.seq_len:,} tokens through {name}"
    sizing.refuse_if_over(val, available, where, "eval.batch_size", cfg.eval.batch_size, what)


def check_sites(sites: list[int], workers: int) -> None:
    """``network.sites``: empty, or workers per site summing to the run's workers."""
    _need(
        not sites or sum(sites) == workers,
        "network.sites",
        sites,
        f"empty or workers per site summing to algorithm.workers ({workers}), in worker order",
    )


def check_layout(workers: int, processes: int, workers_per_process: int, shards: int, flexible: bool) -> None:
    """The layout of workers over ``processes`` (``flexible``: a resumed or elastic run, whose workers
    follow its processes): one line and exit 2 before anything starts when it cannot work."""
    if shards > 1:  # a worker is `shards` processes (ALGORITHM.md §12)
        if processes % shards:
            raise UserError(
                f"config: runtime.shards = {shards}: must divide the number of processes ({processes}): each "
                "worker is runtime.shards processes"
            )
        if workers * shards != processes and not flexible:
            raise UserError(
                f"config: algorithm.workers = {workers}: must equal processes ({processes}) / runtime.shards "
                f"({shards}) = {processes // shards}"
            )
    elif workers != processes * workers_per_process and not flexible:
        raise UserError(
            f"config: algorithm.workers = {workers}: must equal processes ({processes}) x "
            f"runtime.workers_per_process ({workers_per_process})"
        )


def uses_cuda(device: str) -> bool:
    """Whether ``runtime.device`` puts this process on CUDA (``auto``: when a CUDA device is available)."""
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def check_placement(cfg: Config, world: int | None, flexible: bool = False) -> None:
    """What the config asks of the processes and the machine a run trains on, checked by ``adloco train``
    once, before it builds anything: ``world`` is the number of processes torchrun (or ``--nproc``)
    started, None without a launcher; ``flexible``: a resumed or elastic run, whose workers follow its
    processes. Not part of :func:`check`: a config for a GPU may still be printed (``adloco config``) or
    read back (``adloco analyze-gradients``) where there is none."""
    rt = cfg.runtime
    backend = rt.backend if rt.backend != "auto" else ("torchdist" if world is not None else "inprocess")
    if rt.shards > 1 and backend != "torchdist":
        raise UserError(
            f"config: runtime.shards = {rt.shards}: a sharded worker is several processes: start with "
            "adloco train --nproc N (or torchrun), N = algorithm.workers x runtime.shards"
        )
    if backend == "torchdist":
        if world is None:
            raise UserError(
                "config: runtime.backend = 'torchdist': start with `torchrun --nproc-per-node N -m adloco "
                "train ...` or `adloco train --nproc N ...`"
            )
        check_layout(cfg.algorithm.workers, world, rt.workers_per_process, rt.shards, flexible)
    if rt.device == "cuda" and not uses_cuda("auto"):
        raise UserError("config: runtime.device = 'cuda': no CUDA device is available (use 'auto' or 'cpu')")
    from adloco.telemetry.metrics import check_sinks

    check_sinks(cfg.logging)  # a metrics sink set on whose package is missing
    if rt.cuda_graphs is True and not uses_cuda(rt.device):
        raise UserError(
            "config: runtime.cuda_graphs = True: CUDA graphs need CUDA (this run is on cpu); use auto or false"
        )
    if cfg.model.precision != "fp32" and not uses_cuda(rt.device):
        raise UserError(
            f"config: model.precision = {cfg.model.precision!r}: mixed precision needs CUDA (this run is on "
            "cpu); use fp32"
        )
