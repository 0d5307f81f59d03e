"""The library: AdLoCo, DiLoCo, LocalSGD and DDP as objects over your models, inner optimizers and a
communicator, with their dials (:mod:`adloco.library.settings`, :class:`adloco.library.options.RoundOptions`).

It imports nothing of the application around it (``adloco train``'s config, engine, models, data and
telemetry, the reports, the bench, the planner) and of the rest of ``adloco`` only the network model
(:mod:`adloco.netmodel`), which simulated time reads. Its public names are ``adloco``'s: ``from adloco
import AdLoCo, DiLoCo, Wire, Sync`` (docs/guides/library.md); the layers are in docs/contributing.md.
"""
