"""python manage.py train_demo_retriever: train the demo world's two retrievers (var/models/)."""
from __future__ import annotations

import time
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
        for name, path in demo_checkpoints(out_dir, opts["seed"]).items():
            if opts["only"] and name != opts["only"]:
                continue
            if path.exists() and not opts["force"]:
                self.stdout.write(f"{name}: {path} exists (use --force to train again)")
                continue
            steps = opts["steps"] if name == "compose" else caption_steps(opts["steps"])
            started = time.monotonic()
            digest = train_model(path, DEMO_MODELS[name], seed=opts["seed"], steps=steps,
                                 progress=not opts["no_progress"], desc=f"{name} ({'+'.join(DEMO_MODELS[name])})")
            self.stdout.write(f"{name}: {steps} steps in {time.monotonic() - started:.1f} s -> {path}\n"
                              f"  sha256 {digest}\n  retriever {retriever_spec(path)}")
