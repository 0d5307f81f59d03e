"""Why a default is what it is: the measurement (a section of benchmarks/RESULTS.md, named by its
heading) or the source behind each default a user would tune, shown by ``adloco config`` under the key
while the value is the default (or the method's preset); a value the user set carries none.

One table, beside the fields, so that a default that changes changes its reason in the same commit; a
test holds every key to a field and every cited section to a heading of RESULTS.md."""

from __future__ import annotations

# RESULTS.md sections, by the start of their heading
DEFAULT_RUN = "How the embedded default was chosen"
COMPARED = "The methods compared, tuned, over three seeds"
SCALING = "Does AdLoCo pay as models grow?"
MUON = "Muon as the inner optimizer"
MUON_NS = "Muon's Newton–Schulz on a CPU"
MUON_DEFAULT = "The default since: `inner.optimizer: auto`"
SPARSE = "SparseLoCo's codec"
LONG = "Compression on long runs"
DILOCO_OUTER = "DiLoCo's outer step: the preset"
KNOBS_LONG = "Knobs chosen again at 8×"

# section.key -> (why, the RESULTS sections it rests on)
REASONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "algorithm.rounds": (
        "8 rounds end the demo in about 2 minutes of training on 2 cores; the benches run 12 or more",
        (DEFAULT_RUN,),
    ),
    "algorithm.inner_steps": (
        "the benches' H; DiLoCo's time-tuned grid chose 12 on code and 24 on prose; 8x longer on code, H 24 "
        "ended DiLoCo 38% above H 12",
        (COMPARED, SCALING, KNOBS_LONG),
    ),
    "inner.optimizer": (
        "auto: Muon for a language model where every process runs on a CPU, else AdamW. Muon ended every "
        "language-model run measured below "
        "AdamW: 6-round runs at 0.47-0.69x (1.4M and 11M parameters), 8x longer at 1.4M at 0.54-0.92x (both "
        "corpora, both methods and the batch schedule), 16x at 0.55-0.91x, the compute-optimal budget at "
        "0.85x (the schedule), AdLoCo at 11M and 8x at 0.31-0.36x (2 seeds) and the schedule at 0.37x; on a "
        "CPU per second too, its step's cost counted (AdLoCo at 11M reached its target in 0.51-0.57x AdamW's "
        "time; the demo ended at 0.46x in 0.99-1.13x the wall clock, 1 seed). On a GPU its step inside the "
        "CUDA graphs that run workers side by side is not yet timed, so AdamW stays there until it is (the "
        "test is written in RESULTS); models past 11M parameters are not measured; a classifier (model.task "
        "classification) is not measured with Muon, which left a small BERT at chance where AdamW learned its "
        "task (tests/e2e/test_classification.py). A resumed run keeps the "
        "choice it began with; set adamw or muon to choose",
        (MUON_DEFAULT, MUON, LONG, KNOBS_LONG, MUON_NS),
    ),
    "inner.muon_ns_dtype": (
        "auto: bfloat16, torch's, where it runs natively (a GPU; a CPU with AVX512-BF16 or AMX), float32 on "
        "a CPU without them, which emulates bfloat16 (a llama-10m step 9-38x AdamW's, float32 1.3-2.7x) and "
        "where float32 trains alike (5 of 6 paired runs within 0.04%); the run's first lines say which",
        (MUON_NS,),
    ),
    "inner.lr": (
        "best per example on the embedded default with AdamW (2e-3 ended level on more examples); with Muon "
        "(auto on a CPU), Muon's lr at this one (muon_lr_ratio 1) ended 6-round runs within 4% of the best "
        "ratio of 0.5-2 (seed 0); the benches' best falls as models grow (2e-3 at 11M, 1e-3 at 28M parameters)",
        (DEFAULT_RUN, MUON, SCALING),
    ),
    "outer.optimizer": (
        "AdLoCo's step: averaging ended the embedded default at 324 against 391 for the paper's SGD lr 0.5 "
        "and 698 for DiLoCo's Nesterov",
        (DEFAULT_RUN,),
    ),
    "outer.lr": ("the DiLoCo paper's Nesterov lr, read by outer.optimizer nesterov and sgd", ()),
    "outer.momentum": ("the DiLoCo paper's Nesterov momentum, read by outer.optimizer nesterov only", ()),
    "batch.eta": (
        "lets the demo's requests grow past kappa x b_max, so it shows the switch to accumulation; the tuned "
        "benches chose 0.8-0.9 (the paper's 0.8), and 8x longer 0.9 ended 5% below 0.8, level with 0.95 on "
        "2 seeds but reaching its target sooner with 0.64x the bytes, 0.85 higher on the second",
        (DEFAULT_RUN, COMPARED, SCALING, KNOBS_LONG),
    ),
    "switch.b_max": (
        "null: on CUDA the largest micro-batch that fits, searched; on a CPU 8, which the short benches chose "
        "over 16, but on runs 8x and 16x longer 8 capped most of AdLoCo's steps (requests of 9-10 ran as 8) and "
        "16 ended 1-4% lower with fewer bytes: set 16 or more for long runs on a CPU (batch.noise_rows, "
        "requested by default, lets requests grow past b_max by accumulation)",
        (SCALING, KNOBS_LONG),
    ),
    "batch.noise_rows": (
        "null, requested with the norm test: probed (the test as first specified) bounds its target by the "
        "rows probed, and at eta 0.9 a request of 10 on steps capped at 8 stayed at 10 for 539 rounds; "
        "requested ended each of 7 runs 1-18% lower, sooner, with 0.30-0.57x the bytes (llama-tiny on code "
        "and prose, 8x to the compute-optimal 52x, 1-2 seeds); the embedded default trains the same either "
        "way; a run made before the key resumes with probed",
        (KNOBS_LONG,),
    ),
    "merge.every": ("merging every 3 rounds ended the embedded default at 421 against 324", (DEFAULT_RUN,)),
    "comm.dtype": (
        "exact; int4 with error feedback sends 7.8x fewer bytes for up to 3% more perplexity, topk 136x "
        "fewer for more: choose one where links are slow",
        (SPARSE, LONG),
    ),
    "comm.error_decay": (
        "null: the codec's (topk: SparseLoCo's beta 0.95, which ended lowest of 1, 0.99 and 0.95; the others "
        "1, the error kept whole)",
        (SPARSE,),
    ),
    "comm.topk_fraction": (
        "Covenant-72B's density; on a short run 1/32 and 1/16 ended 11% and 20% lower for 1.9x and 3.8x the "
        "bytes, but on a run 8x longer 1/16 ended 15% higher than 1/64",
        (SPARSE,),
    ),
    "comm.topk_bits": ("SparseLoCo's 2 bits; 4 bits ended 2% lower for 1.3x the bytes", (SPARSE,)),
}

# (method, section.key) -> why, where a preset sets the value
PRESET_REASONS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("diloco", "outer.optimizer"): (
        "DiLoCo's preset: SGD without momentum ended every measurement at 0.39-0.71x the paper's Nesterov "
        "0.7/0.9 (2 and 4 workers, H 12, llama-tiny, up to 32,768 examples); the paper's is "
        "outer.optimizer nesterov, outer.lr 0.7",
        (DILOCO_OUTER,),
    ),
    ("diloco", "outer.lr"): (
        "DiLoCo's preset: 0.5, 0.7 and 1 ended within 6% at 2 workers; at 4, 0.5 ended 15% below 1 at "
        "4,096 examples and lowest on the mean of 2 seeds at 32,768 (lr 1 lower on one of them)",
        (DILOCO_OUTER,),
    ),
}


def reason(method: str, key: str, preset: bool) -> str | None:
    """The line that says why ``key`` holds its value, where it holds ``method``'s preset (``preset``) or
    the field's default; None where there is none to say."""
    found = PRESET_REASONS.get((method, key)) if preset else REASONS.get(key)
    if found is None:
        return None
    why, sections = found
    return why + (f" (RESULTS: {'; '.join(sections)})" if sections else "")
