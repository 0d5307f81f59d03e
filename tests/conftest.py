"""Test setup: no network, a private Hugging Face home and adloco cache, one thread per process.

Tiers, by folder (the marker is set here, so ``-m`` selects a tier whatever path is given):
``unit/`` the default: pure math, fakes, threads, the engine and the CLI in this process;
``integration/`` real torch.distributed processes on gloo, faults and elastic agents (marker
``integration``); ``e2e/`` the command line, the examples and the demo as a user runs them, in processes
of their own (marker ``e2e``). Every test has a time limit (pyproject.toml: ``timeout``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_TMP = Path(tempfile.mkdtemp(prefix="adloco-tests-"))
# The adloco cache (tokenized corpora) is one for the session: pytest-xdist's workers, children of the
# process that made it, share it, so the default corpus is tokenized once (its builds take a lock), not
# once a worker. A pytest started inside a test (its parent is not that process) makes its own.
if os.environ.get("ADLOCO_TESTS_CACHE_OWNER") == str(os.getppid()):
    _CACHE, _OWN_CACHE = Path(os.environ["ADLOCO_TESTS_CACHE"]), False
else:
    _CACHE, _OWN_CACHE = Path(tempfile.mkdtemp(prefix="adloco-tests-cache-")), True
    os.environ["ADLOCO_TESTS_CACHE"], os.environ["ADLOCO_TESTS_CACHE_OWNER"] = str(_CACHE), str(os.getpid())
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HOME"] = str(_TMP / "hf")
os.environ["ADLOCO_CACHE"] = str(_CACHE)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# the trackers never send anything: W&B offline, MLflow in the run directory's own file store
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
for _name in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_BASE_URL", "DATABRICKS_HOST"):
    os.environ.pop(_name, None)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The private Hugging Face home (each xdist worker has its own) and the cache go with the session."""
    import shutil

    shutil.rmtree(_TMP, ignore_errors=True)
    if _OWN_CACHE:
        shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small folder of Python source files (a slice of the standard library), copied once."""
    import sysconfig

    src = Path(sysconfig.get_paths()["stdlib"])
    dst = tmp_path_factory.mktemp("corpus")
    names = [
        "abc.py",
        "bisect.py",
        "colorsys.py",
        "fnmatch.py",
        "genericpath.py",
        "heapq.py",
        "keyword.py",
        "linecache.py",
        "numbers.py",
        "opcode.py",
        "queue.py",
        "sched.py",
        "shlex.py",
        "stat.py",
        "string.py",
        "textwrap.py",
        "this.py",
        "token.py",
        "types.py",
        "uu.py",
        "weakref.py",
        "copy.py",
        "glob.py",
        "random.py",
    ]
    for n in names:
        if (src / n).is_file():
            (dst / n).write_text((src / n).read_text(encoding="utf-8"), encoding="utf-8")
    return dst


# The longest tests start first, so that tests run side by side (pytest -n 2) end together; .ci/run hands
# them out one at a time (--maxschedchunk 1), so each worker takes the longest test left when it is free.
LONGEST = (
    "test_default_run.py",
    "test_faults.py",
    "test_clean_exit.py",
    "test_bench_runs.py",
    "test_gpu_dryrun.py",
    "test_shards.py",
    "test_elastic.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in ("integration", "e2e"):
            item.add_marker(getattr(pytest.mark, tier))
    first = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: first.get(Path(str(item.fspath)).name, len(first)))
