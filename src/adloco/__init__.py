"""adloco: AdLoCo, DiLoCo, LocalSGD and synchronous data parallel training in one engine."""

__version__ = "0.1.0"
