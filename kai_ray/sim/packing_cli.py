"""`kai-ray bench packing`: the FGD protocol on the openb traces, all policies, many seeds."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kai_ray.sim.packing import protocol, trace

DEFAULT_POLICIES = ("random", "best_fit", "packing", "kai", "fgd", "lookahead")
# our name -> the FGD artifact's name for the published medians
PUBLISHED_NAME = {"random": "Random", "best_fit": "BestFit", "packing": "GpuPacking",
                  "fgd": "FGD"}
TRACE_SETS = {
    "paper": ("default", "gpushare40", "gpushare60", "gpushare80", "gpushare100",
              "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
              "multigpu20", "multigpu30", "multigpu40", "multigpu50"),
}
ARRIVAL = 100  # % of GPU capacity where the headline number is read


@dataclass
class Job:
    data_dir: str
    trace: str
    policy: str
    seed: int


_CACHE: dict[tuple[str, str], Any] = {}


def _load(data_dir: str, tr: str) -> tuple[trace.Cluster, trace.PodList, Any]:
    key = (data_dir, tr)
    if key not in _CACHE:
        d = Path(data_dir)
        cluster = _CACHE.setdefault((data_dir, ""), trace.load_cluster(d))
        pods = trace.load_pods(d, tr)
        _CACHE[key] = (cluster, pods, trace.typical_shapes(pods, cluster.models))
    return _CACHE[key]  # type: ignore[no-any-return]


def run_job(job: Job) -> dict[str, Any]:
    cluster, pods, shapes = _load(job.data_dir, job.trace)
    t0 = time.perf_counter()
    r = protocol.run(cluster, pods, job.policy, job.seed, shapes, timing=True)
    return {
        "trace": job.trace, "policy": job.policy, "seed": job.seed,
        "unallocated": r.curve("unallocated").tolist(),
        "frag_ratio": r.curve("frag_ratio").tolist(),
        "pods": int(r.arrived.shape[0]), "failed": r.failed,
        "place_ms_median": float(np.median(r.place_seconds) * 1e3),
        "wall_s": time.perf_counter() - t0,
    }


def _traces(arg: str) -> list[str]:
    out: list[str] = []
    for t in arg.split(","):
        out.extend(TRACE_SETS.get(t.strip(), (t.strip(),)))
    return out


def run_all(data_dir: str, traces: list[str], policies: list[str], seeds: list[int],
            workers: int) -> list[dict[str, Any]]:
    jobs = [Job(data_dir, t, p, s) for t in traces for p in policies for s in seeds]
    # slow policies first so the pool stays busy to the end
    jobs.sort(key=lambda j: j.policy not in ("fgd", "lookahead"))
    results: list[dict[str, Any]] = []
    t0 = time.time()
    if workers <= 1:
        it: Any = map(run_job, jobs)
        pool = None
    else:
        pool = mp.get_context("fork").Pool(workers)
        it = pool.imap_unordered(run_job, jobs)
    try:
        for i, res in enumerate(it, 1):
            results.append(res)
            print(f"[{i}/{len(jobs)} {time.time() - t0:6.0f}s] {res['trace']} {res['policy']} "
                  f"seed {res['seed']}: unallocated {res['unallocated'][ARRIVAL]:.2f} % "
                  f"({res['wall_s']:.1f}s)", file=sys.stderr, flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return results


def summarise(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in sorted(results, key=lambda r: (r["policy"], r["trace"], r["seed"])):
        cell = out.setdefault(r["policy"], {}).setdefault(r["trace"], {"seeds": [], "values": []})
        cell["seeds"].append(r["seed"])
        cell["values"].append(r["unallocated"][ARRIVAL])
    for pol in out.values():
        for cell in pol.values():
            cell["median"] = round(float(np.median(cell["values"])), 2)
            cell["seeds"] = [round(v, 2) for v in cell.pop("values")]
    return out


def _table(summary: dict[str, dict[str, dict[str, Any]]], results: list[dict[str, Any]],
           expected: dict[tuple[str, str, str], np.ndarray], traces: list[str],
           policies: list[str]) -> str:
    lines = [f"unallocated GPU % at {ARRIVAL} % arrival (FGD protocol, median over seeds "
             "[min-max]; 'paper' = FGD artifact's published median)", ""]
    head = f"{'trace':<12} {'policy':<9} {'median':>7} {'min-max':>13} {'paper':>7} " \
           f"{'frag%@80':>9} {'ms/pod':>7}"
    lines += [head, "-" * len(head)]
    for t in traces:
        for p in policies:
            cell = summary.get(p, {}).get(t)
            if cell is None:
                continue
            vals = cell["seeds"]
            rs = [r for r in results if r["trace"] == t and r["policy"] == p]
            fr = float(np.median([r["frag_ratio"][80] for r in rs]))
            ms = float(np.median([r["place_ms_median"] for r in rs]))
            pub = expected.get((t, PUBLISHED_NAME.get(p, ""), "alloc_gpu_pct_of_capacity"))
            pub_s = f"{100 - pub[ARRIVAL]:.2f}" if pub is not None else "-"
            lines.append(f"{t:<12} {p:<9} {cell['median']:>7.2f} "
                         f"{min(vals):>6.2f}-{max(vals):<6.2f} {pub_s:>7} {fr:>9.1f} {ms:>7.2f}")
        lines.append("")
    return "\n".join(lines)


def _plot(path: str, results: list[dict[str, Any]],
          expected: dict[tuple[str, str, str], np.ndarray], traces: list[str],
          policies: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(traces), 4)
    rows = (len(traces) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    x = np.arange(131)
    colors = dict(zip(DEFAULT_POLICIES, ("C7", "C0", "C2", "C4", "C3", "C1"), strict=True))
    for ax, t in zip(axes.flat, traces, strict=False):
        for p in policies:
            curves = [r["unallocated"] for r in results if r["trace"] == t and r["policy"] == p]
            if not curves:
                continue
            med = np.nanmedian(np.array(curves, dtype=float), axis=0)
            c = colors.get(p)
            ax.plot(x, med, color=c, label=f"{p} (this run)", lw=1.6)
            pub = expected.get((t, PUBLISHED_NAME.get(p, ""), "alloc_gpu_pct_of_capacity"))
            if pub is not None:
                ax.plot(x, 100 - pub, color=c, ls="--", lw=1.0, label=f"{p} (FGD paper)")
        ax.set_xlim(75, 130)
        ax.set_ylim(0, 30)
        ax.set_title(t)
        ax.set_xlabel("arrived workload (% of GPU capacity)")
        ax.set_ylabel("unallocated GPU (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(traces):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_bench_packing(args: argparse.Namespace) -> int:
    try:
        ddir = str(trace.data_dir(getattr(args, "data_dir", None)))
    except FileNotFoundError as e:
        print(f"kai-ray bench packing: --data-dir: {e}", file=sys.stderr)
        return 2
    traces = _traces(args.trace)
    # a missing trace is found now, not as a worker's traceback after the others ran
    missing = [t for t in traces if not any(
        (Path(ddir) / f"openb_pod_list_{t}{suffix}").is_file() for suffix in (".csv", ".csv.gz"))]
    if missing:
        known = sorted(p.name.removeprefix("openb_pod_list_").split(".")[0]
                       for p in Path(ddir).glob("openb_pod_list_*.csv*"))
        print(f"kai-ray bench packing: --trace: no such trace {missing} in {ddir}; known: "
              f"{', '.join(known)} (or paper)", file=sys.stderr)
        return 2
    policies = list(args.policy or DEFAULT_POLICIES)
    for p in policies:
        if p not in protocol.SIM_POLICIES:
            print(f"kai-ray bench packing: --policy: unknown policy {p!r}; known: "
                  f"{', '.join(protocol.SIM_POLICIES)}", file=sys.stderr)
            return 2
    if args.seeds < 1:
        print("kai-ray bench packing: --seeds: expected an integer >= 1", file=sys.stderr)
        return 2
    seeds = list(range(42, 42 + args.seeds))
    workers = max(1, min(int(getattr(args, "workers", 2) or 2), 2))
    results = run_all(ddir, traces, policies, seeds, workers)
    summary = summarise(results)
    expected = trace.load_expected(Path(ddir))
    if args.plot:
        _plot(args.plot, results, expected, traces, policies)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if getattr(args, "save", None):
        Path(args.save).write_text(json.dumps(results))
    if args.output == "json":
        print(json.dumps(summary, indent=1))
    else:
        print(_table(summary, results, expected, traces, policies))
    return 0


def merge_main(argv: list[str] | None = None) -> int:
    """`python3 -m kai_ray.sim.packing_cli RUNS.json ...`: one table (and plot) from runs saved
    by separate `--save` commands, e.g. baselines and `lookahead` run one after the other."""
    ap = argparse.ArgumentParser(prog="python3 -m kai_ray.sim.packing_cli",
                                 description=merge_main.__doc__)
    ap.add_argument("runs", nargs="+", help="JSON files written by kai-ray bench packing --save")
    ap.add_argument("--data-dir", help="directory holding the openb CSV files")
    ap.add_argument("--plot", help="PNG path for the curves")
    ap.add_argument("--save", help="write all runs to this JSON file")
    a = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    for f in a.runs:
        try:
            data = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            print(f"{f}: cannot read saved runs: {e}", file=sys.stderr)
            return 2
        if not isinstance(data, list) or not all(isinstance(r, dict) and "unallocated" in r
                                                 for r in data):
            print(f"{f}: not a list of runs saved by --save", file=sys.stderr)
            return 2
        results.extend(data)
    traces = list(dict.fromkeys(r["trace"] for r in results))
    present = {r["policy"] for r in results}
    policies = [p for p in DEFAULT_POLICIES if p in present]
    expected = trace.load_expected(trace.data_dir(a.data_dir))
    if a.plot:
        _plot(a.plot, results, expected, traces, policies)
    if a.save:
        Path(a.save).write_text(json.dumps(results))
    print(_table(summarise(results), results, expected, traces, policies))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(merge_main())
