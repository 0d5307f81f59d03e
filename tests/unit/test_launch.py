"""``adloco launch slurm|k8s|skypilot``: each rendered file is checked as its scheduler would read it.

The script is syntax-checked by bash and then run by bash with the scheduler's commands and variables
stubbed (``scontrol``, ``srun``, ``torchrun``; ``$SKYPILOT_NODE_IPS``, ``$PET_MASTER_ADDR``, ...): the
torchrun command each node would run, as bash expands it, is compared with the one the README documents
for several machines (both parsed), and its rendezvous settings with docs/guides/fault-tolerance.md's.
The YAML files are parsed and held to a schema of the keys adloco writes (Kubeflow Trainer's TrainJob,
trainer.kubeflow.org/v1alpha1; a SkyPilot task)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from adloco.cli import main
from adloco.config import resolve

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "algorithm:\n  method: diloco\n  workers: 4\nmodel:\n  name: llama-tiny\n"


def _command_after(text: str, marker: str) -> list[str]:
    """The first shell command (continued lines joined) of the first code block after ``marker``."""
    block = text[text.index(marker) :].split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    joined, out = "", []
    for ln in lines:
        joined += ln[:-1] + " " if ln.endswith("\\") else ln
        if not ln.endswith("\\"):
            out.append(joined)
            joined = ""
    return shlex.split(next(c for c in out if "torchrun" in c))


def _torchrun(words: list[str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(environment assignments before it, torchrun's options, what it runs: -m MODULE ARGS...)"""
    at = words.index("torchrun")
    env = dict(w.split("=", 1) for w in words[:at])
    opts: dict[str, str] = {}
    rest = words[at + 1 :]
    while rest and rest[0] != "-m":
        opts[rest[0]] = rest[1]
        rest = rest[2:]
    return env, opts, rest


README = _torchrun(_command_after((ROOT / "README.md").read_text(), "**Two machines.**"))
FAULTS = _torchrun(
    _command_after((ROOT / "docs/guides/fault-tolerance.md").read_text(), "# Runs that survive")
)


def _stubs(tmp: Path) -> dict[str, str]:
    """A PATH whose srun runs its command, scontrol lists two hosts, and torchrun records its arguments
    and the rendezvous store setting into $ARGV (one argument a line)."""
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "torchrun").write_text(
        '#!/bin/sh\nprintf "%s\\n" "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=$TORCH_DISABLE_SHARE_RDZV_TCP_STORE" '
        'torchrun "$@" > "$ARGV"\n'
    )
    (bin_ / "srun").write_text(
        '#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do echo "$1" >> "$ARGV.srun"; shift; done\nexec "$@"\n'
    )
    (bin_ / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "gpu-a\\ngpu-b\\n"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}", "ARGV": str(tmp / "argv"), "HOME": str(tmp)}


def _ran(tmp: Path, argv: list[str], env: dict[str, str]) -> list[str]:
    p = subprocess.run(argv, env={**_stubs(tmp), **env}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return (tmp / "argv").read_text().splitlines()


def _same_as_readme(words: list[str], config: str, port: str = "29500") -> dict[str, str]:
    """The command a node runs, against the README's: the same torchrun options (and the rendezvous
    settings of the fault-tolerance guide), the same kind of values, the same program."""
    env, opts, program = _torchrun(words)
    r_env, r_opts, r_program = README
    assert env == r_env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert set(opts) == set(r_opts) | {"--rdzv-conf"}
    assert opts["--rdzv-conf"] == FAULTS[1]["--rdzv-conf"]
    assert opts["--rdzv-backend"] == r_opts["--rdzv-backend"] == "c10d"
    assert re.fullmatch(r"\d+:\d+", opts["--nnodes"]) and re.fullmatch(r"\d+:\d+", r_opts["--nnodes"])
    assert int(opts["--max-restarts"]) >= 1 and int(opts["--nproc-per-node"]) >= 1
    host, _, p = opts["--rdzv-endpoint"].rpartition(":")
    assert host and p == port and r_opts["--rdzv-endpoint"].rpartition(":")[2] == "29500"
    assert opts["--rdzv-id"]
    assert r_program[:4] == ["-m", "adloco", "train", "--config"] == program[:4]
    assert program[4] == config
    return opts


def _launch(tmp: Path, *args: str) -> tuple[Path, str]:
    cfg = tmp / "run.yaml"
    cfg.write_text(CONFIG)
    out = tmp / "rendered"
    assert main(["launch", *args, "--config", str(cfg), "--out", str(out)]) == 0
    return out, out.read_text()


def test_slurm_script_runs_torchrun_on_every_node_with_the_readme_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the folder `adloco launch` runs in, and the job is submitted from
    path, text = _launch(
        tmp_path, "slurm", "--nodes", "2", "--nproc-per-node", "2", "--time", "24:00:00",
        "--set", "algorithm.rounds=20",
    )  # fmt: skip
    assert capsys.readouterr().out == f"wrote {path}\nsubmit with: sbatch {path}\n"  # 4 workers: no note
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert str(tmp_path) not in text  # no path of the machine that wrote it
    flags = [ln.split()[1] for ln in text.splitlines() if ln.startswith("#SBATCH")]
    directives = dict(f.split("=", 1) for f in flags if "=" in f)
    assert directives["--nodes"] == "2" and directives["--ntasks-per-node"] == "1"
    assert directives["--cpus-per-task"] == "2"  # a core per process unless asked for more
    assert "--requeue" in flags and directives["--time"] == "24:00:00"
    for env, run_id in (({}, "4242"), ({"ADLOCO_RUN_ID": "77"}, "77")):  # requeued / continued by hand
        words = _ran(
            tmp_path,
            ["bash", str(path)],
            {"SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_ID": "4242", "SLURM_CPUS_PER_TASK": "2", **env},
        )
        assert "--cpus-per-task=2" in (tmp_path / "argv.srun").read_text().split()  # srun passes them on
        opts = _same_as_readme(words, "run.yaml")
        assert opts["--rdzv-endpoint"] == "gpu-a:29500" and opts["--rdzv-id"] == run_id
        assert opts["--nnodes"] == "2:2"
        assert words[-2:] == ["--set", "algorithm.rounds=20"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = subprocess.run(
        ["bash", str(path)], cwd=elsewhere, env=_stubs(tmp_path), capture_output=True, text=True
    )
    assert p.returncode == 2
    assert (
        p.stderr == f"adloco: run.yaml is not in {elsewhere}: submit from the folder adloco launch ran in\n"
    )
    _, asked = _launch(
        tmp_path, "slurm", "--nodes", "1", "--nproc-per-node", "4", "--cpus-per-node", "32", "--force"
    )
    assert "#SBATCH --cpus-per-task=32\n" in asked


K8S = {
    "apiVersion": str,
    "kind": str,
    "metadata": {"name": str, "namespace?": str},
    "spec": {
        "runtimeRef": {"name": str},
        "trainer": {
            "image": str,
            "command": [str],
            "env": [{"name": str, "value": str}],
            "numNodes": int,
            "numProcPerNode": int,
            "resourcesPerNode?": {
                "limits?": {"nvidia.com/gpu?": int},
                "requests?": {"cpu?": int, "memory?": str},
            },
        },
    },
}
SKYPILOT = {
    "name": str,
    "num_nodes": int,
    "resources?": {"accelerators?": str, "cpus?": str},
    "envs": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": str},
    "file_mounts": {str: str},
    "run": str,
}


def _schema(tree: Any, schema: Any, at: str = "") -> None:
    """``tree`` has the schema's keys and types, and no key it does not name ("k?": optional; a type as
    the only key: any key of that type)."""
    if isinstance(schema, dict):
        assert isinstance(tree, dict), at
        if len(schema) == 1 and isinstance(next(iter(schema)), type):
            ((kt, vt),) = schema.items()
            for k, v in tree.items():
                assert isinstance(k, kt), f"{at}.{k}"
                _schema(v, vt, f"{at}.{k}")
            return
        named = {k.rstrip("?"): (v, k.endswith("?")) for k, v in schema.items()}
        assert set(tree) <= set(named), (at, set(tree) - set(named))
        for k, (sub, optional) in named.items():
            if k in tree:
                _schema(tree[k], sub, f"{at}.{k}")
            else:
                assert optional, f"{at}.{k} missing"
    elif isinstance(schema, list):
        assert isinstance(tree, list) and tree, at
        for i, item in enumerate(tree):
            _schema(item, schema[0], f"{at}[{i}]")
    else:
        assert isinstance(tree, schema) and not isinstance(tree, bool), (at, tree)


def test_k8s_trainjob_is_a_kubeflow_trainer_v2_manifest_running_the_readme_command(tmp_path: Path) -> None:
    path, text = _launch(
        tmp_path, "k8s", "--nodes", "3", "--min-nodes", "2", "--nproc-per-node", "4", "--image", "reg/adloco:1",
        "--gpus-per-node", "4", "--memory", "64Gi", "--runs-dir", "/mnt/runs", "--set", "algorithm.rounds=20",
    )  # fmt: skip
    job = yaml.safe_load(text)
    _schema(job, K8S)
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 4)
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 4}, "requests": {"memory": "64Gi"}}
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert not [n for n in env if n.startswith("PET_")]  # the torch runtime's own: refused if set
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"])
    assert trainer["command"][:2] == ["bash", "-c"]
    subprocess.run(["bash", "-n", "-c", trainer["command"][2]], check=True)
    runtime = {"PET_MASTER_ADDR": "run-node-0-0.run", "PET_MASTER_PORT": "29500", "TMPDIR": str(tmp_path)}
    words = _ran(tmp_path, ["bash", "-c", trainer["command"][2]], {**env, **runtime})
    opts = _same_as_readme(words, str(tmp_path / "adloco-run.yaml"))
    assert (
        opts["--rdzv-endpoint"] == "run-node-0-0.run:29500" and opts["--rdzv-id"] == job["metadata"]["name"]
    )
    assert opts["--nnodes"] == "2:3"
    # the config the pods run: the file's, with the command line's --set and --runs-dir in it
    assert resolve(str(tmp_path / "adloco-run.yaml"), []) == resolve(
        str(tmp_path / "run.yaml"), ["algorithm.rounds=20", "logging.out_dir=/mnt/runs"]
    )


def test_skypilot_task_runs_the_readme_command_from_its_node_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, text = _launch(
        tmp_path, "skypilot", "--nodes", "2", "--nproc-per-node", "8", "--accelerators", "H100:8",
        "--setup", "export SETUP_RAN=1",
    )  # fmt: skip
    assert capsys.readouterr().out.startswith(  # the config's 4 workers: the job has 16
        "note: algorithm.workers = 4 in the config; the job starts 16 workers (2 nodes x 8 processes)"
    )
    task = yaml.safe_load(text)
    _schema(task, SKYPILOT)
    assert task["num_nodes"] == 2 and task["resources"] == {"accelerators": "H100:8"}
    assert task["envs"] == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    ((remote, local),) = task["file_mounts"].items()
    assert local == str(tmp_path / "run.yaml") and remote.startswith("~/")
    subprocess.run(["bash", "-n", "-c", task["run"]], check=True)
    sky = {
        "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8",
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_TASK_ID": "sky-managed-2026_run_1",
        **task["envs"],
    }
    words = _ran(tmp_path, ["bash", "-c", task["run"]], sky)
    opts = _same_as_readme(words, str(tmp_path / remote[2:]))  # the copy SkyPilot puts on each node
    assert opts["--rdzv-endpoint"] == "10.0.0.7:29500" and opts["--rdzv-id"] == "sky-managed-2026_run_1"
    assert opts["--nnodes"] == "2:2"


def test_nothing_is_written_over_a_file_unless_asked(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "job.sbatch"
    out.write_text("mine")
    args = [
        "launch",
        "slurm",
        "--config",
        str(cfg),
        "--nodes",
        "1",
        "--nproc-per-node",
        "4",
        "--out",
        str(out),
    ]
    assert main(args) == 2 and out.read_text() == "mine"
    assert main([*args, "--force"]) == 0 and out.read_text().startswith("#!/bin/bash")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch", "run.yaml"]  # no temporary left
