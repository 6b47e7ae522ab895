"""python manage.py train_demo_retriever: train the demo world's two retrievers (var/models/)."""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from retrieval.demo_training import DEFAULT_STEPS, DEMO_MODELS, checkpoint_path, retriever_spec, train_model



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
    help = ("Train the demo retrievers (open_clip 'cirval-demo'): one on captions and compositions, one on "
            "captions and one-edit image neighbours (no composition). Deterministic: same seed and steps, same "
            "checkpoint bytes.")

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--steps", type=int, default=None,
                            help="steps of the composition model (the caption-only one gets 4/5 of them)")
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
        started = time.monotonic()
        for (name, path, steps), (digest, seconds) in zip(jobs, train_all(jobs, opts["seed"], not opts["no_progress"])):
            self.stdout.write(f"{name}: {steps} steps in {seconds:.1f} s -> {path}\n"
                              f"  sha256 {digest}\n  retriever {retriever_spec(path)}")
        if len(jobs) > 1:
            self.stdout.write(f"trained {len(jobs)} models in {time.monotonic() - started:.1f} s (wall clock)")


def _train_one(name: str, path: Path, steps: int, seed: int, progress: bool, position: int) -> tuple[str, float]:
    """Train one demo model; (sha256 of its checkpoint, seconds it took)."""
    started = time.monotonic()
    digest = train_model(path, DEMO_MODELS[name], seed=seed, steps=steps, progress=progress,
                         desc=f"{name} ({'+'.join(DEMO_MODELS[name])})", position=position)
    return digest, time.monotonic() - started


def train_all(jobs: list[tuple[str, Path, int]], seed: int, progress: bool) -> list[tuple[str, float]]:
    """Train every ``(name, path, steps)``: side by side in spawned processes when there are
    several and the machine has a core for each (each trains on one thread, deterministically,
    so the checkpoints are the bytes a one-by-one run writes; two models on two cores take the
    wall time of the slower one), else one after the other (one core, or inside a daemonic
    process, which may not start children)."""
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers < 2 or multiprocessing.current_process().daemon:
        return [_train_one(name, path, steps, seed, progress, 0) for name, path, steps in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_train_one, name, path, steps, seed, progress, n)
                   for n, (name, path, steps) in enumerate(jobs)]
        return [f.result() for f in futures]
