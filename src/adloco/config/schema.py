"""The config tree of ``adloco train``: one frozen dataclass per section, every field declared once.

The algorithm's sections (``outer``, ``batch``, ``merge``, ``switch``, ``comm``, ``sync``) ARE the library's dials
(:mod:`adloco.library.settings`); the rest belong to the application (model, data, runtime, logging ...) and are
declared here with the same :func:`~adloco.library.fields.setting`, so every field has one type, default, range
and doc, checked when its section is built. Rules across sections live in :mod:`adloco.config.checks`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from adloco.library import presets
from adloco.library import settings as dials
from adloco.library.fields import Dial, setting
from adloco.models.sizing import SHAPES


@dataclass(frozen=True)
class ModelConfig(Dial):
    SECTION: ClassVar[str] = "model"
    name: str = setting(
        "llama-tiny", f"a preset ({', '.join(SHAPES)}), a hub name or a local path (a checkpoint)"
    )
    task: Literal["causal_lm", "classification"] = setting(
        "causal_lm", "language modelling (perplexity) or classification (accuracy; a labelled data set)"
    )
    init: Literal["same", "independent"] = setting(
        "same", "trainer initialization: one seed for all trainers, or one seed per trainer (ALGORITHM.md §3)"
    )
    reinit_output: bool = setting(
        False, "re-initialize the output layer of each trainer (the paper, on a checkpoint)"
    )
    precision: dials.Precision = setting(
        "fp32", "CUDA only: mixed precision (fp16 with dynamic loss scaling); parameters stay float32"
    )
    trust_remote_code: bool = setting(
        False, "allow a hub model or tokenizer to run its own code (off unless asked)"
    )

    def check(self) -> None:
        self.need(bool(self.name.strip()), "name", "a preset, a hub name or a local path")


@dataclass(frozen=True)
class DataConfig(Dial):
    SECTION: ClassVar[str] = "data"
    source: str = setting(
        "stdlib",
        "'stdlib' (Python's own source), 'fortunes' (English prose: the fortunes extra), a local file or "
        "folder (txt, md, jsonl, csv, parquet), or a hub dataset",
    )
    hub_config: str | None = setting(None, "hub dataset configuration (C4: 'en')")
    split: str = setting("train", "hub dataset split to train on")
    val_split: str | None = setting(None, "hub dataset split to validate on (default: hold out val_fraction)")
    streaming: bool = setting(True, "stream a hub dataset instead of downloading it whole")
    text_field: str = setting("text", "field holding the text in jsonl, csv, parquet and hub rows")
    label_field: str = setting("label", "field holding the label (model.task: classification)")
    tokenizer: str = setting(
        "bpe:4096",
        "'bpe:<vocab size>' trained on the train split, a hub name or a local path; "
        "unset with a checkpoint model.name: the checkpoint's own",
    )
    seq_len: int = setting(
        128, "tokens per example (LM: documents packed with EOS between; classification: cut)", at_least=2
    )
    val_fraction: float = setting(
        0.05,
        "share of documents held out for validation, chosen by a hash of their name",
        above=0,
        below=1,
        allowed="between 0 and 1 (exclusive)",
    )
    max_examples: int | None = setting(
        None, "read at most this many documents (the paper's data_sample_size)", at_least=2
    )
    subset_fraction: float = setting(
        1.0, "share of the training examples each trainer draws from (ALGORITHM.md §3)", above=0, at_most=1
    )
    cache_dir: str | None = setting(
        None, "tokenizer and token cache (default: $ADLOCO_CACHE or ~/.cache/adloco)"
    )

    def check(self) -> None:
        t = self.tokenizer
        if t.startswith("bpe:"):
            self.need(
                t[4:].isdigit() and 260 <= int(t[4:]) <= 1_000_000,
                "tokenizer",
                "'bpe:<vocab size>' with a vocab size in [260, 1000000]",
            )
        self.need(bool(t.strip()), "tokenizer", "'bpe:<vocab size>', a hub name or a local path")
        self.need(bool(self.text_field), "text_field", "a field name")


@dataclass(frozen=True)
class AlgorithmConfig(Dial):
    SECTION: ClassVar[str] = "algorithm"
    method: dials.Method = setting(
        "adloco", "the method (ddp: gradients averaged every step); sets the other sections' defaults"
    )
    rounds: int = setting(
        8, "outer rounds (every worker runs H inner steps, then every trainer steps)", at_least=1
    )
    inner_steps: int = setting(
        12,
        "H: inner OPTIMIZER steps per round (never micro-batches)",
        at_least=1,
        allowed=">= 1 (H counts optimizer steps)",
    )
    workers: int = setting(4, "N: compute slots that run inner steps", at_least=1)
    trainers: int = setting(4, "K0: model instances at start (each owns >= 1 workers)", at_least=1)
    seed: int = setting(
        0,
        "seed of every random stream, keyed by (seed, trainer, worker, round)",
        at_least=0,
        below=2**31,
        allowed="in [0, 2**31)",
    )
    budget: int | None = setting(
        None,
        "stop after the round in which this many training examples were processed (null: all rounds)",
        at_least=1,
    )


@dataclass(frozen=True)
class InnerConfig(Dial):
    SECTION: ClassVar[str] = "inner"
    optimizer: Literal["auto", "adamw", "sgd", "muon"] = setting(
        "auto",
        "inner optimizer of every worker; muon: torch.optim.Muon on the hidden 2-D matrices, AdamW (lr, betas, "
        "weight_decay) on embeddings, output head, norms and biases (ALGORITHM.md §1); auto: muon for a language "
        "model where every process runs on a CPU, else adamw (the run's first lines say which; a resumed run "
        "keeps its own)",
    )
    lr: float = setting(4e-3, "peak inner learning rate", above=0)
    weight_decay: float = setting(
        0.1, "decoupled weight decay on matrices (not on norms or biases)", at_least=0
    )
    betas: list[float] = setting([0.9, 0.95], "AdamW betas", at_least=0, below=1)
    momentum: float = setting(0.9, "SGD momentum (inner optimizer sgd)", at_least=0, below=1)
    muon_lr_ratio: float = setting(
        1.0,
        "muon: Muon's lr is inner.lr times this at every point of the schedule (1 with muon_adjust_lr "
        "match_rms_adamw, Moonlight's setting; about 0.02 / inner.lr with original)",
        above=0,
        at_most=1000,
    )
    muon_momentum: float = setting(0.95, "muon: Muon's Nesterov momentum", at_least=0, below=1)
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = setting(
        "match_rms_adamw",
        "muon: torch's adjust_lr_fn: match_rms_adamw scales each matrix's step to AdamW's RMS (0.2·√max(A, B), "
        "so AdamW's lr and weight decay carry over); original: Keller Jordan's √max(1, A/B)",
    )
    muon_ns_dtype: Literal["auto", "bfloat16", "float32"] = setting(
        "auto",
        "muon: the dtype of Muon's Newton–Schulz iterations: bfloat16 (torch.optim.Muon's, for GPUs); float32, "
        "for a CPU without AVX512-BF16 or AMX, which emulates bfloat16 matmuls (a step of llama-10m 7-14x faster "
        "on the CPU of RESULTS); auto: bfloat16, but float32 on such a CPU (the run's first lines say which)",
    )
    warmup_fraction: float = setting(
        0.05, "linear warmup over this share of all inner steps", at_least=0, below=1
    )
    schedule: Literal["cosine", "constant"] = setting("cosine", "learning-rate decay after warmup")
    min_lr_ratio: float = setting(0.1, "cosine decays to lr * min_lr_ratio", at_least=0, at_most=1)
    clip: float = setting(
        1.0,
        "clip the inner gradient to this global norm (0: off)",
        at_least=0,
        allowed=">= 0 (0 turns clipping off)",
    )
    state: dials.InnerState = setting(
        "keep", "inner optimizer state across rounds: keep (DiLoCo) or reset every round (reference)"
    )

    def check(self) -> None:
        self.need(len(self.betas) == 2, "betas", "two numbers in [0, 1)")


@dataclass(frozen=True)
class SwitchConfig(dials.Switch):
    """The ``switch`` section: the library's :class:`~adloco.library.settings.Switch` and the CUDA b_max search."""

    memory_fraction: float = setting(
        0.85,
        "CUDA b_max search: share of the free memory that one micro-batch's step and every local worker's "
        "optimizer and batch-test state may fill (ALGORITHM.md §5)",
        above=0,
        at_most=1,
    )


@dataclass(frozen=True)
class EvalConfig(Dial):
    SECTION: ClassVar[str] = "eval"
    every: int = setting(1, "evaluate validation loss and perplexity every this many rounds", at_least=1)
    max_examples: int | None = setting(
        128,
        "validation examples evaluated, spread evenly over the held-out split (null: all of it)",
        at_least=1,
    )
    batch_size: int = setting(32, "validation examples per forward pass", at_least=1)


@dataclass(frozen=True)
class RuntimeConfig(Dial):
    SECTION: ClassVar[str] = "runtime"
    backend: Literal["auto", "inprocess", "torchdist"] = setting(
        "auto",
        "inprocess: every worker in this process; torchdist: torch.distributed (auto: when launched by "
        "torchrun)",
    )
    workers_per_process: int = setting(
        1, "torchdist: workers hosted by each process (they share its device)", at_least=1
    )
    shards: int = setting(
        1,
        "torchdist: ranks per worker: each worker is k processes holding one replica sharded with FSDP2 "
        "(fully_shard) on a (worker, shard) mesh, so algorithm.workers = processes / k (ALGORITHM.md §12)",
        at_least=1,
        at_most=4096,
    )
    dist_backend: Literal["auto", "nccl", "gloo"] = setting(
        "auto",
        "torchdist: NCCL on CUDA, gloo on CPU (auto: gloo also when processes share a GPU, which NCCL "
        "refuses)",
    )
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto picks cuda when available")
    threads: int = setting(
        0,
        "torch CPU threads per process (0: in one process, torch's default lowered to the cores other work "
        "leaves free, re-checked every few seconds; with torchdist, cores / local processes)",
        at_least=0,
        at_most=4096,
    )
    timeout: float = setting(
        600.0,
        "torchdist: seconds a collective may wait before the run stops naming the silent rank",
        at_least=1,
        at_most=86400,
        allowed="between 1 and 86400 seconds",
    )
    balance: dials.Balance = setting(
        "equal",
        "equal: every worker of a trainer gets its request b (reproducible bit for bit); speed: each "
        "trainer's examples per step shared by measured speed, and workers among trainers by capacity "
        "(ALGORITHM.md §9.3; a run then depends on timings)",
    )
    emulate_speed: list[float] = setting(
        [],
        "emulation of heterogeneous devices: worker w takes 1/s_w as long per step by sleeping (empty: none)",
    )
    cuda_graphs: bool | Literal["auto"] = setting(
        "auto",
        "each worker's inner step captured as a CUDA graph and replayed on its own stream, so the workers of "
        "a process train at once on their GPU (ALGORITHM.md §14); the inner optimizer becomes capturable and "
        "fused (within float tolerance of a run without; Muon takes its lr as a device tensor); not with "
        "fp16, ddp, runtime.shards > 1, batch.wd_scaling timescale or a compile_mode that captures graphs "
        "itself. auto: "
        "on where the run is on CUDA and none of those stands in the way (the run's first lines say which, "
        "and why); true: on, refused in one line where it cannot work; false: off",
    )
    compile: bool = setting(
        False,
        "torch.compile each worker's model before training (runtime.compile_scope says which parts; the "
        "backward pass through AOT autograd); results within float tolerance of eager (ALGORITHM.md §14)",
    )
    compile_scope: Literal["blocks", "model"] = setting(
        "blocks",
        "with runtime.compile: blocks compiles each repeated decoder block on its own (the blocks a "
        "Hugging Face model names in _no_split_modules, as FSDP2 shards them; the embeddings, final norm, "
        "head and loss stay eager), so one compilation serves every layer of every worker; model compiles "
        "the whole model with its loss as one graph (longer to compile)",
    )
    compile_cache: str | None = setting(
        None,
        "with runtime.compile: the folder of torch.compile's caches (inductor's FX graph and AOT autograd "
        "caches, Triton's kernels), which a later run with the same model, shapes and torch reuses instead "
        "of compiling again; null: $TORCHINDUCTOR_CACHE_DIR when it is set, else <data.cache_dir, "
        "$ADLOCO_CACHE or ~/.cache/adloco>/compile. Deleting the folder clears it",
    )
    compile_backend: str = setting(
        "inductor",
        "torch.compile's backend with runtime.compile (torch._dynamo.list_backends() names them; aot_eager "
        "traces without generating code)",
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        setting(
            "default",
            "torch.compile's mode with runtime.compile (reduce-overhead and max-autotune also capture CUDA graphs "
            "of their own, so not with runtime.cuda_graphs)",
        )
    )
    profile: str | None = setting(
        None,
        "a step-time profile (adloco profile writes one) that prices each worker's compute in simulated time "
        "as t(m, a) = a(α + βm) + δ per step, and, with balance speed, measures speeds net of a pass's fixed "
        "cost α and shares rows so that steps take the same time (ALGORITHM.md §11); auto: fitted from the "
        "run's own worker rounds once they have used several micro-batch sizes (measured compute until then; "
        "the fit is written to the run's profile.json); null: measured compute, and speeds as rows per second",
    )


@dataclass(frozen=True)
class NetworkConfig(Dial):
    SECTION: ClassVar[str] = "network"
    bandwidth: float = setting(
        125e6,
        "simulated time: bytes per second of every link (125e6: 1 Gbit/s)",
        above=0,
        unit="bytes per second",
    )
    latency: float = setting(1e-3, "simulated time: seconds per message hop", at_least=0, unit="seconds")
    emulate: bool = setting(
        False,
        "hold every counted collective back to its time at this bandwidth and latency (a sleep after the "
        "real one), so that wall time shows what the link costs; decisions are unchanged (ALGORITHM.md §7)",
    )
    upload: float | None = setting(
        None,
        "bytes per second each worker's link sends (null: network.bandwidth, both ways); a ring moves as much up "
        "as down, so the slower direction bounds it (ALGORITHM.md §7)",
        above=0,
        unit="bytes per second",
    )
    sites: list[int] = setting(
        [],
        "workers per site, in worker order, summing to algorithm.workers (empty: one site): inside a site the "
        "links above, between sites network.site_bandwidth and network.site_latency; a collective across "
        "sites is priced hierarchically (ALGORITHM.md §7)",
        at_least=1,
        allowed="whole numbers of workers >= 1",
    )
    site_bandwidth: float = setting(
        12.5e6,
        "with network.sites: bytes per second of each site's link to the others, both ways (12.5e6: 100 Mbit/s)",
        above=0,
        unit="bytes per second",
    )
    site_latency: float = setting(
        0.05, "with network.sites: seconds per hop between sites", at_least=0, unit="seconds"
    )

    def model(self) -> Any:
        """The links these keys describe (:func:`adloco.netmodel.network`): what simulated time prices and
        what ``network.emulate`` holds collectives back to."""
        from adloco import netmodel

        sites = self.sites if len(self.sites) > 1 else []
        return netmodel.network(
            self.bandwidth, self.latency, self.upload, sites, self.site_bandwidth, self.site_latency
        )


@dataclass(frozen=True)
class CheckpointConfig(Dial):
    SECTION: ClassVar[str] = "checkpoint"
    every: int = setting(
        2,
        "write a full-state checkpoint every this many rounds (0: only at the end)",
        at_least=0,
        at_most=1_000_000,
        allowed=">= 0 (0: only at the end)",
    )
    keep: int = setting(
        2,
        "checkpoints kept, newest first; an older one is deleted only once a newer one is complete",
        at_least=1,
        at_most=1000,
        allowed="between 1 and 1000",
    )
    dir: str = setting(
        "",
        "where checkpoints go: empty for <run directory>/checkpoints, else a path or an fsspec URL (file://, "
        "memory://, s3:// with s3fs installed, ...) under which each run gets a folder of its name; every "
        "rank writes its own part there, so every machine of a run must reach it",
    )
    async_save: bool = setting(
        False,
        "write checkpoints behind training (torch.distributed.checkpoint's async_save): training waits only "
        "while the state is copied into host memory; the next checkpoint and the end of the run wait for the "
        "write",
    )


@dataclass(frozen=True)
class ElasticConfig(Dial):
    SECTION: ClassVar[str] = "elastic"
    batch: dials.OnResize = setting(
        "per_trainer",
        "when the number of workers changes: keep each trainer's examples per step (M·b) or each worker's b",
    )
    checkpoint_every: int = setting(
        1,
        "in elastic runs (torchrun or adloco train --nproc with --max-restarts): checkpoint every this many "
        "rounds",
        at_least=1,
        at_most=1_000_000,
        allowed=">= 1 (an elastic run loses at most this many rounds)",
    )
    timeout: float = setting(
        60.0,
        "in elastic runs: seconds a collective may wait for a silent peer before the processes exit to be "
        "restarted (runtime.timeout still bounds start-up)",
        at_least=1,
        at_most=86400,
        allowed="between 1 and 86400 seconds",
    )


@dataclass(frozen=True)
class FaultsConfig(Dial):
    SECTION: ClassVar[str] = "faults"
    max_bad_rounds: int = setting(
        3,
        "stop (with a checkpoint) after this many consecutive rounds with a non-finite worker loss or update",
        at_least=1,
    )


@dataclass(frozen=True)
class LoggingConfig(Dial):
    SECTION: ClassVar[str] = "logging"
    out_dir: str = setting("runs", "parent folder of run directories")
    name: str | None = setting(None, "run name (default: the method); the folder is <name>-<timestamp>")
    progress: Literal["auto", "rich", "plain", "off"] = setting(
        "auto", "live progress: rich on a terminal, one line a round otherwise"
    )
    plots: bool = setting(True, "draw PNG plots into the run directory at the end")
    tensorboard: Literal["auto", "on", "off"] = setting(
        "auto", "TensorBoard scalars in <run>/tensorboard: auto when the tensorboard package is installed"
    )
    trackers: list[str] = setting(
        [],
        "experiment trackers that get the same scalars and the config, only when listed: wandb (Weights & "
        "Biases, offline in <run>/wandb unless WANDB_MODE says otherwise; pip install 'adloco[wandb]'), mlflow "
        "(MLFLOW_TRACKING_URI, or a file store in <run>/mlruns; pip install 'adloco[mlflow]'); empty: none",
    )
    save_model: bool = setting(True, "save the final model and tokenizer (Hugging Face format)")
    model_file_mb: int = setting(
        2048,
        "the largest file of the saved model, MiB: a larger model is written as numbered safetensors files "
        "with an index, as Hugging Face does; rank 0 holds one file's tensors at a time, not the whole model",
        at_least=1,
    )
    trace: int = setting(
        0,
        "record this round's inner steps and synchronization with torch.profiler (0: none): "
        "<run>/trace/round-N.json (a Chrome trace) and round-N.md (host and device ms a step, host reads "
        "of device values, the costliest operators)",
        at_least=0,
    )

    def check(self) -> None:
        from adloco.telemetry.metrics import TRACKERS

        self.need(
            all(t in TRACKERS for t in self.trackers) and len(set(self.trackers)) == len(self.trackers),
            "trackers",
            f"a list of {', '.join(map(repr, TRACKERS))}, each at most once (empty: none; TensorBoard is "
            "logging.tensorboard), e.g. [wandb]",
        )
        n = self.name
        self.need(
            n is None or (re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n) is not None and len(n) <= 100),
            "name",
            "a plain name of letters, digits, '.', '_' or '-' (no '/'), at most 100 characters",
        )


@dataclass(frozen=True)
class Config:
    """The whole tree; frozen: :meth:`replace` gives a changed copy, checked like the original."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    inner: InnerConfig = field(default_factory=InnerConfig)
    outer: dials.Outer = field(default_factory=dials.Outer)
    batch: dials.AdaptiveBatch = field(default_factory=dials.AdaptiveBatch)
    merge: dials.Merging = field(default_factory=dials.Merging)
    switch: SwitchConfig = field(default_factory=SwitchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    comm: dials.Wire = field(default_factory=dials.Wire)
    sync: dials.Sync = field(default_factory=dials.Sync)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def replace(self, **sections: dict[str, Any]) -> Config:
        """A copy with some keys changed, e.g. ``cfg.replace(algorithm={"workers": 8})``."""
        return dataclasses.replace(
            self, **{s: dataclasses.replace(getattr(self, s), **kv) for s, kv in sections.items()}
        )


SECTIONS: list[str] = [f.name for f in dataclasses.fields(Config)]
SECTION_TYPES: dict[str, type[Dial]] = {
    f.name: type(getattr(Config(), f.name)) for f in dataclasses.fields(Config)
}
assert all(name == cls.SECTION for name, cls in SECTION_TYPES.items())
BENCH = "bench"  # `adloco bench`'s own section of a config file; every other command ignores it
SIMULATE = "simulate"  # `adloco simulate`'s own section (adloco.plan.command.SimulateConfig); likewise

# Method presets (ALGORITHM.md §6): the library's (:data:`adloco.library.presets.PRESETS`), and LocalSGD's inner
# plain SGD (Stich 2019), which only the application builds. They fill only the keys a user leaves unset.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    m: {**presets.PRESETS[m], **extra}
    for m, extra in {
        "adloco": {},
        "diloco": {},
        "localsgd": {"inner": {"optimizer": "sgd", "lr": 0.2, "weight_decay": 0.0, "momentum": 0.0}},
        "ddp": {},
    }.items()
}
assert tuple(PRESETS) == dials.METHODS


def preset_values(method: str, section: str, dtype: str = "float32") -> dict[str, Any]:
    """What ``method`` fixes in ``section`` under ``comm.dtype`` = ``dtype``: :data:`PRESETS`, with the
    library's rule for the outer step a codec brings (:func:`adloco.library.presets.preset_values`)."""
    return presets.preset_values(method, section, PRESETS, dtype)


# What ``adloco train --resume`` may change with ``--set``: how long the run goes, learning rates and
# clipping, the number of workers (ALGORITHM.md §9.2), the token cache, and whole sections that leave the
# math alone. An entry ending in "." is a whole section. Everything else (model, data, method, seed ...) is
# the checkpoint's. RESUMABLE_TEXT says the same in words for the --resume help, the refusal and the README.
RESUMABLE: tuple[str, ...] = (
    "algorithm.rounds",
    "algorithm.budget",
    "algorithm.workers",
    "inner.lr",
    "inner.clip",
    "outer.lr",
    "data.cache_dir",
    "eval.",
    "checkpoint.",
    "elastic.",
    "faults.",
    "network.",
    "logging.",
    "runtime.",
)


def _resumable_text(entries: tuple[str, ...]) -> str:
    keys = [e for e in entries if not e.endswith(".")]
    sections = [e[:-1] for e in entries if e.endswith(".")]
    return f"{', '.join(keys)} and the {', '.join(sections[:-1])} and {sections[-1]} sections"


RESUMABLE_TEXT = _resumable_text(RESUMABLE)
