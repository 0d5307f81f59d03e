"""The algorithm object of a config (``adloco train``): each worker's replica built per trainer (one
seed, or one per trainer; sharded workers start from their shards, ALGORITHM.md §12), compiled when asked
(by block or whole, :mod:`adloco.engine.compiling`; ALGORITHM.md §14), with its inner optimizer on the
flat parameter groups; the method's class with the config's dials.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from adloco.config import Config
from adloco.config.checks import cuda_graphs_choice
from adloco.engine import compiling
from adloco.engine.inner import make_optimizer
from adloco.errors import UserError
from adloco.library.baselines import METHOD_CLASSES
from adloco.library.comm.base import Comm
from adloco.library.flat import flatten
from adloco.library.method import AdLoCo
from adloco.library.options import RoundOptions, config_key
from adloco.models import ModelFactory, shard
from adloco.profile import AUTO, StepProfile


def build_replicas(
    cfg: Config,
    comm: Comm,
    factory: ModelFactory,
    device: torch.device,
    log: Callable[[str], None] = lambda _: None,
) -> list[torch.nn.Module]:
    """The replicas of this process's workers (``comm.local_workers``), each built as its starting trainer's
    model: one seed for every trainer (``model.init: same``) or one per trainer, with the output layer
    redrawn from the trainer's seed if asked. Sharded workers (``runtime.shards > 1``, ALGORITHM.md §12)
    start sharded: each rank holds only its rows of the values an unsharded run starts from
    (``ModelFactory.build_sharded``); a model whose initialization cannot be replayed (a checkpoint) is
    built whole, then sharded, said once through ``log``."""
    a, b, m = cfg.algorithm, cfg.batch, cfg.merge
    from adloco.library.algorithms import allocation

    trainers = min(a.trainers, a.workers)  # a run continuing on fewer workers merges down to them
    start = allocation.allocate(dict.fromkeys(range(trainers), b.initial), a.workers, mode=m.allocation)

    def seeds(t: int) -> tuple[int, int]:
        """Trainer t's build seed and its own seed (the output layer's, with model.reinit_output)."""
        seed_t = a.seed if cfg.model.init == "same" else a.seed + 7919 * (t + 1)
        return (a.seed if cfg.model.init == "same" else seed_t), seed_t

    replicas: list[torch.nn.Module] = []
    if comm.shards.size > 1:  # this rank's shards of the worker's replica (ALGORITHM.md §12)
        from adloco.models.meta import NotReplayable

        try:
            for w in comm.local_workers:
                seed, seed_t = seeds(start[w])
                output_seed = seed_t if cfg.model.reinit_output else None
                replicas.append(factory.build_sharded(seed, comm.mesh["shard"], device, output_seed))
        except NotReplayable as exc:
            log(
                f"runtime.shards = {comm.shards.size}: every rank builds the whole model, then shards it ({exc})"
            )
            replicas = []
        if replicas:
            return replicas
    proto = factory.build(a.seed)
    inits: dict[int, torch.nn.Module] = {}
    for t in sorted({start[w] for w in comm.local_workers}):
        seed, seed_t = seeds(t)
        model = copy.deepcopy(proto) if cfg.model.init == "same" else factory.build(seed)
        if cfg.model.reinit_output:
            factory.reinit_output(model, seed_t)
        inits[t] = model
    for w in comm.local_workers:
        model = copy.deepcopy(inits[start[w]]).to(device)
        if comm.shards.size > 1:
            shard(model, comm.mesh["shard"])
        replicas.append(model)
    return replicas


def build_algorithm(
    cfg: Config,
    comm: Comm,
    factory: ModelFactory,
    device: torch.device,
    b_max: int,
    log: Callable[[str], None] = lambda _: None,
) -> AdLoCo:
    """The algorithm object of a config: the replicas of :func:`build_replicas`, inner optimizers on their
    flat parameter groups."""
    a, rt = cfg.algorithm, cfg.runtime
    trainers = min(a.trainers, a.workers)  # a run continuing on fewer workers merges down to them
    graphs, _ = cuda_graphs_choice(cfg, device.type == "cuda")  # runtime.cuda_graphs, auto resolved
    cache = compiling.use_cache(cfg) if rt.compile else ""  # before anything compiles
    models: list[torch.nn.Module] = []
    optimizers: list[torch.optim.Optimizer] = []
    for model in build_replicas(cfg, comm, factory, device, log):
        model.train()
        flat = flatten(model)
        if rt.compile:  # in place: the module, its parameters and its state dict's names stay
            what = compiling.compile_in_place(model, rt.compile_scope, rt.compile_backend, rt.compile_mode)
            if not models:
                log(
                    f"compile: {what}, backend {rt.compile_backend}, mode {rt.compile_mode}, at the first "
                    f"steps; caches in {cache}"
                )
        models.append(model)
        optimizers.append(make_optimizer(flat, cfg.inner, capturable=graphs))
    options = round_options(
        cfg,
        trainers=trainers,
        switch=dataclasses.replace(cfg.switch, b_max=b_max),
        fixed_rows=fixed_rows(rt.profile),
        # one speed per worker id; a run that continues on more workers than listed runs the rest at 1
        emulate_speed=(list(rt.emulate_speed) + [1.0] * a.workers)[: a.workers] if rt.emulate_speed else None,
        snapshot=True,  # a signal stops a round part-way: undo it in place
        sync_initial=False,  # every process built its replicas from the same seeds
        cuda_graphs=graphs,
    )
    try:
        return METHOD_CLASSES[a.method](models, optimizers, comm=comm, options=options)
    except ValueError as exc:  # the library names the key; what needs the model (P) is checked only here
        raise UserError(f"config: {exc}") from None


def round_options(cfg: Config, **derived: Any) -> RoundOptions:
    """The config's :class:`~adloco.library.options.RoundOptions`: each field read from the config key it names
    (:func:`adloco.library.options.config_key`), the others from ``derived`` (what the run works out: trainers
    that have workers, b_max, the profile's fixed rows...). A field with no key that is not given is a bug,
    said as one."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(RoundOptions):
        key = config_key(f.name)
        if f.name in derived:
            values[f.name] = derived[f.name]
        elif key is None:
            raise TypeError(f"round_options: RoundOptions.{f.name} has no config key; give it in derived")
        else:
            section, _, name = key.partition(".")
            values[f.name] = getattr(getattr(cfg, section), name) if name else getattr(cfg, section)
    return RoundOptions(**values)


def fixed_rows(profile: str | StepProfile | None) -> float:
    """A pass's fixed cost in rows, α/β of ``runtime.profile`` (0 without one, with ``auto`` before the run
    has fitted its own, or with β = 0)."""
    if not profile or profile == AUTO:
        return 0.0
    p = profile if isinstance(profile, StepProfile) else StepProfile.load(profile)
    return p.alpha / p.beta if p.beta > 0 else 0.0
