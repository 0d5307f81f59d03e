"""Test setup: no network, a private Hugging Face home and adloco cache, one thread per process."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_TMP = Path(tempfile.mkdtemp(prefix="adloco-tests-"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HOME"] = str(_TMP / "hf")
os.environ["ADLOCO_CACHE"] = str(_TMP / "cache")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


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
