"""The library: AdLoCo, DiLoCo, LocalSGD and DDP as objects over your models, inner optimizers and a
communicator, with their dials (:mod:`adloco.library.settings`, :class:`adloco.library.options.RoundOptions`).

It imports nothing of the application around it (``adloco train``'s config, engine, models, data and
telemetry, the reports, the bench, the planner) and of the rest of ``adloco`` only what every layer reads:
the events it reports (:mod:`adloco.events`) and the network model simulated time uses
(:mod:`adloco.netmodel`). An application reads an algorithm object through its methods and its read-only
view (:mod:`adloco.library.view`); ``tests/unit/test_layers.py`` holds both. Its public names are ``adloco``'s: ``from adloco
import AdLoCo, DiLoCo, Wire, Sync`` (docs/guides/library.md); the layers are in docs/contributing.md.
"""
