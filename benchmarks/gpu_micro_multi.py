"""Section 7's micro-benchmarks for ``benchmarks/gpu_micro.py``: several small workers on one GPU, run one
after another, as CUDA graphs, in k processes (``mpworker`` is one of them), vmap'd over stacked replicas,
on streams and on threads (``multi``, with the checks that the stacked and graphed steps match the plain
ones). Standalone PyTorch, never adloco.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from gpu_micro_models import MiniLlama, Save, _adamw, _device, _err, _free, _sync, hf_llama, n_params
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {
    # name: (shape, seq, batch); the engine presets' shapes with a 4096-token vocabulary
    "llama-tiny (1.4M), 8 x 128 tokens": (dict(vocab=4096, hidden=128, layers=4, heads=4, inter=384), 128, 8),
    "llama-10m (11M), 8 x 256 tokens": (dict(vocab=4096, hidden=320, layers=8, heads=5, inter=864), 256, 8),
}
DRY_SHAPES = {"micro, 2 x 16 tokens": (dict(vocab=128, hidden=32, layers=1, heads=2, inter=64), 16, 2)}


class Replica:
    """One worker: its own model, AdamW and batch (reused every step, so no copy is timed)."""

    def __init__(
        self, shape: dict[str, Any], seq: int, batch: int, seed: int, dev: torch.device, hf: bool
    ) -> None:
        torch.manual_seed(seed)
        self.hf = hf
        self.model = (hf_llama(shape, seq) if hf else MiniLlama(shape, seq, dev)).to(dev)
        self.params = list(self.model.parameters())
        self.opt = _adamw(self.params, foreach=True)
        g = torch.Generator(device=dev).manual_seed(seed + 1)
        self.ids = torch.randint(0, shape["vocab"], (batch, seq), device=dev, generator=g)
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def loss(self) -> torch.Tensor:
        return self.model(input_ids=self.ids, labels=self.ids).loss if self.hf else self.model(self.ids)

    def step(self) -> torch.Tensor:
        loss = self.loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def _timed(fn: Callable[[], Any], dev: torch.device, repeats: int = 1) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs, the device synchronized around each."""
    times = []
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_sequential(ws: list[Replica], n: int) -> None:
    for _ in range(n):
        for w in ws:
            w.step()


def run_streams(ws: list[Replica], n: int) -> None:
    cur = torch.cuda.current_stream()
    for w in ws:
        assert w.stream is not None
        w.stream.wait_stream(cur)
    for _ in range(n):
        for w in ws:
            with torch.cuda.stream(w.stream):
                w.step()
    for w in ws:
        cur.wait_stream(w.stream)


def run_threads(ws: list[Replica], n: int) -> None:
    barrier = threading.Barrier(len(ws))
    errors: list[BaseException] = []

    def body(w: Replica) -> None:
        try:
            ctx = torch.cuda.stream(w.stream) if w.stream is not None else _null()
            with ctx:
                barrier.wait()
                for _ in range(n):
                    w.step()
            if w.stream is not None:
                w.stream.synchronize()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    if ws[0].stream is not None:
        for w in ws:
            w.stream.wait_stream(torch.cuda.current_stream())
    threads = [threading.Thread(target=body, args=(w,)) for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


class Stacked:
    """k replicas as one model: ``torch.func.stack_module_state`` + ``functional_call`` under ``vmap``;
    AdamW on the stacked (k, ...) tensors (element-wise, so the same as k separate AdamWs) and a
    per-replica gradient-norm clip."""

    def __init__(self, ws: list[Replica]) -> None:
        from torch.func import functional_call, stack_module_state, vmap

        self.k = len(ws)
        params, buffers = stack_module_state([w.model for w in ws])
        self.params = params
        self.buffers = buffers
        base = copy.deepcopy(ws[0].model)
        self.ids = torch.stack([w.ids for w in ws])
        self.opt = _adamw(list(params.values()), ndim_offset=1, foreach=True)

        def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
            return functional_call(base, (p, b), (ids,))

        self.loss_fn = vmap(one)

    def step(self) -> torch.Tensor:
        # The math attention backend: under vmap on CUDA, the memory-efficient kernel fails with
        # "RuntimeError: LSE is not correctly aligned (strideH)" (seen on an H100, torch 2.11).
        with sdpa_kernel(SDPBackend.MATH):
            losses = self.loss_fn(self.params, self.buffers, self.ids)  # (k,)
            losses.sum().backward()
        grads = [p.grad for p in self.params.values()]
        sq = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0)  # (k,)
        coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
        torch._foreach_mul_(grads, [coef.view(-1, *([1] * (g.ndim - 1))) for g in grads])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return losses.detach()


class Graphed:
    """One worker's whole step (forward, backward, clip, AdamW) captured as a CUDA graph."""

    def __init__(self, w: Replica, warmup: int = 3) -> None:
        self.w = w
        w.opt = _adamw(w.params, foreach=True, capturable=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmup):
                w.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        w.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            loss = w.loss()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(w.params, 1.0, foreach=True)
            w.opt.step()
        self.loss = loss

    def replay(self) -> None:
        self.graph.replay()


def _check_stacked(shape: dict[str, Any], seq: int, batch: int, dev: torch.device) -> dict[str, Any]:
    """vmap'd replicas against separate ones: the same losses and the same parameters after two steps."""
    ws = [Replica(shape, seq, batch, 100 + i, dev, hf=False) for i in range(2)]
    ref = [Replica(shape, seq, batch, 100 + i, dev, hf=False) for i in range(2)]  # the same seeds
    st = Stacked(ws)
    l_st = [st.step() for _ in range(2)]
    l_ref = [[r.step() for r in ref] for _ in range(2)]
    loss_err = max(
        abs(float(l_st[s][i]) - float(l_ref[s][i])) / abs(float(l_ref[s][i]))
        for s in range(2)
        for i in range(2)
    )
    num = den = 0.0
    for name, p in st.params.items():
        for i, r in enumerate(ref):
            q = dict(r.model.named_parameters())[name]
            num += float((p[i].detach() - q.detach()).pow(2).sum())
            den += float(q.detach().pow(2).sum())
    return {"loss_rel_err": loss_err, "param_rel_err": math.sqrt(num / den)}


def _check_graph(shape: dict[str, Any], seq: int, batch: int, dev: torch.device) -> dict[str, Any]:
    """A captured step replayed against the same steps run eagerly from the same start."""
    w = Replica(shape, seq, batch, 7, dev, hf=False)
    ref = Replica(shape, seq, batch, 7, dev, hf=False)  # the same seed: the same start
    g = Graphed(w, warmup=3)  # 3 eager steps, then capture (captures do not run)
    g.replay()
    for _ in range(4):
        ref.step()
    num = den = 0.0
    for p, q in zip(w.params, ref.params, strict=True):
        num += float((p.detach() - q.detach()).pow(2).sum())
        den += float(q.detach().pow(2).sum())
    return {"param_rel_err": math.sqrt(num / den)}


def _mp_run(
    shape: dict[str, Any], seq: int, batch: int, k: int, n: int, dev: torch.device, timeout: float
) -> dict[str, Any]:
    """k processes, each one worker of its own, started together; aggregate tokens over the common span."""
    tmp = Path(tempfile.mkdtemp(prefix="adloco-mp-"))
    go = tmp / "go"
    procs = []
    for i in range(k):
        spec = dict(
            shape=shape,
            seq=seq,
            batch=batch,
            n=n,
            seed=i,
            ready=str(tmp / f"ready-{i}"),
            go=str(go),
            out=str(tmp / f"out-{i}.json"),
        )
        with (tmp / f"log-{i}").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).with_name("gpu_micro.py")),
                        "mpworker",
                        json.dumps(spec),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        t_end = time.time() + timeout
        while not all((tmp / f"ready-{i}").exists() for i in range(k)):
            if any(p.poll() not in (None, 0) for p in procs) or time.time() > t_end:
                logs = [(tmp / f"log-{i}").read_text(errors="replace") for i in range(k)]
                raise RuntimeError(
                    "a worker process failed before it was ready: "
                    + " | ".join(o.strip()[-400:] for o in logs if o.strip())
                )
            time.sleep(0.01)
        t_go = time.time() + 0.2
        go.write_text(repr(t_go))
        for p in procs:
            p.wait(timeout=max(1.0, t_end - time.time()))
        res = [json.loads((tmp / f"out-{i}.json").read_text()) for i in range(k)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    span = max(r["t_end"] for r in res) - t_go
    return {
        "tokens_per_s": k * n * batch * seq / span,
        "per_process_s": [round(r["t_end"] - r["t_start"], 3) for r in res],
    }


def mpworker(spec: dict[str, Any]) -> None:
    dev = _device()
    torch.set_num_threads(1)
    w = Replica(spec["shape"], spec["seq"], spec["batch"], spec["seed"], dev, hf=False)
    for _ in range(3):
        w.step()
    _sync(dev)
    Path(spec["ready"]).write_text("1")
    go = Path(spec["go"])
    while not go.exists():
        time.sleep(0.0005)
    t_go = float(go.read_text() or "0")
    while time.time() < t_go:
        pass
    t0 = time.time()
    for _ in range(spec["n"]):
        w.step()
    _sync(dev)
    Path(spec["out"]).write_text(json.dumps({"t_start": t0, "t_end": time.time()}))


REPEATS = 3  # timed windows per measurement; the median is reported
# In the order they are measured: when time runs short, the last ones are left out.
APPROACHES = [
    ("a", "sequential, one thread (the engine today)"),
    ("f", "CUDA graph per worker step, replayed in turn"),
    ("f2", "CUDA graph per worker, one stream each"),
    ("e", "k processes (time-sliced, no MPS)"),
    ("d", "vmap over stacked replicas (torch.func; math attention)"),
    ("b", "one CUDA stream per worker, one thread"),
    ("c", "one Python thread + stream per worker"),
    ("hf-a", "Hugging Face Llama (the engine's model): sequential"),
]


def multi(dry: bool, save: Save, deadline: float) -> dict[str, Any]:
    dev = _device()
    cuda = dev.type == "cuda"
    ks = [1, 2] if dry else [1, 2, 4]
    target = 0.05 if dry else 0.2  # seconds for one worker's timed steps (each of 3 repeats)
    shapes = DRY_SHAPES if dry else SHAPES
    try:
        import transformers  # noqa: F401

        have_hf = True
    except Exception:  # noqa: BLE001
        have_hf = False
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "precision": "fp32 (TF32 off), as the engine's default",
        "ks": ks,
        "approaches": dict(APPROACHES),
        "shapes": {},
        "checks": {},
    }
    first = next(iter(shapes.values()))
    for name, fn in (("stacked_vs_separate", _check_stacked), ("graph_vs_eager", _check_graph)):
        if name == "graph_vs_eager" and not cuda:
            out["checks"][name] = {"skipped": "CUDA only"}
            continue
        try:
            out["checks"][name] = fn(first[0], first[1], first[2], dev)
        except Exception as exc:  # noqa: BLE001
            out["checks"][name] = {"error": _err(exc)}
        _free(dev)
    save(out)

    names = list(shapes)
    for i, sname in enumerate(names):
        shape, seq, batch = shapes[sname]
        share = time.time() + (deadline - time.time()) / (len(names) - i)  # this shape's fair share
        rec: dict[str, Any] = {"seq": seq, "batch": batch, "results": {}}
        out["shapes"][sname] = rec
        t1, rec["params"] = _calibrate(shape, seq, batch, dev)
        n = int(min(300, max(5, target / t1)))
        rec["steps_timed"] = n
        _free(dev)
        for key, _desc in APPROACHES:
            row: dict[str, Any] = {}
            rec["results"][key] = row
            for k in ks:
                if time.time() > share:
                    row[str(k)] = {"skipped": "section time limit"}
                    continue
                if key in ("b", "f", "f2") and not cuda:
                    row[str(k)] = {"skipped": "CUDA only"}
                    continue
                if key.startswith("hf") and not have_hf:
                    row[str(k)] = {"skipped": "transformers missing"}
                    continue
                if dry and (key == "e" or (key.startswith("hf") and k > 1)):
                    row[str(k)] = {"skipped": "dry run"}
                    continue
                t0 = time.time()
                try:
                    row[str(k)] = _measure(key, shape, seq, batch, k, n, dev, share)
                    row[str(k)]["tokens_per_s"] = round(row[str(k)]["tokens_per_s"])
                except Exception as exc:  # noqa: BLE001 - one approach failing must not stop the rest
                    row[str(k)] = {"error": _err(exc)}
                row[str(k)]["s"] = round(time.time() - t0, 1)
                _free(dev)
                _ratios(rec)
                save(out)
    return out


def _ratios(rec: dict[str, Any]) -> None:
    """Each result against the same approach at k = 1 and against one sequential worker (a, k = 1)."""
    seq1 = rec["results"].get("a", {}).get("1", {}).get("tokens_per_s")
    for row in rec["results"].values():
        base = row.get("1", {}).get("tokens_per_s")
        for r in row.values():
            if "tokens_per_s" in r and base:
                r["vs_own_k1"] = round(r["tokens_per_s"] / base, 2)
            if "tokens_per_s" in r and seq1:
                r["vs_sequential_k1"] = round(r["tokens_per_s"] / seq1, 2)
    ga = rec["results"].get("f", {}).get("1", {}).get("tokens_per_s")
    if seq1 and ga:
        rec["graph_over_eager_k1"] = round(ga / seq1, 2)


def _calibrate(shape: dict[str, Any], seq: int, batch: int, dev: torch.device) -> tuple[float, int]:
    """(seconds per step, parameters) of one worker stepping sequentially."""
    w = Replica(shape, seq, batch, 0, dev, hf=False)
    for _ in range(3):
        w.step()
    return _timed(lambda: run_sequential([w], 5), dev) / 5, n_params(w.model)


def _measure(
    key: str, shape: dict[str, Any], seq: int, batch: int, k: int, n: int, dev: torch.device, deadline: float
) -> dict[str, Any]:
    tok = seq * batch
    if key == "e":
        return _mp_run(shape, seq, batch, k, n, dev, timeout=max(20.0, deadline - time.time()))
    hf = key.startswith("hf")
    ws = [Replica(shape, seq, batch, i, dev, hf=hf) for i in range(k)]
    if key == "d":
        import warnings

        st = Stacked(ws)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                st.step()
        notes = sorted({str(w.message)[:200] for w in caught})
        dt = _timed(lambda: [st.step() for _ in range(n)], dev, REPEATS)
        res = {"tokens_per_s": k * n * tok / dt, "round_ms": round(dt / n * 1e3, 3)}
        if notes:
            res["warnings"] = notes
        return res
    if key in ("f", "f2"):
        gs = [Graphed(w) for w in ws]
        streams = [torch.cuda.Stream() for _ in gs]

        def replay(m: int) -> None:
            if key == "f":
                for _ in range(m):
                    for g in gs:
                        g.replay()
            else:
                cur = torch.cuda.current_stream()
                for s in streams:
                    s.wait_stream(cur)
                for _ in range(m):
                    for g, s in zip(gs, streams, strict=True):
                        with torch.cuda.stream(s):
                            g.replay()
                for s in streams:
                    cur.wait_stream(s)

        replay(2)
        dt = _timed(lambda: replay(n), dev, REPEATS)
        return {"tokens_per_s": k * n * tok / dt, "round_ms": round(dt / n * 1e3, 3)}
    fn = {
        "a": run_sequential,
        "b": run_streams,
        "c": run_threads,
        "hf-a": run_sequential,
        "hf-b": run_streams,
        "hf-c": run_threads,
    }[key]
    fn(ws, 3)
    dt = _timed(lambda: fn(ws, n), dev, REPEATS)
    return {"tokens_per_s": k * n * tok / dt, "round_ms": round(dt / n * 1e3, 3)}
