"""The dials of the algorithm: small frozen dataclasses, each one section of ``adloco train``'s config.

A field is declared once, here: its type (a ``Literal`` for a choice), default, allowed range and one-line
doc (:func:`adloco.library.fields.setting`). The library objects take these dataclasses; ``adloco train`` builds the very same classes from YAML
and ``--set`` (:mod:`adloco.config` adds the sections that only the application has, with the same
:func:`setting`); ``adloco config`` prints their docs. A bad value raises ``ValueError`` naming
``section.key``, the value and what is allowed, whichever way the dataclass was built.

    Outer          the ``outer`` section: the outer step on Δ (ALGORITHM.md §1)
    AdaptiveBatch  ``batch``: the batch test that grows each trainer's request (ALGORITHM.md §2)
    Merging        ``merge``: trainer merging and worker allocation (ALGORITHM.md §3, ALGORITHM.md §4)
    Switch         ``switch``: when gradient accumulation pays (ALGORITHM.md §5)
    Wire           ``comm``: what the round's all-reduces travel as (ALGORITHM.md §9.4)
    Sync           ``sync``: when Δ travels against the compute: overlap and streaming (ALGORITHM.md §13)
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from adloco.library.algorithms import batching
from adloco.library.fields import NAMED, Dial, load_named, setting

if typing.TYPE_CHECKING:
    from adloco.library.comm.codecs import Codec


def codec_rules(dtype: str) -> type[Codec] | None:
    """:func:`adloco.library.comm.codecs.rules` (the class of the codec registered as ``dtype``; None for
    float32), without importing the codecs, and with them torch, for float32: resolving a config
    (``adloco config``, a bench's plan) stays under a second."""
    if dtype == "float32":
        return None
    from adloco.library.comm.codecs import rules

    return rules(dtype)


_MAX_BLOCK = 1 << 24  # the most values a codec's block may hold (16,777,216), for every codec


def _block(default: int, doc: str, least: int) -> Any:
    """A codec's values per block: from ``least`` to 2^24."""
    return setting(
        default, doc, at_least=least, at_most=_MAX_BLOCK, allowed=f"between {least} and {_MAX_BLOCK} values"
    )


# Choices used outside one dial are named once here.
WireDtype = Literal["float32", "bfloat16", "float16", "int8", "int4", "topk"]
WIRE_DTYPES: tuple[str, ...] = typing.get_args(WireDtype)
Balance = Literal["equal", "speed"]
OnResize = Literal["per_trainer", "per_worker"]
InnerState = Literal["keep", "reset"]
Precision = Literal["fp32", "bf16", "fp16"]
Method = Literal["adloco", "diloco", "localsgd", "ddp"]
METHODS: tuple[str, ...] = typing.get_args(Method)


# --------------------------------------------------------------------------------------------------
# The dials
# --------------------------------------------------------------------------------------------------


OuterPreset = Literal["average", "sgd", "nesterov"]
OUTER_PRESETS: tuple[str, ...] = typing.get_args(OuterPreset)
# a factory of the outer optimizer: (params: adloco.library.algorithms.outer.OuterParams) -> torch.optim.Optimizer
OuterFactory = Callable[[Any], Any]
FactoryName = (
    str  # a factory's name, module:function (adloco.library.fields.NAMED), imported when the dial is built
)


@dataclass(frozen=True)
class Outer(Dial):
    """The outer step on the pseudo-gradient Δ (ALGORITHM.md §1, step 4): ``average`` (θ ← the workers'
    mean), ``sgd`` (θ ← θ − lr·Δ; DiLoCo's preset, at lr 0.5) or ``nesterov`` (PyTorch SGD semantics; the
    DiLoCo paper's lr 0.7, momentum 0.9, the fields' defaults). Under ``sync.overlap: delayed`` a ``nesterov``
    step with a momentum is warned of (:meth:`stale_momentum`; ALGORITHM.md §13).

    ``optimizer`` may also be a factory: a callable that takes a trainer's parameters
    (:class:`adloco.library.algorithms.outer.OuterParams`: the flat θ, or ``params.shaped()`` for the model's
    shapes) and returns a ``torch.optim.Optimizer``, given itself (in the library) or by name as
    ``module:function`` (in a config file too), imported when the dial is built; each outer step sets its
    parameters' ``.grad`` to the averaged Δ and steps it (``lr`` and ``momentum`` are then its business)."""

    SECTION: ClassVar[str] = "outer"
    optimizer: OuterPreset | OuterFactory | FactoryName = setting(
        "average",
        "outer step on the pseudo-gradient (ALGORITHM.md §1): a preset, or module:function naming a factory "
        "params -> torch.optim.Optimizer (mypkg.outer:make_adam, torch.optim:Adam), imported when the config is "
        "read; outer.lr and outer.momentum are then its own. In the library also the callable itself",
    )
    lr: float = setting(0.7, "outer learning rate (sgd, nesterov)", above=0)
    momentum: float = setting(0.9, "outer Nesterov momentum", at_least=0, below=1)

    @classmethod
    def nesterov(cls, lr: float | None = None, momentum: float | None = None) -> Outer:
        """Nesterov momentum; lr and momentum default to the fields' (0.7, 0.9)."""
        d = cls()
        return cls("nesterov", d.lr if lr is None else lr, d.momentum if momentum is None else momentum)

    @classmethod
    def sgd(cls, lr: float | None = None) -> Outer:
        """Plain SGD on Δ; lr defaults to the field's (0.7)."""
        return cls("sgd", cls().lr if lr is None else lr)

    def check(self) -> None:
        name = self.optimizer
        if not isinstance(name, str) or name in OUTER_PRESETS:
            return
        close = difflib.get_close_matches(name, OUTER_PRESETS, n=1)
        self.need(
            NAMED.fullmatch(name) is not None,
            "optimizer",
            f"{words(list(OUTER_PRESETS))}, or a factory named module:function (mypkg.outer:make_adam)"
            + (f"; did you mean {close[0]!r}?" if close else ""),
        )
        try:
            load_named(name)
        except ValueError as exc:
            raise ValueError(f"outer.optimizer = {name!r}: {exc}") from None

    @property
    def factory(self) -> str | OuterFactory:
        """What makes each trainer's outer optimizer: a preset's name, or the factory (imported where
        ``optimizer`` names it)."""
        name = self.optimizer
        return load_named(name) if isinstance(name, str) and name not in OUTER_PRESETS else name

    def stale_momentum(self, overlap: str) -> str | None:
        """Why this step is unstable under ``sync.overlap`` = ``overlap``, or None: with ``delayed`` a Nesterov
        momentum is fed a Δ measured from a θ one outer step stale, oscillates and may diverge (DiLoCo's lr
        0.7 and momentum 0.9: validation perplexity 1.9M where ``none`` ends at 1116; ALGORITHM.md §13).
        ``eager`` corrects each worker's start and keeps the momentum."""
        if overlap == "delayed" and self.optimizer == "nesterov" and self.momentum > 0:
            return (
                f"outer.optimizer nesterov with outer.momentum {self.momentum:g} under sync.overlap delayed: a "
                "momentum fed Δ one round stale oscillates and may diverge (ALGORITHM.md §13); outer.optimizer "
                "sgd (DiLoCo's preset), outer.momentum 0 or sync.overlap eager are stable"
            )
        return None


@dataclass(frozen=True)
class AdaptiveBatch(Dial):
    """The batch test that grows each trainer's request b (ALGORITHM.md §2); ``test: none`` keeps b."""

    SECTION: ClassVar[str] = "batch"
    test: Literal["norm", "inner_product", "augmented_inner_product", "none"] = setting(
        "norm", "adaptive batch test (ALGORITHM.md §2); none keeps the request constant but logs statistics"
    )
    initial: int = setting(4, "initial request b (per-worker batch size)", at_least=1)
    max: int = setting(32, "cap on any request", at_most=1_048_576)
    eta: float = setting(0.65, "norm test parameter η (ALGORITHM.md §2.1; the paper uses 0.8)", above=0)
    vartheta: float = setting(0.01, "inner-product test parameter (ALGORITHM.md §2.2)", above=0)
    nu: float = setting(0.3, "orthogonality test parameter (ALGORITHM.md §2.3)", above=0)
    estimator: Literal["pooled", "paper"] = setting(
        "pooled",
        "gradient samples: pooled chunks at the round's common point, or each worker's last gradient "
        "(ALGORITHM.md §2.5)",
    )
    probe_chunks: int = setting(
        8,
        "pooled estimator: chunks per step batch (k = min(e, probe_chunks), e the trainer's smallest; "
        "ALGORITHM.md §2.5)",
        at_least=2,
    )
    statistics: bool = setting(
        True,
        "probe gradient statistics every round even when test is none (k small backward passes at step 1)",
    )
    exact_mean: bool = setting(
        False, "norm test: all-reduce the trainer's mean probe gradient (P values) instead of scalars only"
    )
    noise_rows: Literal["probed", "requested"] | None = setting(
        None,
        "norm test: whose noise σ̂²/B its estimate of E‖ḡ‖² holds (ALGORITHM.md §2.5): probed, B the rows "
        "probed, so T <= probed rows/η² and a request whose rows are not all probed (a step capped at "
        "switch.b_max, rows outside the chunks) can stop growing (the norm test as first specified); "
        "requested, B the larger of those and the trainer's requested rows (T <= request/η²); null: requested "
        "with the norm test",
    )
    formula: Literal["spec", "reference"] = setting(
        "spec",
        "spec: the inner-product tests as ALGORITHM.md §2.2–2.4 writes them; reference: the reference "
        "implementation's (ν in both, no c or 1/M, per-entry variance; ALGORITHM.md §9.1)",
    )
    lr_scaling: Literal["none", "sqrt", "gain"] = setting(
        "none",
        "the inner lr follows the batch (ALGORITHM.md §10): none; sqrt: × √(b/b₀); gain: × √ of AdaScale's gain "
        "from the norm test's noise ratio (linear instead of √ for SGD inner optimizers)",
    )
    lr_scale_max: float = setting(4.0, "cap on the lr multiplier of lr_scaling", at_least=1)
    wd_scaling: Literal["none", "timescale"] = setting(
        "none",
        "the inner weight decay follows the batch (ALGORITHM.md §10): none; timescale: × (b/b₀) / the lr's "
        "multiplier, so lr × weight decay grows as the batch does and AdamW's averaging timescale in "
        "examples, b/(lr·λ), stays where it started (arXiv 2405.13698, 2505.13738)",
    )
    schedule: Literal["none", "power", "ramp"] = setting(
        "none",
        "the request follows the examples seen instead of a test (ALGORITHM.md §15): none; power: "
        "b = batch.initial · (D/D₀)^p once D > D₀ (D the run's examples read, D₀ batch.schedule_examples, p "
        "batch.schedule_power); ramp: linear from batch.initial to batch.max over the first D₀ examples; "
        "capped at batch.max, needs batch.test none",
    )
    schedule_examples: int = setting(
        4096,
        "D₀ of batch.schedule, in training examples (every worker's): power grows after it, ramp ends at it",
        at_least=1,
    )
    schedule_power: float = setting(
        0.5, "p of batch.schedule power: b ∝ D^p (arXiv 2505.13738, 2410.21676)", above=0, at_most=1
    )

    def check(self) -> None:
        self.need(self.max >= self.initial, "max", f">= batch.initial ({self.initial})")
        self.need(
            self.schedule == "none" or self.test == "none",
            "schedule",
            f"none with batch.test = {self.test!r} (a schedule and a test would both set the next round's "
            "request: set batch.test none to follow a schedule)",
        )
        self.need(
            self.noise_rows != "requested" or self.test == "norm",
            "noise_rows",
            f"probed or null with batch.test = {self.test!r} (requested changes the norm test alone)",
        )
        self.need(
            self.lr_scaling != "gain" or self.probing,
            "lr_scaling",
            "none or sqrt when no gradient statistics are taken (gain reads the noise ratio: set "
            "batch.statistics true or a batch test)",
        )

    @property
    def probing(self) -> bool:
        """Whether gradient statistics are taken at all."""
        return self.test != "none" or self.statistics

    @property
    def rule(self) -> batching.Rule:
        """The batch test with its parameters."""
        return batching.Rule(self.test, self.eta, self.vartheta, self.nu, self.formula)

    def noise_of(self, workers: int, request: int) -> int | None:
        """The requested rows whose noise the norm test reads (``noise_rows: requested`` or null: ``workers``
        × ``request``), or None for the rows probed; :meth:`adloco.library.algorithms.batching.Rule.target`'s
        ``rows``."""
        return None if self.noise_rows == "probed" else workers * request


@dataclass(frozen=True)
class Merging(Dial):
    """Trainer merging and worker allocation (ALGORITHM.md §3–4): every ``every`` rounds while more than one
    trainer lives, ``size`` trainers chosen by ``policy`` merge into the lowest id."""

    SECTION: ClassVar[str] = "merge"
    policy: Literal["smallest", "largest_with_smallest", "none"] = setting(
        "smallest", "which trainers merge (ALGORITHM.md §3); none disables merging"
    )
    every: int = setting(2, "merge every f rounds while more than one trainer is alive", at_least=1)
    size: int = setting(2, "|S|: trainers merged into one at each merge", at_least=2)
    survivor_batch: Literal["max", "own"] = setting(
        "max", "request of the merged trainer: max over the merged, or the survivor's own"
    )
    allocation: Literal["requests", "demand"] = setting(
        "requests",
        "workers shared in proportion to requests, or to workers x request (reference; ALGORITHM.md §4)",
    )


@dataclass(frozen=True)
class Switch(Dial):
    """When gradient accumulation pays (ALGORITHM.md §5): ``threshold`` accumulates only when b > κ·b_max."""

    SECTION: ClassVar[str] = "switch"
    mode: Literal["threshold", "accumulate", "cap"] = setting(
        "threshold", "gradient accumulation policy (ALGORITHM.md §5)"
    )
    kappa: float = setting(2.0, "threshold mode: accumulate only when b > kappa * b_max", at_least=1)
    schedule: Literal["fixed", "reference"] = setting(
        "fixed", "fixed: always `mode`; reference: accumulate while >1 trainer lives, then threshold"
    )
    b_max: int | None = setting(
        None,
        "largest micro-batch of one worker; null: on CUDA searched under memory_fraction of free memory, "
        "on CPU (and in the library) 8",
        at_least=1,
        at_most=1_048_576,
        allowed=">= 1 and <= 1048576, or null",
    )

    B_MAX_DEFAULT: ClassVar[int] = 8  # what b_max null means where nothing searches for it

    @property
    def b_max_or_default(self) -> int:
        """b_max, or 8 where nothing searches for it (null)."""
        return self.b_max if self.b_max is not None else self.B_MAX_DEFAULT


@dataclass(frozen=True)
class Wire(Dial):
    """What the round's all-reduces (Δ, the probe's mean gradient, DDP's gradients) travel as (ALGORITHM.md
    §9.4): float32 as it is, or through a codec (:mod:`adloco.library.comm.codecs`): bfloat16, float16, int8 / int4
    block-wise absmax quantization in blocks of ``block`` values, or ``topk``, SparseLoCo's sparse codec (the
    largest ``topk_fraction`` of each block of ``topk_block`` values in ``topk_bits`` bits each, gathered and
    averaged over the workers that sent each value). θ and the outer state, sent when trainers merge and when
    workers move to another trainer, travel as ``theta_dtype`` (null: as Δ where the codec can carry θ, int4
    for topk). Error feedback and its decay β default to the codec's (on at β 0.95 for topk, off for the
    others). Every rule that depends on the codec is read from its class, never its name."""

    SECTION: ClassVar[str] = "comm"
    dtype: WireDtype = setting(
        "float32",
        "what is all-reduced each round (Δ, probe and DDP gradients) travels as (ALGORITHM.md §9.4); topk: "
        "SparseLoCo's sparse top-k per block (comm.topk_*), all-gathered",
    )
    block: int = _block(256, "int8/int4: values per absmax scale (a 4-byte scale per block)", least=1)
    error_feedback: bool | None = setting(
        None,
        "each worker adds what its encoding dropped from its Δ to its next round's Δ (ALGORITHM.md §9.4); "
        "null: the codec's default (on for topk, off for the other dtypes)",
    )
    error_decay: float | None = setting(
        None,
        "β of the error feedback e ← β·e + Δ (ALGORITHM.md §9.4): what was not sent fades by β each round; "
        "null: the codec's (0.95 for topk, SparseLoCo's; 1 for the others)",
        at_least=0,
        at_most=1,
    )
    theta_dtype: WireDtype | None = setting(
        None,
        "what θ and the outer state travel as when trainers merge and when workers move to another trainer "
        "(ALGORITHM.md §9.4); null: as comm.dtype where its codec can carry θ (topk: int4); every holder of "
        "the trainer keeps the same decoded values",
    )
    topk_fraction: float = setting(
        0.015625,
        "topk: the fraction of each block's values sent, k = max(1, ⌈fraction × block⌉) (1/64: 64 of 4096)",
        above=0,
        at_most=1,
    )
    topk_block: int = _block(
        4096,
        "topk: values per block (the top k are chosen in each; an index takes ⌈log2 block⌉ bits)",
        least=2,
    )
    topk_bits: int = setting(
        2,
        "topk: bits per value sent: one of 2^bits bins, decoded as the mean of the block's values in it (a "
        "table of 2^bits bfloat16 means per block)",
        at_least=1,
        at_most=8,
    )
    topk_mean: Literal["senders", "all"] = setting(
        "senders",
        "topk: each value of Δ averaged over the workers that sent it (senders, SparseLoCo's) or over all of "
        "them (all: a value only one worker sent is divided by their number)",
    )

    def check(self) -> None:
        if all(getattr(self, f.name) == f.default for f in fields(self)):
            return  # nothing set: nothing to check (and the codecs need not be imported, FLOAT32 below)
        from adloco.library.comm.codecs import CODECS, rules

        if self.theta_dtype is not None:
            carrier = rules(self.theta_dtype)
            able = words(["float32", *(n for n, c in CODECS.items() if c.carries_theta), "null"])
            self.need(
                carrier is None or carrier.carries_theta,
                "theta_dtype",
                f"{able}: θ is not sparse (a top-k of θ would send a few weights and zero the rest); "
                f"{self.theta_dtype} is for comm.dtype",
            )
        # a key of one codec set while another travels would be ignored: the run would not be the one meant
        own = rules(self.dtype)
        mine = set(own.keys) if own is not None else set()
        defaults = {f.name: f.default for f in fields(self)}
        for name, cls in CODECS.items():
            for key in cls.keys:
                if key not in mine and getattr(self, key) != defaults[key]:
                    self.need(
                        False,
                        key,
                        f"{defaults[key]!r} (its default) unless comm.dtype is {name}, the only dtype it applies "
                        f"to (comm.dtype is {self.dtype!r})",
                    )
        # float32 drops nothing: error feedback asked for there would silently do nothing
        lossy = words(list(CODECS), "and")
        self.need(
            not (self.error_feedback and own is None),
            "error_feedback",
            "false or null with comm.dtype float32 (nothing is dropped, so nothing is fed back); it applies "
            f"to {lossy}",
        )
        self.need(
            self.error_decay is None or self.feedback,
            "error_decay",
            "null unless error feedback is on (comm.error_feedback true, or null with a codec that turns it "
            f"on: {words([n for n, c in CODECS.items() if c.feedback] or ['none'])}); it is the feedback's decay",
        )

    def check_codec(self, batch: AdaptiveBatch, ddp: bool) -> None:
        """The rules across the codec and the round: a codec whose values are not summed (gathered, with its
        error feedback) cannot carry the probe's shared mean or DDP's gradients, which have no error
        feedback (ValueError naming the key)."""
        own = codec_rules(self.dtype)
        if own is None or own.sums:
            return
        from adloco.library.comm.codecs import CODECS

        sums = words(["float32", *(n for n, c in CODECS.items() if c.sums)])
        if ddp:
            raise ValueError(
                f"comm.dtype = {self.dtype!r}: must be {sums} with DDP (its gradients are averaged every step "
                f"with no error feedback, which {self.dtype} needs)"
            )
        from adloco.library.algorithms.batching import needs_shared_mean

        if batch.probing and needs_shared_mean(batch.test, batch.estimator, batch.exact_mean):
            raise ValueError(
                f"comm.dtype = {self.dtype!r}: must be {sums} when the batch test all-reduces the mean probe "
                f"gradient (batch.exact_mean, the inner-product tests, batch.estimator paper: its "
                f"{self.dtype}, with no error feedback, would bias ‖ḡ‖²), or keep {self.dtype} with the norm "
                "test and the pooled estimator"
            )

    @property
    def feedback(self) -> bool:
        """Whether each worker keeps error feedback of its Δ: ``error_feedback``, or where it is null the
        codec's default (:attr:`adloco.library.comm.codecs.Codec.feedback`: on for topk, whose Δ is mostly dropped
        each round; off for the others). Never for float32, where nothing is dropped."""
        own = codec_rules(self.dtype)
        if own is None:
            return False
        return self.error_feedback if self.error_feedback is not None else own.feedback

    @property
    def decay(self) -> float:
        """β of the error feedback (``error_decay``, or the codec's where it is null; 1 for float32)."""
        own = codec_rules(self.dtype)
        if self.error_decay is not None:
            return self.error_decay
        return own.error_decay if own is not None else 1.0

    @property
    def compressed(self) -> bool:
        """Whether the round's all-reduces go through the compressed all-reduce (any dtype but float32)."""
        return self.dtype != "float32"

    @property
    def theta_wire(self) -> str:
        """The dtype θ travels as: ``theta_dtype``, or where it is null Δ's where its codec carries θ, else
        the codec's choice for θ (:attr:`adloco.library.comm.codecs.Codec.theta`; topk: int4)."""
        if self.theta_dtype is not None:
            return self.theta_dtype
        own = codec_rules(self.dtype)
        if own is None:
            return "float32"
        if own.theta is not None:
            return own.theta
        return self.dtype

    @property
    def theta(self) -> Wire:
        """The wire of merges and moves: :attr:`theta_wire` in this wire's blocks, without error feedback."""
        name = self.theta_wire
        return FLOAT32 if name == "float32" else Wire(name, self.block, error_feedback=False)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Sync(Dial):
    """When the round's Δ travels against the compute (ALGORITHM.md §13): at the round's end on the critical
    path (``overlap: none``), behind the next round's compute (``delayed``, ``eager``), or streamed in
    fragments of θ, each behind a few inner steps (``fragments``, ``fragment_delay``, ``fragment_alpha``).
    What Δ travels as is :class:`Wire`'s."""

    SECTION: ClassVar[str] = "sync"
    overlap: Literal["none", "delayed", "eager"] = setting(
        "none",
        "the round's all-reduce of Δ behind the next round's compute (ALGORITHM.md §13): none waits for it; "
        "delayed applies it one round late, the workers starting from the θ they know; eager also lets each "
        "worker take the outer step of its own Δ at once, corrected when the average lands",
    )
    fragments: int = setting(
        1,
        "streaming (ALGORITHM.md §13): Δ is all-reduced in F = this many fragments of the parameters, "
        "fragment p at inner step p·H/F of every round (0 at the round's end): peak bytes per collective ÷ F",
        at_least=1,
    )
    fragment_delay: int = setting(
        0,
        "streaming: inner steps a fragment's all-reduce runs behind compute before its outer step "
        "(torchft's fragment_sync_delay, τ < H / sync.fragments)",
        at_least=0,
    )
    fragment_alpha: float = setting(
        0.0,
        "streaming: after its outer step a worker's fragment becomes (1 − α)·θ + α·(its own values) "
        "(torchft's fragment_update_alpha)",
        at_least=0,
        at_most=1,
    )

    def check_round(self, inner_steps: int, ddp: bool, wire: Wire) -> None:
        """The rules across these keys, the round and the codec's error feedback (ValueError naming the
        key)."""
        p, tau = self.fragments, self.fragment_delay
        if ddp and (self.overlap != "none" or p > 1):
            key, value = ("sync.overlap", self.overlap) if self.overlap != "none" else ("sync.fragments", p)
            raise ValueError(
                f"{key} = {value!r}: must be {'none' if key == 'sync.overlap' else 1} with DDP (it averages "
                "gradients every step: there is no round to overlap)"
            )
        if p == 1:
            if tau or self.fragment_alpha:
                key = "sync.fragment_delay" if tau else "sync.fragment_alpha"
                raise ValueError(
                    f"{key}: set with sync.fragments = 1; it applies to streaming fragments only"
                )
            return
        if inner_steps % p:
            raise ValueError(
                f"sync.fragments = {p}: must divide algorithm.inner_steps ({inner_steps}): one fragment "
                "every H/F steps"
            )
        if tau >= inner_steps // p:
            raise ValueError(
                f"sync.fragment_delay = {tau}: must be < algorithm.inner_steps / sync.fragments "
                f"({inner_steps // p}): a fragment lands before the next is sent"
            )
        if self.overlap != "none":
            raise ValueError(
                f"sync.overlap = {self.overlap!r}: must be none with sync.fragments > 1 (streaming overlaps "
                "by sync.fragment_delay)"
            )
        if wire.error_feedback or wire.feedback:
            why = (
                f" (comm.dtype = {wire.dtype!r} turns it on unless set false)"
                if wire.error_feedback is None
                else ""
            )
            raise ValueError(f"comm.error_feedback: must be false with sync.fragments > 1{why}")


FLOAT32 = Wire()  # what merges, moves and initial broadcasts travel as


def words(names: list[str], last: str = "or") -> str:
    """'a, b or c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"
