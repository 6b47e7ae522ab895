"""The composers' networks, in the key layouts of the authors' released checkpoints.

Written from reading the papers and the public repositories (google-research/composed_image_retrieval
for Pic2Word, miccunifi/SEARLE, ABaldrati/CLIP4Cir); the module and parameter names follow
their checkpoints so that a released state dict loads as it is:

* :class:`SearlePhi`: ``layers.{0,3,6}`` (three linear layers, GELU and dropout between);
* :class:`Pic2WordMapper`: ``layers.{i}.0`` (linear, dropout, ReLU blocks) and ``fc_out``;
* :class:`Combiner`: ``text_projection_layer``, ``image_projection_layer``, ``combiner_layer``,
  ``output_layer`` and the gate ``dynamic_scalar.{0,3}``.

Each ``from_state_dict`` reads the sizes from the tensors' shapes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def strip_module(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict without DataParallel/DDP's ``module.`` prefix."""
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}


def _loaded(net: Any, state: dict[str, Any]) -> Any:
    """``net`` with ``state`` loaded (strict: the layout must be the authors'), in eval mode."""
    net.load_state_dict(state)
    return net.eval()


class SearlePhi(nn.Module):
    """SEARLE's phi: image features -> one pseudo-word token embedding."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_dim, hidden_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, hidden_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, output_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SearlePhi:
        state = strip_module(state)
        hidden, inp = state["layers.0.weight"].shape
        out = state["layers.6.weight"].shape[0]
        return _loaded(cls(inp, hidden, out), state)


class Pic2WordMapper(nn.Module):
    """Pic2Word's mapping network (IM2TEXT in the authors' code): image features -> pseudo token."""

    def __init__(
        self, embed_dim: int, middle_dim: int, output_dim: int, n_layer: int = 2, dropout: float = 0.1
    ) -> None:
        super().__init__()
        blocks = []
        for n in range(n_layer):
            blocks.append(
                nn.Sequential(
                    nn.Linear(embed_dim if n == 0 else middle_dim, middle_dim), nn.Dropout(dropout), nn.ReLU()
                )
            )
        self.layers = nn.Sequential(*blocks)
        self.fc_out = nn.Linear(middle_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.layers(x))

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Pic2WordMapper:
        state = strip_module(state)
        n_layer = len({k.split(".")[1] for k in state if k.startswith("layers.")})
        middle, embed = state["layers.0.0.weight"].shape
        out = state["fc_out.weight"].shape[0]
        return _loaded(cls(embed, middle, out, n_layer), state)


class Combiner(nn.Module):
    """CLIP4Cir's Combiner: projected image and text features, mixed by a learnt gate."""

    def __init__(self, feature_dim: int, projection_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.text_projection_layer = nn.Linear(feature_dim, projection_dim)
        self.image_projection_layer = nn.Linear(feature_dim, projection_dim)
        self.combiner_layer = nn.Linear(2 * projection_dim, hidden_dim)
        self.output_layer = nn.Linear(hidden_dim, feature_dim)
        self.dynamic_scalar = nn.Sequential(
            nn.Linear(2 * projection_dim, hidden_dim),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden_dim, 1),
            nn.Sigmoid(),
        )
        self.dropout = nn.Dropout(0.5)

    def combine(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The normalised query of image and text features (raw, as the backbone gives them)."""
        joint = torch.cat(
            [
                self.dropout(F.relu(self.text_projection_layer(text))),
                self.dropout(F.relu(self.image_projection_layer(image))),
            ],
            dim=-1,
        )
        gate = self.dynamic_scalar(joint)
        mixed = self.output_layer(self.dropout(F.relu(self.combiner_layer(joint))))
        return F.normalize(mixed + gate * text + (1 - gate) * image, dim=-1)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Combiner:
        state = strip_module(state)
        projection, feature = state["text_projection_layer.weight"].shape
        hidden = state["combiner_layer.weight"].shape[0]
        return _loaded(cls(feature, projection, hidden), state)


#: Where each composer's network sits in its checkpoint (the authors' keys, then CIRVal's).
NETWORK_KEYS = {"searle": ("Phi",), "pic2word": ("state_dict_img2text",), "combiner": ("Combiner",)}
NETWORKS = {"searle": SearlePhi, "pic2word": Pic2WordMapper, "combiner": Combiner}
#: Where a checkpoint may carry the backbone's own (fine-tuned) CLIP weights.
BACKBONE_KEYS = ("CLIP", "state_dict")


def network_of(composer: str, checkpoint: dict[str, Any]) -> nn.Module:
    """The composer's network from a loaded checkpoint (a dict under the authors' key, or the
    bare state dict)."""
    for key in NETWORK_KEYS[composer]:
        if key in checkpoint:
            return NETWORKS[composer].from_state_dict(checkpoint[key])
    tensors = {k: v for k, v in checkpoint.items() if isinstance(v, torch.Tensor)}
    if tensors:
        return NETWORKS[composer].from_state_dict(tensors)
    raise ValueError(
        f"no {composer} network in the checkpoint (keys: {', '.join(sorted(checkpoint)) or 'none'}; "
        f"expected {' or '.join(NETWORK_KEYS[composer])})"
    )
