"""python manage.py train_demo_retriever: train the demo world's two retrievers (var/models/)."""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, wait
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from retrieval.demo_training import DEFAULT_STEPS, DEMO_MODELS, checkpoint_path, retriever_spec, train_model
from retrieval.jobs.job_progress import ProgressLine, eta_seconds, format_eta


def caption_steps(steps: int) -> int:
    """Steps of the caption-only model: it has one objective and converges sooner (4/5 of ``steps``)."""
    return max(1, steps * 4 // 5)


def demo_checkpoints(models_dir: Path, seed: int) -> dict[str, Path]:
    """name -> where the demo model trained with ``seed`` lives (whether or not it exists yet)."""
    return {name: checkpoint_path(models_dir, name, seed) for name in DEMO_MODELS}


def default_models_dir() -> Path:
    """settings.DEMO_MODELS_DIR (default var/models)."""
    return Path(settings.DEMO_MODELS_DIR)


def default_steps() -> int:
    """settings.DEMO_TRAIN_STEPS when set, else the trainer's default."""
    return int(settings.DEMO_TRAIN_STEPS) or DEFAULT_STEPS


class Command(BaseCommand):
    help = (
        "Train the demo retrievers (open_clip 'cirval-demo'): one on captions and compositions, one on "
        "captions and one-edit image neighbours (no composition). Deterministic: same seed and steps, same "
        "checkpoint bytes."
    )

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument(
            "--steps",
            type=int,
            default=None,
            help="steps of the composition model (the caption-only one gets 4/5 of them)",
        )
        parser.add_argument("--out-dir", default=None, help="default: settings.DEMO_MODELS_DIR (var/models)")
        parser.add_argument("--only", choices=sorted(DEMO_MODELS), default=None)
        parser.add_argument("--force", action="store_true", help="train again even if the checkpoint exists")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args, **opts):
        if opts["steps"] is None:
            opts["steps"] = default_steps()
        if opts["steps"] < 1:
            raise CommandError("--steps must be >= 1")
        out_dir = Path(opts["out_dir"]) if opts["out_dir"] else default_models_dir()
        jobs = []
        for name, path in demo_checkpoints(out_dir, opts["seed"]).items():
            if opts["only"] and name != opts["only"]:
                continue
            if path.exists() and not opts["force"]:
                self.stdout.write(f"{name}: {path} exists (use --force to train again)")
                continue
            steps = opts["steps"] if name == "compose" else caption_steps(opts["steps"])
            jobs.append((name, path, steps))
        if jobs:  # said once: open_clip's own warning of a random start is left out (demo_training)
            self.stdout.write(
                f"The demo retrievers start from random weights (no published weights know the demo's drawn "
                f"world) and are trained now: {', '.join(f'{name} {steps} steps' for name, _, steps in jobs)}; "
                f"saved under {out_dir} and reused on every later start."
            )
        started = time.monotonic()
        trained = train_all(jobs, opts["seed"], None if opts["no_progress"] else self.stderr)
        for (name, path, steps), (digest, seconds) in zip(jobs, trained):
            self.stdout.write(
                f"{name}: {steps} steps in {seconds:.1f} s, sha256 {digest}\n  retriever {retriever_spec(path)}"
            )
        if len(jobs) > 1:
            self.stdout.write(f"trained {len(jobs)} models in {time.monotonic() - started:.1f} s (wall clock)")


#: This process's share of the progress counters (set in each spawned trainer by
#: :func:`_share_progress`): ``[steps done, seconds]`` per job, side by side.
_SHARED = None


def _share_progress(shared) -> None:
    global _SHARED
    _SHARED = shared


def _train_one(
    name: str, path: Path, steps: int, seed: int, slot: int, show=None, split: dict | None = None
) -> tuple[str, float]:
    """Train one demo model; (sha256 of its checkpoint, seconds it took). Its steps done and
    seconds go to slot ``slot`` of the shared counters, when there are any, and ``show()``
    (training in this process) redraws the progress line after every step. ``split``:
    train_model's ``n_refs``/``groups_per_step`` where not its defaults (a test's tiny split)."""

    def progress(done: int, seconds: float) -> None:
        if _SHARED is not None:
            _SHARED[2 * slot], _SHARED[2 * slot + 1] = done, seconds
        if show is not None:
            show()

    started = time.monotonic()
    digest = train_model(path, DEMO_MODELS[name], seed=seed, steps=steps, progress=progress, **(split or {}))
    return digest, time.monotonic() - started


def progress_text(jobs: list[tuple[str, Path, int]], counters, side_by_side: bool) -> tuple[str, float]:
    """The one progress line of a training and the fraction done: each model's steps and
    the time left (models side by side: the slowest one's; one after the other: the sum's).
    ``counters``: ``[steps done, seconds]`` per job."""
    done = [int(counters[2 * n]) for n in range(len(jobs))]
    etas = [eta_seconds(d, steps, counters[2 * n + 1]) for n, (d, (_, _, steps)) in enumerate(zip(done, jobs))]
    total = sum(steps for _, _, steps in jobs)
    if side_by_side:
        left = None if any(e is None for e in etas) else max(etas)
    else:
        started = [n for n, d in enumerate(done) if d]
        seconds = sum(counters[2 * n + 1] for n in started)
        left = eta_seconds(sum(done), total, seconds) if started else None
    parts = ", ".join(f"{name} {d}/{steps}" for d, (name, _, steps) in zip(done, jobs))
    when = "estimating the time left" if left is None else f"{format_eta(left)} left"
    return f"training the demo retrievers: {parts} steps, {when}", sum(done) / total


def train_all(
    jobs: list[tuple[str, Path, int]], seed: int, out=None, split: dict | None = None
) -> list[tuple[str, float]]:
    """Train every ``(name, path, steps)``: side by side in spawned processes when there are
    several and the machine has a core for each (each trains on one thread, deterministically,
    so the checkpoints are the bytes a one-by-one run writes; two models on two cores take the
    wall time of the slower one), else one after the other (one core, or inside a daemonic
    process, which may not start children). ``out``: where the one progress line goes
    (:class:`~retrieval.jobs.job_progress.ProgressLine`), None for none. ``split``: see :func:`_train_one`."""
    ctx = multiprocessing.get_context("spawn")
    counters = ctx.Array("d", 2 * len(jobs), lock=False)
    line = ProgressLine(out) if out is not None and jobs else None
    side_by_side = min(len(jobs), os.cpu_count() or 1) >= 2 and not multiprocessing.current_process().daemon

    def show() -> None:
        if line is not None:
            line.update(*progress_text(jobs, counters, side_by_side))

    if not side_by_side:
        _share_progress(counters)
        results = [_train_one(name, path, steps, seed, n, show, split) for n, (name, path, steps) in enumerate(jobs)]
    else:
        with ProcessPoolExecutor(len(jobs), mp_context=ctx, initializer=_share_progress, initargs=(counters,)) as pool:
            futures = [
                pool.submit(_train_one, name, path, steps, seed, n, None, split)
                for n, (name, path, steps) in enumerate(jobs)
            ]
            while wait(futures, timeout=0.5).not_done:
                show()
            results = [f.result() for f in futures]
    if line is not None:
        show()
        line.close()
    return results
