"""Usage: python bench/audit_scale.py [--sizes 10000 100000 1000000] [--queries 1000] [--dim 256]
[--dtype float32|float16] [--device cpu|cuda] [--chunk 4096] [--query-chunk 1024] [--top-k 64] [--threads N]

The ranking stage of an audit at benchmark scale, on synthetic normalised embeddings
(numpy, no model). For each gallery size G it writes the gallery to a temporary ``.npy``
file in blocks (never whole in memory), memory-maps it, and ranks ``--queries`` queries
against it with :func:`retrieval.ranking.rank_queries` (one positive per query, the
reference excluded, a running top-``--top-k``), in a fresh subprocess so that its peak
memory is its own. Each query is a noisy copy of its target's embedding, so ranks span
1 .. G. Prints, per size:

* rank-stage time and gallery items scored per second;
* peak memory: anonymous (process-private) RSS, and the file-backed RSS of the mapped
  gallery (page cache, shared and evictable), sampled every 20 ms from /proc/self/status;
  plus tracemalloc's peak of Python/numpy allocations during the ranking;
* on the smallest size, a check that every rank equals a brute-force full argsort of
  the score row with the pessimistic tie rule (tests.reference_impl.pessimistic_rank), and
  that the top-K scores equal those of the full sort.

Goals: time linear in G; anonymous peak memory flat in G (only the mapped gallery grows).
Asserts nothing; prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--query-chunk", type=int, default=1024)
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--noise", type=float, default=4.0, help="query = normalise(target + noise * N(0, 1/dim))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class PeakSampler:
    """Peak RssAnon / RssFile of this process, sampled in a thread."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.anon, self.file = every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.every)

    def sample(self) -> None:
        self.anon = max(self.anon, _status_kb("RssAnon"))
        self.file = max(self.file, _status_kb("RssFile"))

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def write_gallery(path: Path, n: int, dim: int, dtype: str, seed: int, block: int = 65536) -> None:
    """Random unit vectors written block by block into a .npy file."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n, dim))
    rng = np.random.default_rng(seed)
    for s in range(0, n, block):
        x = rng.standard_normal((min(block, n - s), dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[s : s + x.shape[0]] = x.astype(dtype)
    out.flush()
    del out


def make_queries(
    gallery: np.ndarray, n_q: int, noise: float, seed: int
) -> tuple[np.ndarray, list[list[int]], list[int]]:
    rng = np.random.default_rng(seed + 1)
    n, dim = gallery.shape
    targets = rng.choice(n, size=n_q, replace=False)
    refs = (targets + 1 + rng.integers(0, n - 1, size=n_q)) % n  # never the target
    q = gallery[np.sort(targets)].astype(np.float32)[np.argsort(np.argsort(targets))]
    q = q + noise * rng.standard_normal(q.shape, dtype=np.float32) / np.sqrt(dim)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32), [[int(t)] for t in targets], [int(r) for r in refs]


def brute_force_check(gallery, queries, positives, exclude, result, top_k) -> dict:
    """Every rank against a full argsort (pessimistic ties), and the top-K scores."""
    import torch

    from tests.reference_impl import pessimistic_rank

    g = torch.from_numpy(np.asarray(gallery, dtype=np.float32))
    scores = (torch.from_numpy(queries) @ g.T).numpy()
    same = same_top = 0
    for q in range(queries.shape[0]):
        want = pessimistic_rank(scores[q], positives[q][0], exclude[q])
        same += int(result.best_rank[q] == want)
        full = np.sort(scores[q])[::-1][:top_k]
        same_top += int(np.array_equal(full, result.topk_scores[q].numpy()))
    return {"ranks_equal": same, "topk_equal": same_top, "queries": queries.shape[0]}


def run_one(args: argparse.Namespace) -> dict:
    import torch

    from retrieval.ranking import rank_queries

    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.dir) / f"gallery_{args.one}.npy"
    t0 = time.perf_counter()
    write_gallery(path, args.one, args.dim, args.dtype, args.seed)
    write_s = time.perf_counter() - t0
    gallery = np.load(path, mmap_mode="c")
    queries, positives, exclude = make_queries(gallery, args.queries, args.noise, args.seed)
    q = torch.from_numpy(queries).to(args.device)
    g = torch.from_numpy(gallery)
    if args.device != "cpu":
        g = g.to(args.device)
    base_anon = _status_kb("RssAnon")
    tracemalloc.start()
    with PeakSampler() as peak:
        t0 = time.perf_counter()
        result = rank_queries(
            q, g, positives, exclude, top_k=args.top_k, chunk_size=args.chunk, query_chunk_size=args.query_chunk
        )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        rank_s = time.perf_counter() - t0
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out = {
        "gallery": args.one,
        "queries": args.queries,
        "dim": args.dim,
        "dtype": args.dtype,
        "write_s": write_s,
        "rank_s": rank_s,
        "items_per_s": args.one * args.queries / rank_s,
        "base_anon_mb": base_anon / 1024,
        "peak_anon_mb": peak.anon / 1024,
        "peak_file_mb": peak.file / 1024,
        "tracemalloc_peak_mb": traced_peak / 2**20,
        "gallery_file_mb": path.stat().st_size / 2**20,
        "median_rank": float(np.median([r for r in result.best_rank if r is not None])),
    }
    if args.check:
        out["check"] = brute_force_check(gallery, queries, positives, exclude, result, args.top_k)
    del gallery, g
    path.unlink()
    return out


def main() -> None:
    args = parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    import torch

    load = os.getloadavg()
    print(
        f"# rank stage, synthetic gallery: {args.queries} queries, dim {args.dim} {args.dtype}, "
        f"device {args.device}, chunk {args.chunk}x{args.query_chunk}, top-{args.top_k}; "
        f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"{'gallery':>9} {'rank s':>8} {'Mitems/s':>9} {'anon base MB':>12} {'anon peak MB':>12} "
        f"{'mapped MB':>10} {'file MB':>8} {'tracemalloc MB':>14} {'median rank':>11}"
    )
    with tempfile.TemporaryDirectory(prefix="cirval-scale-") as tmp:
        for n, size in enumerate(args.sizes):
            argv = [
                sys.executable,
                __file__,
                "--one",
                str(size),
                "--dir",
                tmp,
                "--queries",
                str(args.queries),
                "--dim",
                str(args.dim),
                "--dtype",
                args.dtype,
                "--device",
                args.device,
                "--chunk",
                str(args.chunk),
                "--query-chunk",
                str(args.query_chunk),
                "--top-k",
                str(args.top_k),
                "--threads",
                str(args.threads),
                "--noise",
                str(args.noise),
                "--seed",
                str(args.seed),
            ] + (["--check"] if n == 0 else [])
            r = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print(
                f"{r['gallery']:>9} {r['rank_s']:>8.2f} {r['items_per_s'] / 1e6:>9.1f} {r['base_anon_mb']:>12.0f} "
                f"{r['peak_anon_mb']:>12.0f} {r['peak_file_mb']:>10.0f} {r['gallery_file_mb']:>8.0f} "
                f"{r['tracemalloc_peak_mb']:>14.1f} {r['median_rank']:>11.0f}",
                flush=True,
            )
            if "check" in r:
                c = r["check"]
                print(
                    f"#   brute-force check on {r['gallery']}: ranks equal for {c['ranks_equal']}/{c['queries']} "
                    f"queries, top-{args.top_k} scores equal for {c['topk_equal']}/{c['queries']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
