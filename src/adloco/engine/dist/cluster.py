"""``adloco launch slurm|k8s|skypilot``: the file a cluster scheduler runs for a config, written once.

Each scheduler gets the README's multi-machine command: one torchrun per node with c10d rendezvous on
the first node, an elastic range of nodes, ``--max-restarts`` and the rendezvous settings of
docs/guides/fault-tolerance.md, under ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``. What differs is how
each finds the first node and names the run:

- **Slurm** (an sbatch script): ``srun`` starts one torchrun per node; the first host of
  ``$SLURM_JOB_NODELIST`` holds the rendezvous, and the job id is the rendezvous id. ``--requeue``: a
  pre-empted job is requeued with the same id, so it continues the same run from its newest checkpoint
  (an elastic run's directory is named by its rendezvous id); ``ADLOCO_RUN_ID=<id>`` at submission
  continues an earlier job's run (after its time limit).
- **Kubernetes** (a Kubeflow Trainer v2 ``TrainJob``, ``trainer.kubeflow.org/v1alpha1``): the
  ``torch-distributed`` runtime gives each node ``PET_MASTER_ADDR`` / ``PET_MASTER_PORT`` (the first
  node); the TrainJob's name is the rendezvous id. Trainer v2.2 removed ``ElasticPolicy``: a lost pod
  restarts the job (the runtime's failure policy), which continues from the run's own checkpoints. The
  resolved config travels in the manifest (an environment variable written to a file at start).
- **SkyPilot** (a task YAML): ``num_nodes``; the first line of ``$SKYPILOT_NODE_IPS`` holds the
  rendezvous, ``$SKYPILOT_TASK_ID`` (kept across a managed job's recoveries) is its id; the config file
  is copied to every node (``file_mounts``).

Checkpoints live in the run directory, on the disk of the process that writes it: a requeue or a
restart on other machines continues only when ``logging.out_dir`` is on a disk they share
(docs/guides/cluster.md).
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adloco.args import add_config_option, add_set_option
from adloco.errors import UserError

SCHEDULERS = ("slurm", "k8s", "skypilot")
RDZV_PORT = 29500  # the README's; Kubeflow Trainer's torch runtime uses it too
# docs/guides/fault-tolerance.md: a silent agent is gone after 2 s x 5, latecomers wait 5 s
RDZV_CONF = "last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=5"
STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # why: docs/guides/fault-tolerance.md
CONFIG_ENV = "ADLOCO_CONFIG"  # k8s: the resolved config, written to a file before torchrun
RUN_ID_ENV = "ADLOCO_RUN_ID"  # slurm: continue an earlier job's run
K8S_CONFIG_PATH = '"${TMPDIR:-/tmp}/adloco-run.yaml"'  # a shell word
SUBMIT = {"slurm": "sbatch {}", "k8s": "kubectl apply -f {}", "skypilot": "sky jobs launch {}"}
SUFFIX = {"slurm": ".sbatch", "k8s": ".trainjob.yaml", "skypilot": ".sky.yaml"}
ONLY = {  # options that mean something to one scheduler alone
    "partition": "slurm",
    "time": "slurm",
    "image": "k8s",
    "namespace": "k8s",
    "runtime": "k8s",
    "memory": "k8s",
    "accelerators": "skypilot",
}
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035: a TrainJob's name


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "launch",
        help="write the Slurm script, Kubernetes TrainJob or SkyPilot task that runs a config on a cluster",
        description="Write the file a cluster scheduler runs for a config: an sbatch script (slurm), a Kubeflow "
        "Trainer TrainJob manifest (k8s) or a SkyPilot task YAML (skypilot). Each runs one torchrun per node "
        "with c10d rendezvous on the first node and restarts under torch's elastic agent; a restarted or "
        "requeued job continues the run from its newest checkpoint (keep logging.out_dir on a disk the nodes "
        "share). Nothing is submitted. Guide: docs/guides/cluster.md.",
    )
    p.add_argument("scheduler", choices=SCHEDULERS, metavar="SCHEDULER", help="slurm, k8s or skypilot")
    add_config_option(p, "the run's YAML config", required=True)
    add_set_option(p, "override one field of the config (repeatable)")
    p.add_argument(
        "--nodes", type=int, required=True, metavar="N", help="machines (torchrun's --nnodes maximum)"
    )
    p.add_argument(
        "--min-nodes", type=int, metavar="M",
        help="fewest machines the run goes on with after losing some (default: --nodes, a fixed size)",
    )  # fmt: skip
    p.add_argument("--nproc-per-node", type=int, required=True, metavar="P", help="processes per machine")
    p.add_argument(
        "--max-restarts", type=int, default=10, metavar="R",
        help="restarts of a node's processes by its elastic agent (default 10, at least 1)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=int, default=RDZV_PORT, help=f"rendezvous port (default {RDZV_PORT}; not k8s)"
    )
    p.add_argument("--name", help="job name (default: the config file's name)")
    p.add_argument(
        "--runs-dir", metavar="DIR",
        help="logging.out_dir for the run: a folder every node reaches (a shared disk) so that a restart "
        "elsewhere continues from its checkpoints",
    )  # fmt: skip
    p.add_argument(
        "--setup", metavar="CMD", help="shell command run on each node first (e.g. activate a venv)"
    )
    p.add_argument("--gpus-per-node", type=int, metavar="G", help="GPUs per machine to ask for")
    p.add_argument(
        "--cpus-per-node", type=int, metavar="C",
        help="CPU cores per machine to ask for (slurm default: one per process, --nproc-per-node)",
    )  # fmt: skip
    p.add_argument("--partition", help="slurm: the partition")
    p.add_argument("--time", help="slurm: the time limit (e.g. 24:00:00)")
    p.add_argument("--image", help="k8s: the container image (adloco and your data in it)")
    p.add_argument("--namespace", help="k8s: the TrainJob's namespace")
    p.add_argument(
        "--runtime", default=None, help="k8s: the ClusterTrainingRuntime (default torch-distributed)"
    )
    p.add_argument("--memory", help="k8s: memory per machine (e.g. 64Gi)")
    p.add_argument("--accelerators", help="skypilot: accelerators per machine (e.g. H100:8)")
    p.add_argument(
        "--out",
        "-o",
        metavar="FILE",
        help="where to write it (default: NAME + .sbatch / .trainjob.yaml / .sky.yaml)",
    )
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


@dataclass(frozen=True)
class Job:
    """What every scheduler's file is rendered from (checked by :func:`job_from_args`)."""

    scheduler: str
    name: str
    config: Path  # absolute; a Slurm script names it relative to the folder it is submitted from
    overrides: tuple[str, ...]
    nodes: int
    min_nodes: int
    nproc: int
    max_restarts: int
    port: int
    setup: str | None
    gpus: int | None
    cpus: int | None
    options: dict[str, str]  # the scheduler's own (partition, image, ...)
    config_text: str  # the resolved config (k8s carries it)
    note: str | None = None  # said when the file is written


def _name(args: Any) -> str:
    if args.name is not None:
        name = args.name
        if args.scheduler == "k8s" and (len(name) > 63 or not _DNS_LABEL.match(name)):
            raise UserError(
                f"--name {name!r}: a TrainJob's name is at most 63 lowercase letters, digits and '-', starting "
                "with a letter and ending with a letter or digit"
            )
        if not name or any(c.isspace() or c in "'\"$`\\" for c in name):
            raise UserError(f"--name {name!r}: must be non-empty, without spaces, quotes, '$', '`' or '\\'")
        return name
    stem = re.sub(r"[^a-z0-9]+", "-", Path(args.config).stem.lower()).strip("-")
    name = stem if stem[:1].isalpha() else f"adloco-{stem}".strip("-")
    return name[:63].rstrip("-")


def job_from_args(args: Any) -> Job:
    """The job of a command line: every option checked (one line naming it and what is allowed), the
    config resolved with its overrides (a bad field is refused as ``adloco train`` refuses it)."""
    from adloco.config import dump_yaml, resolve
    from adloco.config.checks import check_layout

    s = args.scheduler
    for opt, owner in ONLY.items():
        if getattr(args, opt) is not None and owner != s:
            raise UserError(f"--{opt}: only for `adloco launch {owner}` (this is {s})")
    if s == "k8s" and args.port != RDZV_PORT:
        raise UserError(
            f"--port {args.port}: Kubeflow Trainer's torch runtime sets the rendezvous port ({RDZV_PORT}); leave it out"
        )
    if s == "skypilot" and args.gpus_per_node:
        raise UserError(
            "--gpus-per-node: SkyPilot asks for GPUs by name: give --accelerators NAME:COUNT (e.g. H100:8)"
        )
    if s == "k8s" and not args.image:
        raise UserError(
            "--image: `adloco launch k8s` needs the container image to run (adloco installed in it)"
        )
    for opt, low in (
        ("nodes", 1),
        ("nproc_per_node", 1),
        ("max_restarts", 1),
        ("gpus_per_node", 0),
        ("cpus_per_node", 1),
    ):
        value = getattr(args, opt)
        if value is not None and value < low:
            why = (
                ": a restarted or requeued job continues its run only under the elastic agent"
                if opt == "max_restarts"
                else ""
            )
            raise UserError(f"--{opt.replace('_', '-')} {value}: must be >= {low}{why}")
    min_nodes = args.nodes if args.min_nodes is None else args.min_nodes
    if not 1 <= min_nodes <= args.nodes:
        raise UserError(f"--min-nodes {min_nodes}: must be between 1 and --nodes ({args.nodes})")
    if not 1 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: must be a TCP port, 1 to 65535")
    if args.time is not None and not re.fullmatch(r"[0-9]+(-[0-9]+)?(:[0-9]+){0,2}", args.time):
        raise UserError(f"--time {args.time!r}: a Slurm time limit, e.g. 24:00:00, 90 or 2-00:00:00")
    if args.memory is not None and not re.fullmatch(r"[0-9]+(\.[0-9]+)?([KMGTPE]i?)?", args.memory):
        raise UserError(f"--memory {args.memory!r}: a Kubernetes quantity, e.g. 64Gi or 500M")
    if args.accelerators is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+(:[0-9]+)?", args.accelerators):
        raise UserError(f"--accelerators {args.accelerators!r}: NAME or NAME:COUNT, e.g. H100:8")
    for opt in ("partition", "namespace", "runtime", "image"):
        value = getattr(args, opt)
        if value is not None and (not value or any(c.isspace() or c in "'\"$`\\" for c in value)):
            raise UserError(f"--{opt} {value!r}: must be non-empty, without spaces, quotes, '$', '`' or '\\'")
    name = _name(args)
    config = Path(args.config).expanduser()
    if not config.is_file():
        raise UserError(f"--config {args.config!r}: no such file")
    overrides = list(args.overrides)
    if args.runs_dir is not None:
        overrides.append(f"logging.out_dir={args.runs_dir}")
    cfg = resolve(str(config), overrides)
    rt = cfg.runtime
    if rt.backend == "inprocess":
        raise UserError(
            "config: runtime.backend = 'inprocess': a cluster job runs one process per worker; set torchdist or auto"
        )
    if rt.shards > 1 and args.nproc_per_node % rt.shards:
        raise UserError(
            f"config: runtime.shards = {rt.shards}: must divide --nproc-per-node ({args.nproc_per_node}): a "
            "worker's processes talk every step and share one machine"
        )
    check_layout(
        cfg.algorithm.workers, args.nodes * args.nproc_per_node, rt.workers_per_process, rt.shards, True
    )
    options = {k: str(getattr(args, k)) for k in ONLY if getattr(args, k) is not None}
    workers = (
        args.nodes * args.nproc_per_node * (rt.workers_per_process if rt.shards == 1 else 1) // rt.shards
    )
    note = None
    if cfg.algorithm.workers != workers:  # an elastic run's workers follow its processes
        note = (
            f"note: algorithm.workers = {cfg.algorithm.workers} in the config; the job starts {workers} workers "
            f"({args.nodes} nodes x {args.nproc_per_node} processes): an elastic run's workers follow its processes"
        )
    return Job(
        s, name, config.resolve(), tuple(overrides), args.nodes, min_nodes, args.nproc_per_node,
        args.max_restarts, args.port, args.setup, args.gpus_per_node, args.cpus_per_node, options,
        dump_yaml(cfg), note,
    )  # fmt: skip


def torchrun(job: Job, endpoint: str, run_id: str, nnodes: str, config: str, overrides: bool) -> str:
    """The torchrun command line (shell words, ``\\``-continued) every node runs: ``endpoint``, ``run_id``,
    ``nnodes`` (MIN:MAX) and ``config`` are shell words already (they may expand variables)."""
    q = shlex.quote
    lines = [
        f"torchrun --nnodes {nnodes} --nproc-per-node {job.nproc} --max-restarts {job.max_restarts}",
        f"--rdzv-backend c10d --rdzv-endpoint {endpoint} --rdzv-id {run_id}",
        f"--rdzv-conf {RDZV_CONF}",
        f"-m adloco train --config {config}",
    ]
    if overrides and job.overrides:
        lines.append(" ".join(f"--set {q(o)}" for o in job.overrides))
    return " \\\n    ".join(lines)


def render_slurm(job: Job, script: str = "") -> str:
    """The sbatch script; ``script``: its path as the submitter names it (relative to the folder `adloco
    launch` ran in, from which it is submitted)."""
    q = shlex.quote
    config = os.path.relpath(job.config, Path.cwd())  # from the submission folder: no path of this host
    cpus = job.cpus if job.cpus is not None else job.nproc  # a core per process at least: never one for all
    head = [
        "#!/bin/bash",
        f"# {job.name}: `adloco train` on {job.nodes} nodes x {job.nproc} processes, written by `adloco launch slurm`.",
        f"# Submit from the folder `adloco launch` ran in (the job starts there; the config's path is relative to",
        f"# it): sbatch {script or job.name + SUFFIX['slurm']}. A pre-empted job is requeued with its job id, which",
        "# names the run (the rendezvous id): it continues from the run's newest checkpoint. To continue a run",
        f"# after its time limit, submit again with {RUN_ID_ENV}=<the first job's id>: sbatch --export=ALL,{RUN_ID_ENV}=...",
        "# The run directory (logging.out_dir) must be on a disk every node shares for that.",
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --nodes={job.min_nodes}-{job.nodes}"
        if job.min_nodes < job.nodes
        else f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={cpus}"
        + ("" if job.cpus is not None else "  # one core per process; --cpus-per-node asks for more"),
        f"#SBATCH --output={job.name}-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
    ]
    if job.min_nodes < job.nodes:
        head.append("#SBATCH --no-kill  # a lost node leaves the others running: the run goes on without it")
    if "partition" in job.options:
        head.append(f"#SBATCH --partition={job.options['partition']}")
    if "time" in job.options:
        head.append(f"#SBATCH --time={job.options['time']}")
    if job.gpus is not None:
        head.append(f"#SBATCH --gpus-per-node={job.gpus}")
    body = ["", "set -eo pipefail"]
    if job.setup:
        body.append(job.setup)
    missing = "adloco: %s is not in %s: submit from the folder adloco launch ran in\\n"
    body += [
        f'[ -f {q(config)} ] || {{ printf {q(missing)} {q(config)} "$PWD" >&2; exit 2; }}',
        f"export {STORE_ENV}=1",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)  # holds the rendezvous',
        f'RUN_ID="${{{RUN_ID_ENV}:-$SLURM_JOB_ID}}"',
        "# one torchrun per node, with the job's cores (srun does not pass --cpus-per-task on by itself); a",
        "# node that fails does not stop the others (its agent restarts it)",
        'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=0 '
        + torchrun(job, f'"$HEAD:{job.port}"', '"$RUN_ID"', f"{job.min_nodes}:{job.nodes}", q(config), True),
        "",
    ]
    return "\n".join(head + body)


def render_k8s(job: Job) -> dict[str, Any]:
    endpoint = '"$PET_MASTER_ADDR:$PET_MASTER_PORT"'
    script = [f'printf "%s\\n" "${CONFIG_ENV}" > {K8S_CONFIG_PATH}']
    if job.setup:
        script.insert(0, job.setup)
    script.append(
        "exec " + torchrun(job, endpoint, job.name, f"{job.min_nodes}:{job.nodes}", K8S_CONFIG_PATH, False)
    )
    trainer: dict[str, Any] = {
        "image": job.options["image"],
        "command": ["bash", "-c", "\n".join(script) + "\n"],
        "env": [{"name": STORE_ENV, "value": "1"}, {"name": CONFIG_ENV, "value": job.config_text}],
        "numNodes": job.nodes,
        "numProcPerNode": job.nproc,
    }
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if job.gpus:
        limits["nvidia.com/gpu"] = job.gpus
    if job.cpus is not None:
        requests["cpu"] = job.cpus
    if "memory" in job.options:
        requests["memory"] = job.options["memory"]
    if limits or requests:
        trainer["resourcesPerNode"] = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    metadata: dict[str, Any] = {"name": job.name}
    if "namespace" in job.options:
        metadata["namespace"] = job.options["namespace"]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": job.options.get("runtime", "torch-distributed")}, "trainer": trainer},
    }


def render_skypilot(job: Job) -> dict[str, Any]:
    remote = f"~/.adloco/{job.name}.yaml"
    run = []
    if job.setup:
        run.append(job.setup)
    run += [
        'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)  # holds the rendezvous',
        'echo "node $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES, rendezvous on $HEAD"',
        torchrun(
            job,
            f'"$HEAD:{job.port}"',
            '"$SKYPILOT_TASK_ID"',
            # the node count `sky launch --num-nodes` may change; a smaller minimum only if asked
            f'"{job.min_nodes if job.min_nodes < job.nodes else "$SKYPILOT_NUM_NODES"}:$SKYPILOT_NUM_NODES"',
            f'"$HOME/.adloco/{job.name}.yaml"',
            True,
        ),
    ]
    resources: dict[str, Any] = {}
    if "accelerators" in job.options:
        resources["accelerators"] = job.options["accelerators"]
    if job.cpus is not None:
        resources["cpus"] = f"{job.cpus}+"
    task: dict[str, Any] = {"name": job.name, "num_nodes": job.nodes}
    if resources:
        task["resources"] = resources
    task["envs"] = {STORE_ENV: "1"}
    task["file_mounts"] = {remote: str(job.config)}
    task["run"] = "\n".join(run) + "\n"
    return task


def to_yaml(tree: dict[str, Any]) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def literal(dumper: Any, data: str) -> Any:  # scripts as blocks (|), readable
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, literal)
    return yaml.dump(tree, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=1000)


def render(job: Job, path: str = "") -> str:
    """The text of the job's file (``path``: where it is written, as the submitter names it)."""
    if job.scheduler == "slurm":
        return render_slurm(job, path)
    header = f"# {job.name}: `adloco train` on {job.nodes} nodes x {job.nproc} processes, written by `adloco launch {job.scheduler}`.\n"
    if job.scheduler == "k8s":
        header += (
            "# Submit: kubectl apply -f THIS. Kubeflow Trainer v2 (TrainJob, trainer.kubeflow.org/v1alpha1) with its\n"
            "# torch-distributed runtime. A restarted job continues from the run's newest checkpoint when the run\n"
            "# directory (logging.out_dir) is on a volume every pod mounts.\n"
        )
        return header + to_yaml(render_k8s(job))
    header += (
        "# Launch: sky jobs launch THIS (a managed job: recovered after a pre-emption, continuing from the\n"
        "# run's newest checkpoint when logging.out_dir is on storage that outlives the nodes).\n"
    )
    return header + to_yaml(render_skypilot(job))


def command(args: Any) -> int:
    job = job_from_args(args)
    out = Path(args.out if args.out is not None else f"{job.name}{SUFFIX[job.scheduler]}").expanduser()
    if out.exists() and not args.force:
        raise UserError(f"--out {str(out)!r}: already exists; pass --force to replace it")
    if not out.parent.is_dir():
        raise UserError(f"--out {str(out)!r}: no such folder {str(out.parent)!r}")
    text = render(job, shlex.quote(os.path.relpath(out)))
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if job.scheduler == "slurm":
            os.chmod(tmp, 0o755)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"--out {str(out)!r}: cannot be written ({exc.strerror})") from None
    if job.note:
        print(job.note)
    print(f"wrote {out}\nsubmit with: {SUBMIT[job.scheduler].format(shlex.quote(str(out)))}")
    return 0
