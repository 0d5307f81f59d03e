"""``adloco simulate``: a run at N workers priced before it is rented, on the engine's own accounting.

:mod:`.sim` holds the simulator (a :class:`~adloco.plan.sim.Setup` in, a
:class:`~adloco.plan.sim.Simulation` out), :mod:`.command` the command line and its ``simulate`` section.
"""
