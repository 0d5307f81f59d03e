"""``adloco train``'s config: one typed tree (:mod:`.schema`) whose algorithm sections are the library's
dials, read from defaults, a method preset, a YAML file and ``--set`` overrides (:mod:`.load`), and
checked across sections (:mod:`.checks`). ``adloco config`` prints every field with its doc."""

from adloco.config.load import RawText, dump_yaml, field_docs, load_yaml, parse_override, resolve
from adloco.config.schema import (
    BENCH,
    PRESETS,
    RESUMABLE,
    RESUMABLE_TEXT,
    SECTION_TYPES,
    SECTIONS,
    AlgorithmConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    ElasticConfig,
    EvalConfig,
    FaultsConfig,
    InnerConfig,
    LoggingConfig,
    ModelConfig,
    NetworkConfig,
    RuntimeConfig,
    SwitchConfig,
)

__all__ = [
    "BENCH",
    "PRESETS",
    "RESUMABLE",
    "RESUMABLE_TEXT",
    "SECTIONS",
    "SECTION_TYPES",
    "AlgorithmConfig",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "ElasticConfig",
    "EvalConfig",
    "FaultsConfig",
    "InnerConfig",
    "LoggingConfig",
    "ModelConfig",
    "NetworkConfig",
    "RawText",
    "RuntimeConfig",
    "SwitchConfig",
    "dump_yaml",
    "field_docs",
    "load_yaml",
    "parse_override",
    "resolve",
]
