"""Bad input, as a table: one line naming the field or file, the value and what is allowed; exit code 2;
no run directory left behind (and, for --resume, the run directory untouched).

Classes of mistakes: a field's type or range, a name that does not exist, a config file's syntax and
shape, a data file that cannot be parsed or is not text, a size this machine cannot hold (measured
against a fixed 16 GiB here), a checkpoint that does not fit its tokenizer, a command line argparse
refuses, a run directory --resume cannot use."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from adloco.cli import main
from adloco.models import sizing
from tests.helpers import TINY_QUIET, S, tiny_checkpoint


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> dict[str, Path]:
    """Files the cases point at: a tiny checkpoint (vocabulary 300, 64 positions), a finished run, a run
    directory with no checkpoint, and assorted broken inputs."""
    tmp = tmp_path_factory.mktemp("bad-input")
    tiny_checkpoint(tmp / "ckpt", text_corpus)
    assert (
        main(["train", *S(f"data.source={text_corpus}", f"logging.out_dir={tmp / 'ok'}", *TINY_QUIET)]) == 0
    )
    (run_ok,) = list((tmp / "ok").iterdir())
    old = tmp / "old-format"  # a run whose checkpoint an earlier adloco wrote (format 2: safetensors)
    (old / "checkpoints" / "round-000002").mkdir(parents=True)
    (old / "config.yaml").write_text((run_ok / "config.yaml").read_text())
    (old / "checkpoints" / "round-000002" / "state.json").write_text(
        json.dumps({"format": 2, "round": 2, "files": {"rng.safetensors": {"bytes": 1, "sha256": ""}}})
    )
    nock = tmp / "nock"
    nock.mkdir()
    (nock / "config.yaml").write_text((run_ok / "config.yaml").read_text())
    (tmp / "bad.yaml").write_text("batch:\n  eta: [0.5\n")
    (tmp / "empty").mkdir()
    (tmp / "empty" / "a.txt").write_text("")
    (tmp / "rows.jsonl").write_text("\n".join(json.dumps({"body": f"row {i}"}) for i in range(10)))
    (tmp / "smallval").mkdir()
    (tmp / "smallval" / "big.txt").write_text(" ".join(f"w{i}" for i in range(3000)))
    (tmp / "smallval" / "small.txt").write_text("tiny")
    (tmp / "afile").write_text("x")
    custom = tmp / "custom"  # a checkpoint that would run its own code: it must not run
    custom.mkdir()
    (custom / "config.json").write_text(
        json.dumps(
            {"model_type": "own", "auto_map": {"AutoConfig": "own.C", "AutoModelForCausalLM": "own.M"}}
        )
    )
    (custom / "own.py").write_text(f"open({str(tmp / 'RAN')!r}, 'w').write('code ran')\n")
    # broken files of every kind a data.source can name, and config files of the wrong shape
    rows = [json.dumps({"text": f"row {i}"}) for i in range(6)]
    (tmp / "broken.jsonl").write_text("\n".join(rows[:3] + ['{"text": "row 3",'] + rows[4:]) + "\n")
    (tmp / "scalar.jsonl").write_text("\n".join(rows[:2] + ["", "[1, 2]"]) + "\n")
    (tmp / "bad.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 4)
    (tmp / "ragged.csv").write_text('text,label\n"a, quoted comma",1\nb,0\nc,1,extra\n')
    (tmp / "headless.csv").write_text("")
    (tmp / "latin1.txt").write_bytes("caf\u00e9 au lait\n\nna\u00efve\n".encode("latin-1"))
    (tmp / "mixed").mkdir()
    (tmp / "mixed" / "a.txt").write_text("plain text " * 50)
    (tmp / "mixed" / "b.md").write_text("more text " * 50)
    (tmp / "mixed" / "c.txt").write_bytes(b"GIF89a\x01\x00\x01\x00\x00\xff")  # a binary named .txt
    (tmp / "section5.yaml").write_text("algorithm: 5\n")
    (tmp / "oldcomm.yaml").write_text("comm:\n  dtype: int8\n  fragments: 2\n")
    (tmp / "list.yaml").write_text("- model\n- data\n")
    (tmp / "latin1.yaml").write_bytes("logging:\n  name: caf\u00e9\n".encode("latin-1"))
    return {"tmp": tmp, "corpus": text_corpus, "ckpt": tmp / "ckpt", "run": run_ok, "nock": nock}


@pytest.fixture(autouse=True)
def sixteen_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every line is judged against a fixed machine, whatever this one is: 16 GiB of memory, no GPU, and
    no tensorboard package."""
    import torch

    from adloco.telemetry import metrics

    monkeypatch.setattr(sizing, "physical_memory", lambda: 16 * 2**30)
    monkeypatch.setattr(sizing, "cuda_memory", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    installed = metrics.available
    monkeypatch.setattr(metrics, "available", lambda sink: sink != "tensorboard" and installed(sink))


# `adloco launch`'s options around a valid config (the finished run's)
LAUNCH = ["--config", "{run}/config.yaml", "--nodes", "2", "--nproc-per-node", "2"]

# (case, arguments after `adloco`, the exact line) with {tmp}, {ckpt}, {run}, {nock}, {corpus} filled in.
CASES: list[tuple[str, list[str], str]] = [
    (
        "int-not-a-number",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.rounds=abc")],
        "config: algorithm.rounds = 'abc': must be an integer",
    ),
    (
        "rounds-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.rounds=0")],
        "config: algorithm.rounds = 0: must be >= 1",
    ),
    (
        "workers-fraction",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.workers=2.5")],
        "config: algorithm.workers = 2.5: must be an integer",
    ),
    (
        "seed-negative",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.seed=-1")],
        "config: algorithm.seed = -1: must be in [0, 2**31)",
    ),
    (
        "inner-lr-negative",
        ["train", *S("logging.out_dir={tmp}/runs", "inner.lr=-1")],
        "config: inner.lr = -1.0: must be > 0",
    ),
    (
        "eta-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.eta=0")],
        "config: batch.eta = 0.0: must be > 0",
    ),
    (
        "kappa-below-one",
        ["train", *S("logging.out_dir={tmp}/runs", "switch.kappa=0.5")],
        "config: switch.kappa = 0.5: must be >= 1",
    ),
    (
        "b-max-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "switch.b_max=0")],
        "config: switch.b_max = 0: must be >= 1 and <= 1048576, or null",
    ),
    (
        "val-fraction",
        ["train", *S("logging.out_dir={tmp}/runs", "data.val_fraction=1.5")],
        "config: data.val_fraction = 1.5: must be between 0 and 1 (exclusive)",
    ),
    (
        "timeout-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.timeout=0")],
        "config: runtime.timeout = 0.0: must be between 1 and 86400 seconds",
    ),
    (
        "checkpoint-keep-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "checkpoint.keep=0")],
        "config: checkpoint.keep = 0: must be between 1 and 1000",
    ),
    (
        "checkpoint-every-negative",
        ["train", *S("logging.out_dir={tmp}/runs", "checkpoint.every=-1")],
        "config: checkpoint.every = -1: must be >= 0 (0: only at the end)",
    ),
    (
        "checkpoint-dir-unknown-protocol",
        ["train", *S("logging.out_dir={tmp}/runs", "checkpoint.dir=nosuch://bucket/runs")],
        "config: checkpoint.dir = 'nosuch://bucket/runs': no filesystem for 'nosuch' (a path, or a URL fsspec knows: file://, memory://, s3://, gs://, ...)",
    ),
    (
        "checkpoint-dir-package-missing",
        ["train", *S("logging.out_dir={tmp}/runs", "checkpoint.dir=oci://bucket/runs")],
        "config: checkpoint.dir = 'oci://bucket/runs': the filesystem for 'oci' needs a package that is not installed (Install ocifs to access OCI Object Storage)",
    ),
    (
        "checkpoint-dir-not-writable",
        ["train", *S("logging.out_dir={tmp}/runs", "checkpoint.dir={tmp}/afile/ck")],
        "config: checkpoint.dir = '{tmp}/afile/ck': cannot be written (Not a directory)",
    ),
    (
        "checkpoint-async-not-writable",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "checkpoint.async_save=true",
                "checkpoint.dir=file://{tmp}/afile/ck",
            ),
        ],
        "config: checkpoint.dir = 'file://{tmp}/afile/ck': cannot be written (Not a directory)",
    ),
    (
        "checkpoint-async-not-a-bool",
        ["train", *S("logging.out_dir={tmp}/runs", "checkpoint.async_save=maybe")],
        "config: checkpoint.async_save = 'maybe': must be true or false",
    ),
    (
        "max-bad-rounds-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "faults.max_bad_rounds=0")],
        "config: faults.max_bad_rounds = 0: must be >= 1",
    ),
    (
        "eval-every-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "eval.every=0")],
        "config: eval.every = 0: must be >= 1",
    ),
    (
        "bool-not-bool",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.plots=maybe")],
        "config: logging.plots = 'maybe': must be true or false",
    ),
    (
        "unknown-key",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.etaa=0.5")],
        "config: unknown key 'batch.etaa'; did you mean 'batch.eta'? (allowed: test, initial, max, eta, vartheta, nu, estimator, probe_chunks, statistics, exact_mean, noise_rows, formula, lr_scaling, lr_scale_max, wd_scaling, schedule, schedule_examples, schedule_power)",
    ),
    (
        "typo-names-the-full-key",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.round=3")],
        "config: unknown key 'algorithm.round'; did you mean 'algorithm.rounds'? (allowed: method, rounds, inner_steps, workers, trainers, seed, budget)",
    ),
    (
        "key-of-another-section",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.rounds=3")],
        "config: unknown key 'batch.rounds'; did you mean 'algorithm.rounds'? (allowed: test, initial, max, eta, vartheta, nu, estimator, probe_chunks, statistics, exact_mean, noise_rows, formula, lr_scaling, lr_scale_max, wd_scaling, schedule, schedule_examples, schedule_power)",
    ),
    (
        "unknown-section",
        ["train", *S("logging.out_dir={tmp}/runs", "bach.eta=0.5")],
        "config: unknown section 'bach'; did you mean 'batch'? (allowed: model, data, algorithm, inner, outer, batch, merge, switch, eval, runtime, comm, sync, network, checkpoint, elastic, faults, logging)",
    ),
    (
        "unknown-method",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.method=sgdx")],
        "config: algorithm.method = 'sgdx': must be one of 'adloco', 'diloco', 'localsgd', 'ddp'",
    ),
    (
        "unknown-choice",
        ["train", *S("logging.out_dir={tmp}/runs", "merge.policy=random")],
        "config: merge.policy = 'random': must be one of 'smallest', 'largest_with_smallest', 'none'",
    ),
    (
        "unknown-outer-optimizer",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=adam")],
        "config: outer.optimizer = 'adam': must be average, sgd or nesterov, or a factory named module:function "
        "(mypkg.outer:make_adam)",
    ),
    (
        "outer-optimizer-misspelt",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=nesterv")],
        "config: outer.optimizer = 'nesterv': must be average, sgd or nesterov, or a factory named "
        "module:function (mypkg.outer:make_adam); did you mean 'nesterov'?",
    ),
    (
        "outer-factory-module-missing",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=no_such_package.outer:make")],
        "config: outer.optimizer = 'no_such_package.outer:make': module 'no_such_package.outer' does not import "
        "(ModuleNotFoundError: No module named 'no_such_package'); it is looked for in the installed packages, "
        "PYTHONPATH and the current folder",
    ),
    (
        "outer-factory-attribute-missing",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=torch.optim:Adamm")],
        "config: outer.optimizer = 'torch.optim:Adamm': 'torch.optim' has no attribute 'Adamm'; did you mean "
        "'Adam'?",
    ),
    (
        "outer-factory-not-callable",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=math:pi")],
        "config: outer.optimizer = 'math:pi': math.pi is a float, not a callable",
    ),
    (
        "override-syntax",
        ["train", *S("logging.out_dir={tmp}/runs"), "--set", "batch.eta"],
        "--set 'batch.eta': must look like section.key=value",
    ),
    (
        "malformed-yaml",
        ["train", "--config", "{tmp}/bad.yaml", *S("logging.out_dir={tmp}/runs")],
        "config file '{tmp}/bad.yaml': malformed YAML at line 3, column 1: expected ',' or ']', but got '<stream end>'",
    ),
    (
        "missing-config",
        ["train", "--config", "{tmp}/nope.yaml", *S("logging.out_dir={tmp}/runs")],
        "config file '{tmp}/nope.yaml': not found",
    ),
    (
        "more-trainers-than-workers",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.trainers=5")],
        "config: algorithm.trainers = 5: must be <= algorithm.workers (4): every trainer needs at least one worker",
    ),
    (
        "cap-below-initial",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.initial=8", "batch.max=4")],
        "config: batch.max = 4: must be >= batch.initial (8)",
    ),
    (
        "schedule-with-a-test",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.schedule=ramp")],
        "config: batch.schedule = 'ramp': must be none with batch.test = 'norm' (a schedule and a test would both set the next round's request: set batch.test none to follow a schedule)",
    ),
    (
        "schedule-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.test=none", "batch.schedule=cosine")],
        "config: batch.schedule = 'cosine': must be one of 'none', 'power', 'ramp'",
    ),
    (
        "schedule-examples-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.schedule_examples=0")],
        "config: batch.schedule_examples = 0: must be >= 1",
    ),
    (
        "schedule-power-above-one",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.schedule_power=1.5")],
        "config: batch.schedule_power = 1.5: must be in (0, 1]",
    ),
    (
        "missing-data",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/no-such-corpus")],
        "data.source = '{tmp}/no-such-corpus': no such file or folder (or use 'stdlib')",
    ),
    (
        "empty-data",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/empty")],
        "data.source = '{tmp}/empty': every document is empty (no text in field 'text')",
    ),
    (
        "no-text-field",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/rows.jsonl")],
        "data file 'rows.jsonl': no field 'text' (fields: body); set data.text_field",
    ),
    (
        "empty-validation",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "data.source={tmp}/smallval",
                "data.val_fraction=0.5",
                "data.seq_len=64",
                "data.tokenizer=bpe:300",
            ),
        ],
        "data: the validation split holds no blocks of data.seq_len = 64 tokens; raise data.val_fraction or lower data.seq_len",
    ),
    (
        "hub-offline",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source=allenai/c4")],
        "config: data.source = 'allenai/c4': not a local path, and not in the Hugging Face cache while offline (HF_HUB_OFFLINE=1); point data.source at local files or a folder (txt, md, jsonl, csv, parquet)",
    ),
    (
        "seq-len-over-positions",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "data.source={corpus}",
                "model.name={ckpt}",
                "data.tokenizer={ckpt}",
                "data.seq_len=128",
            ),
        ],
        "config: data.seq_len = 128: larger than model.name = '{ckpt}''s maximum positions (64)",
    ),
    (
        "tokenizer-over-embedding",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "data.source={corpus}",
                "data.seq_len=16",
                "model.name={ckpt}",
                "data.tokenizer=bpe:400",
            ),
        ],
        "config: data.tokenizer: its vocabulary (400 tokens) does not match model.name = '{ckpt}''s embedding (300 rows); use the model's own tokenizer (leave data.tokenizer unset)",
    ),
    (
        "tokenizer-under-embedding",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "data.source={corpus}",
                "data.seq_len=16",
                "model.name={ckpt}",
                "data.tokenizer=bpe:260",
            ),
        ],
        "config: data.tokenizer: its vocabulary (260 tokens) does not match model.name = '{ckpt}''s embedding (300 rows); use the model's own tokenizer (leave data.tokenizer unset)",
    ),
    (
        "remote-code-not-trusted",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "model.name={tmp}/custom",
                "data.source={corpus}",
                "data.tokenizer=bpe:300",
                "data.seq_len=16",
            ),
        ],
        "config: model.name = '{tmp}/custom': ships its own Python code, which adloco does not run unless asked: set model.trust_remote_code=true only if you trust it",
    ),
    (
        "out-dir-not-writable",
        ["train", *S("logging.out_dir={tmp}/afile/runs", "data.source={corpus}", *TINY_QUIET)],
        "config: logging.out_dir = '{tmp}/afile/runs': cannot be created (Not a directory)",
    ),
    (
        "out-dir-a-file",
        ["train", *S("logging.out_dir={tmp}/afile", "data.source={corpus}", *TINY_QUIET)],
        "config: logging.out_dir = '{tmp}/afile': a file, not a folder (name a folder for run directories)",
    ),
    (
        "name-with-slash",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.name=a/b")],
        "config: logging.name = 'a/b': must be a plain name of letters, digits, '.', '_' or '-' (no '/'), at most 100 characters",
    ),
    ("nproc-zero", ["train", *S("logging.out_dir={tmp}/runs"), "--nproc", "0"], "--nproc 0: must be >= 1"),
    (
        "nproc-layout",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "algorithm.workers=3", "algorithm.trainers=3"),
            "--nproc",
            "2",
        ],
        "config: algorithm.workers = 3: must equal processes (2) x runtime.workers_per_process (1)",
    ),
    (
        "comm-overlap-moved",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.overlap=delayed")],
        "config: comm.overlap: moved to sync.overlap (comm says what Δ travels as, sync when it travels)",
    ),
    (
        "comm-fragments-moved",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.fragments=2")],
        "config: comm.fragments: moved to sync.fragments (comm says what Δ travels as, sync when it travels)",
    ),
    (
        "comm-fragment-delay-moved",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.fragment_delay=1")],
        "config: comm.fragment_delay: moved to sync.fragment_delay (comm says what Δ travels as, sync when it travels)",
    ),
    (
        "comm-fragment-alpha-moved",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.fragment_alpha=0.5")],
        "config: comm.fragment_alpha: moved to sync.fragment_alpha (comm says what Δ travels as, sync when it travels)",
    ),
    (
        "comm-moved-in-a-file",
        ["train", "--config", "{tmp}/oldcomm.yaml", *S("logging.out_dir={tmp}/runs")],
        "config: comm.fragments: moved to sync.fragments (comm says what Δ travels as, sync when it travels)",
    ),
    (
        "sync-fragments-more-than-parameters",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "data.source={corpus}",  # a small corpus: the check needs the vocabulary, not the default's 40 s
                "data.tokenizer=bpe:300",
                "algorithm.inner_steps=4000000",
                "sync.fragments=4000000",
            ),
        ],
        "config: sync.fragments = 4000000: more fragments than parameters (891520)",
    ),
    (
        "overlap-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "sync.overlap=later")],
        "config: sync.overlap = 'later': must be one of 'none', 'delayed', 'eager'",
    ),
    (
        "overlap-ddp",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.method=ddp", "sync.overlap=eager")],
        "config: sync.overlap = 'eager': must be none with DDP (it averages gradients every step: there is no round to overlap)",
    ),
    (
        "fragments-not-dividing-h",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.inner_steps=6", "sync.fragments=4")],
        "config: sync.fragments = 4: must divide algorithm.inner_steps (6): one fragment every H/F steps",
    ),
    (
        "fragment-delay-too-long",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "algorithm.inner_steps=8", "sync.fragments=4"),
            *S("sync.fragment_delay=2"),
        ],
        "config: sync.fragment_delay = 2: must be < algorithm.inner_steps / sync.fragments (2): a fragment lands before the next is sent",
    ),
    (
        "fragments-with-overlap",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "algorithm.inner_steps=8", "sync.fragments=4"),
            *S("sync.overlap=delayed"),
        ],
        "config: sync.overlap = 'delayed': must be none with sync.fragments > 1 (streaming overlaps by sync.fragment_delay)",
    ),
    (
        "fragment-alpha-range",
        ["train", *S("logging.out_dir={tmp}/runs", "sync.fragment_alpha=1.5")],
        "config: sync.fragment_alpha = 1.5: must be in [0, 1]",
    ),
    (
        "topk-fraction-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_fraction=0")],
        "config: comm.topk_fraction = 0.0: must be in (0, 1]",
    ),
    (
        "topk-block-one",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_block=1")],
        "config: comm.topk_block = 1: must be between 2 and 16777216 values",
    ),
    (
        "noise-rows-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.noise_rows=all")],
        "config: batch.noise_rows = 'all': must be one of 'probed', 'requested' or null",
    ),
    (
        "noise-rows-requested-without-the-norm-test",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.test=inner_product", "batch.noise_rows=requested")],
        "config: batch.noise_rows = 'requested': must be probed or null with batch.test = 'inner_product' (requested "
        "changes the norm test alone)",
    ),
    (
        "topk-bits-nine",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_bits=9")],
        "config: comm.topk_bits = 9: must be in [1, 8]",
    ),
    (
        "topk-fraction-above-one",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_fraction=1.5")],
        "config: comm.topk_fraction = 1.5: must be in (0, 1]",
    ),
    (
        "topk-fraction-word",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_fraction=abc")],
        "config: comm.topk_fraction = 'abc': must be a number",
    ),
    (
        "topk-block-fractional",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_block=64.5")],
        "config: comm.topk_block = 64.5: must be an integer",
    ),
    (
        "topk-bits-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_bits=0")],
        "config: comm.topk_bits = 0: must be in [1, 8]",
    ),
    (
        "topk-key-without-topk",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.topk_fraction=0.03")],
        "config: comm.topk_fraction = 0.03: must be 0.015625 (its default) unless comm.dtype is topk, the only "
        "dtype it applies to (comm.dtype is 'float32')",
    ),
    (
        "error-feedback-with-float32",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.error_feedback=true")],
        "config: comm.error_feedback = True: must be false or null with comm.dtype float32 (nothing is "
        "dropped, so nothing is fed back); it applies to bfloat16, float16, int8, int4 and topk",
    ),
    (
        "topk-key-with-int4",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=int4", "comm.topk_block=1024")],
        "config: comm.topk_block = 1024: must be 4096 (its default) unless comm.dtype is topk, the only dtype "
        "it applies to (comm.dtype is 'int4')",
    ),
    (
        "error-feedback-word",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.error_feedback=maybe")],
        "config: comm.error_feedback = 'maybe': must be true or false or null",
    ),
    (
        "error-decay-above-one",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.error_decay=1.5")],
        "config: comm.error_decay = 1.5: must be in [0, 1] or null",
    ),
    (
        "error-decay-word",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.error_decay=fast")],
        "config: comm.error_decay = 'fast': must be a number or null",
    ),
    (
        "error-decay-without-feedback",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=int4", "comm.error_decay=0.9")],
        "config: comm.error_decay = 0.9: must be null unless error feedback is on (comm.error_feedback true, "
        "or null with a codec that turns it on: topk); it is the feedback's decay",
    ),
    (
        "error-decay-feedback-off",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "comm.dtype=topk",
                "comm.error_feedback=false",
                "comm.error_decay=0.9",
            ),
        ],
        "config: comm.error_decay = 0.9: must be null unless error feedback is on (comm.error_feedback true, "
        "or null with a codec that turns it on: topk); it is the feedback's decay",
    ),
    (
        "topk-mean-word",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "comm.topk_mean=median")],
        "config: comm.topk_mean = 'median': must be one of 'senders', 'all'",
    ),
    (
        "topk-mean-with-int4",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=int4", "comm.topk_mean=all")],
        "config: comm.topk_mean = 'all': must be 'senders' (its default) unless comm.dtype is topk, the only "
        "dtype it applies to (comm.dtype is 'int4')",
    ),
    (
        "outer-momentum-with-sgd",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=sgd", "outer.momentum=0.5")],
        "config: outer.momentum = 0.5: applies to outer.optimizer nesterov only (the outer step is sgd); set "
        "outer.optimizer=nesterov to use a momentum",
    ),
    (
        "outer-factory-not-an-optimizer",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=builtins:list")],
        "config: outer.optimizer = 'builtins:list': the factory returned a list, not a torch.optim.Optimizer",
    ),
    (
        "outer-lr-with-a-factory",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.optimizer=torch.optim:Adam", "outer.lr=0.5")],
        "config: outer.lr = 0.5: applies to outer.optimizer sgd and nesterov only (torch.optim:Adam sets its "
        "own); set outer.optimizer=sgd to choose an lr",
    ),
    (
        "outer-lr-with-average",
        ["train", *S("logging.out_dir={tmp}/runs", "outer.lr=0.5")],
        "config: outer.lr = 0.5: applies to outer.optimizer sgd and nesterov only (average steps the whole "
        "mean, lr 1); set outer.optimizer=sgd to choose an lr",
    ),
    (
        "theta-topk",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.theta_dtype=topk")],
        "config: comm.theta_dtype = 'topk': must be float32, bfloat16, float16, int8, int4 or null: θ is not sparse "
        "(a top-k of θ would send a few weights and zero the rest); topk is for comm.dtype",
    ),
    (
        "topk-ddp",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.method=ddp", "comm.dtype=topk")],
        "config: comm.dtype = 'topk': must be float32, bfloat16, float16, int8 or int4 with DDP (its gradients "
        "are averaged every step with no error feedback, which topk needs)",
    ),
    (
        "topk-shared-mean",
        ["train", *S("logging.out_dir={tmp}/runs", "comm.dtype=topk", "batch.exact_mean=true")],
        "config: comm.dtype = 'topk': must be float32, bfloat16, float16, int8 or int4 when the batch test "
        "all-reduces the mean probe gradient (batch.exact_mean, the inner-product tests, batch.estimator "
        "paper: its topk, with no error feedback, would bias ‖ḡ‖²), or keep topk with the norm test and the "
        "pooled estimator",
    ),
    (
        "topk-streaming",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "algorithm.inner_steps=8", "sync.fragments=2"),
            *S("comm.dtype=topk"),
        ],
        "config: comm.error_feedback: must be false with sync.fragments > 1 (comm.dtype = 'topk' turns it on "
        "unless set false)",
    ),
    (
        "shards-not-dividing-processes",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.shards=2"), "--nproc", "3"],
        "config: runtime.shards = 2: must divide the number of processes (3): each worker is runtime.shards processes",
    ),
    (
        "shards-workers-layout",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "runtime.shards=2", "algorithm.workers=4"),
            "--nproc",
            "4",
        ],
        "config: algorithm.workers = 4: must equal processes (4) / runtime.shards (2) = 2",
    ),
    (
        "shards-in-process",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.shards=2", "runtime.backend=inprocess")],
        "config: runtime.backend = 'inprocess': must be torchdist or auto with runtime.shards > 1 (shards are processes: adloco train --nproc N)",
    ),
    (
        "device-cuda-without-one",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.device=cuda")],
        "config: runtime.device = 'cuda': no CUDA device is available (use 'auto' or 'cpu')",
    ),
    (
        "mixed-precision-without-cuda",
        ["train", *S("logging.out_dir={tmp}/runs", "model.precision=fp16")],
        "config: model.precision = 'fp16': mixed precision needs CUDA (this run is on cpu); use fp32",
    ),
    (
        "tensorboard-on-without-the-package",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.tensorboard=on")],
        "config: logging.tensorboard = 'on': the tensorboard package is not installed (pip install 'adloco[tensorboard]', or 'auto' to log there only when installed)",
    ),
    (
        "torchdist-without-a-launcher",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.backend=torchdist")],
        "config: runtime.backend = 'torchdist': start with `torchrun --nproc-per-node N -m adloco train ...` or `adloco train --nproc N ...`",
    ),
    (
        "shards-in-one-process",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.shards=2")],
        "config: runtime.shards = 2: a sharded worker is several processes: start with adloco train --nproc N (or torchrun), N = algorithm.workers x runtime.shards",
    ),
    (
        "shards-with-several-workers-a-process",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.shards=2", "runtime.workers_per_process=2")],
        "config: runtime.workers_per_process = 2: must be 1 with runtime.shards > 1 (a worker spans processes, not the other way round)",
    ),
    (
        "trace-negative",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.trace=-1")],
        "config: logging.trace = -1: must be >= 0",
    ),
    (
        "wd-scaling-without-weight-decay",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.wd_scaling=timescale", "inner.weight_decay=0")],
        "config: batch.wd_scaling = 'timescale': must be none with inner.weight_decay = 0 (there is no weight decay to scale)",
    ),
    (
        "wd-scaling-in-a-cuda-graph",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.wd_scaling=timescale", "runtime.cuda_graphs=true")],
        "config: runtime.cuda_graphs = True: must be false or auto with batch.wd_scaling timescale (a captured step keeps the weight decay it was captured with)",
    ),
    (
        "wd-scaling-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.wd_scaling=linear")],
        "config: batch.wd_scaling = 'linear': must be one of 'none', 'timescale'",
    ),
    (
        "model-file-size-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.model_file_mb=0")],
        "config: logging.model_file_mb = 0: must be >= 1",
    ),
    (
        "model-file-size-not-a-number",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.model_file_mb=2GB")],
        "config: logging.model_file_mb = '2GB': must be an integer",
    ),
    (
        "inner-optimizer-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "inner.optimizer=lion")],
        "config: inner.optimizer = 'lion': must be one of 'auto', 'adamw', 'sgd', 'muon'",
    ),
    (
        "muon-lr-ratio-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "inner.muon_lr_ratio=0")],
        "config: inner.muon_lr_ratio = 0.0: must be in (0, 1000]",
    ),
    (
        "muon-momentum-one",
        ["train", *S("logging.out_dir={tmp}/runs", "inner.muon_momentum=1")],
        "config: inner.muon_momentum = 1.0: must be in [0, 1)",
    ),
    (
        "muon-adjust-lr-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "inner.muon_adjust_lr=keller")],
        "config: inner.muon_adjust_lr = 'keller': must be one of 'match_rms_adamw', 'original'",
    ),
    (
        "muon-ns-dtype-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "inner.muon_ns_dtype=float16")],
        "config: inner.muon_ns_dtype = 'float16': must be one of 'auto', 'bfloat16', 'float32'",
    ),
    (
        "cuda-graphs-fp16",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.cuda_graphs=true", "model.precision=fp16")],
        "config: model.precision = 'fp16': must be fp32 or bf16 with runtime.cuda_graphs (fp16's loss scaling decides on the host whether a step is skipped)",
    ),
    (
        "cuda-graphs-ddp",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.cuda_graphs=true", "algorithm.method=ddp")],
        "config: algorithm.method = 'ddp': must be adloco, diloco or localsgd with runtime.cuda_graphs (DDP averages gradients inside the step)",
    ),
    (
        "cuda-graphs-on-the-cpu-device",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.cuda_graphs=true", "runtime.device=cpu")],
        "config: runtime.device = 'cpu': must be auto or cuda with runtime.cuda_graphs",
    ),
    (
        "cuda-graphs-maybe",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.cuda_graphs=maybe")],
        "config: runtime.cuda_graphs = 'maybe': must be true or false or 'auto'",
    ),
    (
        "cuda-graphs-with-compiles-own-graphs",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "runtime.cuda_graphs=true",
                "runtime.compile=true",
                "runtime.compile_mode=reduce-overhead",
            ),
        ],
        "config: runtime.compile_mode = 'reduce-overhead': must be default or max-autotune-no-cudagraphs with runtime.cuda_graphs (the other modes capture graphs of their own)",
    ),
    (
        "compile-backend-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.compile=true", "runtime.compile_backend=turbo")],
        "config: runtime.compile_backend = 'turbo': must be a backend of torch.compile (aot_eager, cudagraphs, eager, inductor, openxla, tvm)",
    ),
    (
        "compile-with-shards",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "runtime.compile=true", "runtime.shards=2"),
            "--nproc",
            "2",
        ],
        "config: runtime.shards = 2: must be 1 with runtime.compile (the engine does not compile a model sharded with FSDP2)",
    ),
    (
        "compile-mode-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.compile_mode=fast")],
        "config: runtime.compile_mode = 'fast': must be one of 'default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'",
    ),
    (
        "shards-absurd",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.shards=0")],
        "config: runtime.shards = 0: must be in [1, 4096]",
    ),
    (
        "threads-absurd",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.threads=99999999999")],
        "config: runtime.threads = 99999999999: must be in [0, 4096]",
    ),
    (
        "bpe-vocab-absurd",
        ["train", *S("logging.out_dir={tmp}/runs", "data.tokenizer=bpe:99999999999")],
        "config: data.tokenizer = 'bpe:99999999999': must be 'bpe:<vocab size>' with a vocab size in [260, 1000000]",
    ),
    (
        "name-dot-dot",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.name=..")],
        "config: logging.name = '..': must be a plain name of letters, digits, '.', '_' or '-' (no '/'), at most 100 characters",
    ),
    (
        "batch-max-absurd",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.max=10000000000")],
        "config: batch.max = 10000000000: must be <= 1048576",
    ),
    (
        "cache-dir-not-a-folder",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "data.source={corpus}", "data.cache_dir={tmp}/afile/cache"),
        ],
        "cache folder '{tmp}/afile/cache/data': cannot be written (Not a directory); set data.cache_dir or $ADLOCO_CACHE to a writable folder",
    ),
    (
        "emulate-speed-wrong-length",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.emulate_speed=[1, 0.5]")],
        "config: runtime.emulate_speed = [1.0, 0.5]: must be empty or 4 numbers in (0, 1] (one per worker: 0.5 takes twice as long)",
    ),
    (
        "network-sites-do-not-sum",
        ["train", *S("logging.out_dir={tmp}/runs", "network.sites=[2, 1]")],
        "config: network.sites = [2, 1]: must be empty or workers per site summing to algorithm.workers (4), in worker order",
    ),
    (
        "network-site-of-no-worker",
        ["train", *S("logging.out_dir={tmp}/runs", "network.sites=[4, 0]")],
        "config: network.sites = [4, 0]: must be whole numbers of workers >= 1",
    ),
    (
        "network-upload-zero",
        ["train", *S("logging.out_dir={tmp}/runs", "network.upload=0")],
        "config: network.upload = 0.0: must be > 0 (bytes per second) or null",
    ),
    (
        "balance-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "runtime.balance=fastest")],
        "config: runtime.balance = 'fastest': must be one of 'equal', 'speed'",
    ),
    (
        "jsonl-broken-line",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/broken.jsonl")],
        "data file 'broken.jsonl': line 4 is not valid JSON (Expecting property name enclosed in double quotes, column 18); JSON Lines holds one object a line",
    ),
    (
        "jsonl-line-not-an-object",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/scalar.jsonl")],
        "data file 'scalar.jsonl': line 4 is a list, not an object of fields; JSON Lines holds one object a line",
    ),
    (
        "parquet-corrupt",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/bad.parquet")],
        "data file 'bad.parquet': not a readable Parquet file (Parquet magic bytes not found in footer. Either the file is corrupted or this is not a parquet file.)",
    ),
    (
        "csv-ragged",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/ragged.csv")],
        "data file 'ragged.csv': line 4 has 3 field(s), the header 2 (text, label); quote fields that hold commas",
    ),
    (
        "csv-no-header",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/headless.csv")],
        "data file 'headless.csv': no header line (CSV needs one naming the fields)",
    ),
    (
        "text-not-utf8",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/latin1.txt")],
        "data file 'latin1.txt': not UTF-8 text (byte 0xe9 on line 1); convert it to UTF-8 or leave it out of data.source",
    ),
    (
        "binary-in-a-text-folder",
        ["train", *S("logging.out_dir={tmp}/runs", "data.source={tmp}/mixed")],
        "data file 'c.txt': binary, not text (a NUL byte on line 1); leave it out of data.source",
    ),
    (
        "yaml-section-not-a-mapping",
        ["train", "--config", "{tmp}/section5.yaml", *S("logging.out_dir={tmp}/runs")],
        "config file '{tmp}/section5.yaml': algorithm = 5: a section must be a mapping of its keys, e.g. 'algorithm: {method: adloco}'",
    ),
    (
        "yaml-top-level-not-a-mapping",
        ["train", "--config", "{tmp}/list.yaml", *S("logging.out_dir={tmp}/runs")],
        "config file '{tmp}/list.yaml': the top level must be a mapping of sections (model, data, algorithm, inner, outer, batch, merge, switch, eval, runtime, comm, sync, network, checkpoint, elastic, faults, logging), got a list",
    ),
    (
        "yaml-not-utf8",
        ["train", "--config", "{tmp}/latin1.yaml", *S("logging.out_dir={tmp}/runs")],
        "config file '{tmp}/latin1.yaml': not UTF-8 text",
    ),
    (
        "config-file-is-a-folder",
        ["train", "--config", "{tmp}/empty", *S("logging.out_dir={tmp}/runs")],
        "config file '{tmp}/empty': a folder, not a file",
    ),
    (
        "set-a-section",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm=5")],
        "--set 'algorithm=5': 'algorithm' is a section; set one of its keys, e.g. --set algorithm.method=adloco",
    ),
    (
        "set-a-section-without-value",
        ["train", *S("logging.out_dir={tmp}/runs"), "--set", "inner"],
        "--set 'inner': 'inner' is a section; set one of its keys, e.g. --set inner.optimizer=auto",
    ),
    (
        "set-too-deep",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.eta.x=1")],
        "--set 'batch.eta.x=1': the key must be section.key, e.g. batch.eta=0.5",
    ),
    (
        "set-bench",
        ["train", *S("logging.out_dir={tmp}/runs", "bench.budget=100")],
        "--set 'bench.budget=100': the bench section is read by `adloco bench` only, from its config file (or its --budget and --target options)",
    ),
    (
        "workers-absurd",
        ["train", *S("logging.out_dir={tmp}/runs", "algorithm.workers=1000000")],
        "config: algorithm.workers = 1000000: 1,000,000 replicas of llama-tiny (1.4M parameters) need ~15,699 GiB of parameters, gradients and optimizer state; this machine has 16.0 GiB of memory",
    ),
    (
        "replicas-over-memory",
        ["train", *S("logging.out_dir={tmp}/runs", "model.name=microllama-300m", "data.tokenizer=bpe:32000")],
        "config: algorithm.workers = 4: 4 replicas of microllama-300m (305M parameters) need ~18.2 GiB of parameters, gradients and optimizer state; this machine has 16.0 GiB of memory",
    ),
    (
        "seq-len-absurd",
        ["train", *S("logging.out_dir={tmp}/runs", "data.seq_len=10000000")],
        "config: data.seq_len = 10000000: a micro-batch of 1 x 10,000,000 tokens through llama-tiny needs ~560 GiB on top of ~0.1 GiB for the replicas; this machine has 16.0 GiB of memory",
    ),
    (
        "micro-batch-absurd",
        ["train", *S("logging.out_dir={tmp}/runs", "batch.max=1048576", "switch.b_max=1048576")],
        "config: batch.max = 1048576: a micro-batch of 1,048,576 x 128 tokens through llama-tiny needs ~7,489 GiB on top of ~0.1 GiB for the replicas; this machine has 16.0 GiB of memory",
    ),
    (
        "eval-batch-absurd",
        [
            "train",
            *S("logging.out_dir={tmp}/runs", "eval.batch_size=1000000", "eval.max_examples=null"),
        ],
        "config: eval.batch_size = 1000000: a validation batch of 1,000,000 x 128 tokens through llama-tiny needs ~3,906 GiB on top of ~0.1 GiB for the replicas; this machine has 16.0 GiB of memory",
    ),
    (
        "probe-chunks-absurd",
        [
            "train",
            *S(
                "logging.out_dir={tmp}/runs",
                "batch.test=inner_product",
                "batch.max=1048576",
                "batch.probe_chunks=100000",
            ),
        ],
        "config: batch.probe_chunks = 100000: 4 replicas of llama-tiny (1.4M parameters) need ~2,053 GiB of parameters, gradients and optimizer state (100,000 probe gradients kept by each); this machine has 16.0 GiB of memory",
    ),
    (
        "argparse-unknown-option",
        ["train", "--bogus"],
        "unrecognized arguments: --bogus (see adloco train --help)",
    ),
    (
        "argparse-missing-argument",
        ["train", "--config"],
        "argument --config/-c: expected one argument (see adloco train --help)",
    ),
    (
        "argparse-not-an-int",
        ["train", "--nproc", "two"],
        "argument --nproc: invalid int value: 'two' (see adloco train --help)",
    ),
    (
        "argparse-missing-positional",
        ["report"],
        "the following arguments are required: RUN_DIR (see adloco report --help)",
    ),
    (
        "argparse-unknown-command",
        ["trian"],
        "unknown command 'trian' (commands: train, bench, analyze-gradients, profile, launch, simulate, report, config)",
    ),
    (
        "config-unknown-section",
        ["config", "batches"],
        "config: unknown section 'batches'; did you mean 'batch'? (allowed: model, data, algorithm, inner, outer, batch, merge, switch, eval, runtime, comm, sync, network, checkpoint, elastic, faults, logging)",
    ),
    (
        "tracker-unknown",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.trackers=wandb,tensorbored")],
        "config: logging.trackers = ['wandb', 'tensorbored']: must be a list of 'wandb', 'mlflow', each at most once (empty: none; TensorBoard is logging.tensorboard), e.g. [wandb]",
    ),
    (
        "tracker-twice",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.trackers=[mlflow, mlflow]")],
        "config: logging.trackers = ['mlflow', 'mlflow']: must be a list of 'wandb', 'mlflow', each at most once (empty: none; TensorBoard is logging.tensorboard), e.g. [wandb]",
    ),
    (
        "wandb-not-a-choice",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.wandb=maybe")],
        "config: logging.wandb = 'maybe': must be one of 'auto', 'on', 'off' (or list it in logging.trackers, e.g. [wandb])",
    ),
    (
        "mlflow-not-a-choice",
        ["train", *S("logging.out_dir={tmp}/runs", "logging.mlflow=2")],
        "config: logging.mlflow = 2: must be one of 'auto', 'on', 'off' (or list it in logging.trackers, e.g. [mlflow])",
    ),
    (
        "resume-missing",
        ["train", "--resume", "{tmp}/no-such-run"],
        "--resume '{tmp}/no-such-run': no such directory",
    ),
    (
        "resume-not-a-run",
        ["train", "--resume", "{tmp}/empty"],
        "--resume '{tmp}/empty': not a run directory (no config.yaml)",
    ),
    (
        "resume-no-checkpoint",
        ["train", "--resume", "{nock}"],
        "--resume '{nock}': no checkpoint to resume from (one is written every checkpoint.every rounds and at the end)",
    ),
    (
        "resume-other-model",
        ["train", "--resume", "{run}", *S("model.name=llama-tiny")],
        "--resume: model.name = 'llama-tiny' differs from the checkpoint's 'llama-micro': a resumed run keeps its model, data and method (only algorithm.rounds, algorithm.budget, algorithm.workers, inner.lr, inner.clip, outer.lr, data.cache_dir and the eval, checkpoint, elastic, faults, network, logging and runtime sections may change)",
    ),
    (
        "resume-format-2",
        ["train", "--resume", "{tmp}/old-format"],
        "checkpoint '{tmp}/old-format/checkpoints/round-000002': written in checkpoint format 2 by an older adloco; this adloco reads format 3 (torch.distributed.checkpoint): finish that run with the adloco that started it, or start it again",
    ),
    (
        "resume-with-config",
        ["train", "--resume", "{run}", "--config", "{tmp}/bad.yaml"],
        "--config: not with --resume (a run resumes with its own config.yaml; change fields with --set)",
    ),
    (
        "resume-fewer-rounds",
        ["train", "--resume", "{run}", *S("algorithm.rounds=1")],
        "config: algorithm.rounds = 1: the checkpoint is at round 2 already",
    ),
    (
        "launch-k8s-without-image",
        ["launch", "k8s", *LAUNCH],
        "--image: `adloco launch k8s` needs the container image to run (adloco installed in it)",
    ),
    (
        "launch-option-of-another-scheduler",
        ["launch", "slurm", *LAUNCH, "--image", "reg/adloco:1"],
        "--image: only for `adloco launch k8s` (this is slurm)",
    ),
    (
        "launch-k8s-port",
        ["launch", "k8s", *LAUNCH, "--image", "reg/adloco:1", "--port", "1234"],
        "--port 1234: Kubeflow Trainer's torch runtime sets the rendezvous port (29500); leave it out",
    ),
    (
        "launch-skypilot-gpus-without-a-name",
        ["launch", "skypilot", *LAUNCH, "--gpus-per-node", "8"],
        "--gpus-per-node: SkyPilot asks for GPUs by name: give --accelerators NAME:COUNT (e.g. H100:8)",
    ),
    (
        "launch-no-nodes",
        ["launch", "slurm", *LAUNCH[:2], "--nodes", "0", *LAUNCH[4:]],
        "--nodes 0: must be >= 1",
    ),
    (
        "launch-min-nodes-above-nodes",
        ["launch", "slurm", *LAUNCH, "--min-nodes", "3"],
        "--min-nodes 3: must be between 1 and --nodes (2)",
    ),
    (
        "launch-no-restarts",
        ["launch", "slurm", *LAUNCH, "--max-restarts", "0"],
        "--max-restarts 0: must be >= 1: a restarted or requeued job continues its run only under the elastic agent",
    ),
    (
        "launch-port",
        ["launch", "slurm", *LAUNCH, "--port", "70000"],
        "--port 70000: must be a TCP port, 1 to 65535",
    ),
    (
        "launch-k8s-name",
        ["launch", "k8s", *LAUNCH, "--image", "reg/adloco:1", "--name", "My_Job"],
        "--name 'My_Job': a TrainJob's name is at most 63 lowercase letters, digits and '-', starting with a letter and ending with a letter or digit",
    ),
    (
        "launch-slurm-time",
        ["launch", "slurm", *LAUNCH, "--time", "1h"],
        "--time '1h': a Slurm time limit, e.g. 24:00:00, 90 or 2-00:00:00",
    ),
    (
        "launch-k8s-memory",
        ["launch", "k8s", *LAUNCH, "--image", "reg/adloco:1", "--memory", "64GB"],
        "--memory '64GB': a Kubernetes quantity, e.g. 64Gi or 500M",
    ),
    (
        "launch-skypilot-accelerators",
        ["launch", "skypilot", *LAUNCH, "--accelerators", "H100 8"],
        "--accelerators 'H100 8': NAME or NAME:COUNT, e.g. H100:8",
    ),
    (
        "launch-partition-with-a-space",
        ["launch", "slurm", *LAUNCH, "--partition", "a b"],
        "--partition 'a b': must be non-empty, without spaces, quotes, '$', '`' or '\\'",
    ),
    (
        "launch-config-missing",
        ["launch", "slurm", "--config", "{tmp}/nope.yaml", *LAUNCH[2:]],
        "--config '{tmp}/nope.yaml': no such file",
    ),
    (
        "launch-config-field",
        ["launch", "slurm", *LAUNCH, *S("batch.eta=-1")],
        "config: batch.eta = -1.0: must be > 0",
    ),
    (
        "launch-in-one-process",
        ["launch", "slurm", *LAUNCH, *S("runtime.backend=inprocess")],
        "config: runtime.backend = 'inprocess': a cluster job runs one process per worker; set torchdist or auto",
    ),
    (
        "launch-shards-across-machines",
        ["launch", "slurm", *LAUNCH[:4], "--nproc-per-node", "3", *S("runtime.shards=2")],
        "config: runtime.shards = 2: must divide --nproc-per-node (3): a worker's processes talk every step and share one machine",
    ),
    (
        "launch-out-exists",
        ["launch", "slurm", *LAUNCH, "--out", "{tmp}/afile"],
        "--out '{tmp}/afile': already exists; pass --force to replace it",
    ),
    (
        "launch-out-no-folder",
        ["launch", "slurm", *LAUNCH, "--out", "{tmp}/nodir/job.sbatch"],
        "--out '{tmp}/nodir/job.sbatch': no such folder '{tmp}/nodir'",
    ),
    (
        "launch-unknown-scheduler",
        ["launch", "pbs", *LAUNCH],
        "argument SCHEDULER: invalid choice: 'pbs' (choose from 'slurm', 'k8s', 'skypilot') (see adloco launch --help)",
    ),
]


def _fill(text: str, world: dict[str, Path]) -> str:
    for key in ("run", "nock", "ckpt", "corpus", "tmp"):
        text = text.replace("{" + key + "}", str(world[key]))
    return text


def _tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` with a digest of its contents (a difference names the files), but W&B's
    own logs (``wandb/.../logs/``): its service process, started by the run and living as long as this
    test process, appends to them on its own clock."""
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(p for p in path.rglob("*") if p.is_file())
        if not (f.relative_to(path).parts[0] == "wandb" and "logs" in f.relative_to(path).parts)
    }


def test_the_table_is_long_enough() -> None:
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case,args,line", CASES, ids=[c[0] for c in CASES])
def test_bad_input(
    case: str, args: list[str], line: str, world: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _tree(world["run"])
    code = main([_fill(a, world) for a in args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == "adloco: error: " + _fill(line, world)  # one line, exactly
    assert not (world["tmp"] / "runs").exists()  # no run directory left behind
    assert _tree(world["run"]) == before  # a refused --resume leaves the run as it was
    assert not (world["tmp"] / "RAN").exists()  # no code from a checkpoint ran


def test_an_out_dir_that_cannot_hold_runs_is_refused_before_any_tokenizing(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from adloco.engine import train

    def never(*args: object, **kw: object) -> None:
        raise AssertionError("the data was read before logging.out_dir was checked")

    monkeypatch.setattr(train, "prepare", never)
    for out in ("afile", "afile/runs"):
        args = S(f"logging.out_dir={world['tmp'] / out}", f"data.source={world['corpus']}", *TINY_QUIET)
        assert main(["train", *args]) == 2
        assert "logging.out_dir" in capsys.readouterr().err
