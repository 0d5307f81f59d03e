"""The MLflow viewer as docs/guides/tracking.md runs it: a run logged with ``logging.trackers=mlflow`` (the
extra's mlflow-skinny), then the guide's ``mlflow ui`` line, word for word, serving that run. The viewer is
the full ``mlflow`` package, which the extra does not install: the test runs where an ``mlflow`` on PATH
can serve (its interpreter has Flask), and is skipped, saying so, elsewhere."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from adloco.cli import main
from tests.helpers import TINY_QUIET, S

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "tracking.md"


def serving_mlflow() -> str | None:
    """The ``mlflow`` on PATH if its interpreter has the server's Flask (the full package), else None."""
    exe = shutil.which("mlflow")
    if exe is None:
        return None
    first = Path(exe).read_bytes().split(b"\n", 1)[0].decode(errors="replace")
    python = first[2:].strip() if first.startswith("#!") else ""
    ok = (
        python
        and subprocess.run([python, "-c", "import flask, mlflow.server"], capture_output=True).returncode == 0
    )
    return exe if ok else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, body: dict[str, object] | None = None) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return dict(json.loads(r.read()))


@pytest.mark.skipif(
    serving_mlflow() is None,
    reason="mlflow ui needs the full mlflow package (pip install mlflow); the mlflow extra is mlflow-skinny",
)
def test_the_guides_mlflow_ui_line_serves_a_logged_run(tmp_path: Path, text_corpus: Path) -> None:
    sets = S(
        f"data.source={text_corpus}", f"logging.out_dir={tmp_path}", "logging.trackers=mlflow", *TINY_QUIET
    )
    assert main(["train", *sets]) == 0
    (run,) = list(tmp_path.iterdir())
    (line,) = [x for x in GUIDE.read_text().splitlines() if " mlflow ui " in f" {x} "]
    words = shlex.split(line.split("#")[0].replace("<run>", str(run)))
    # a shell as the user has it: not this process's, where the run's own sink allowed its file store
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_TRACKING_URI")}
    while "=" in words[0]:  # the line's own VAR=value words
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:2] == ["mlflow", "ui"]
    port = free_port()
    server = subprocess.Popen(
        [str(serving_mlflow()), *words[1:], "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline, found = time.monotonic() + 120, None
        while time.monotonic() < deadline and found is None and server.poll() is None:
            try:
                exps = get(f"{base}/experiments/search?max_results=10")["experiments"]
                found = next(e for e in exps if e["name"] == "adloco")  # type: ignore[union-attr,index]
            except (OSError, StopIteration, KeyError):
                time.sleep(1)
        assert found is not None, server.stderr.read() if server.poll() is not None else "no answer in 120 s"
        runs = get(f"{base}/runs/search", {"experiment_ids": [found["experiment_id"]]})["runs"]
        assert [r["info"]["run_name"] for r in runs] == [run.name]  # type: ignore[index,union-attr]
    finally:
        server.terminate()
        server.wait(30)
