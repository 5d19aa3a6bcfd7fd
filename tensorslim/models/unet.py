"""A 2-D U-Net (Ronneberger et al., 2015, arXiv 1505.04597) as a model family (``unet``), for the ``segment`` task.

arXiv 2205.09107 trains a U-Net on the image, on a global binary mask, or on both as two channels (§2); its exact
variant is not stated, so ours is the plain one: per level two 3 × 3 convolutions with batch norm and ReLU, 2 × 2
max-pooling down, 2 × 2 transposed convolutions up, skip connections by concatenation, and a 1 × 1 head giving one
logit per pixel (foreground vs background). ``channels`` sets the width of each level (their number is the depth).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tensorslim._checks import check_fields
from tensorslim.models.registry import ModelFamily, register_presets


@dataclass(frozen=True, kw_only=True)
class UNetConfig:
    """Shape of a U-Net.

    Attributes:
        in_channels: input channels (1: image or mask alone; 2: image and mask).
        channels: feature channels per level, from the full-resolution level down (at least two levels).
        image_size: the side of the square images the books count FLOPs on (any size divisible by
            ``2 ** (len(channels) - 1)`` runs).
        norm: ``batch`` (the plain U-Net's) or ``instance`` (per image and channel, with a learned scale and shift,
            as nnU-Net and MONAI's BasicUNet use; no running statistics, so training and evaluation agree).
    """

    in_channels: int = 1
    channels: tuple[int, ...] = (16, 32, 64, 128)
    image_size: int = 96
    norm: str = "batch"

    def __post_init__(self) -> None:
        check_fields(self)
        if self.in_channels not in (1, 2):
            raise ValueError(f"in_channels={self.in_channels!r} is invalid; allowed: 1 or 2")
        if len(self.channels) < 2 or any(not isinstance(c, int) or c < 1 for c in self.channels):
            raise ValueError(f"channels={self.channels!r} is invalid; allowed: two or more positive ints")
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r} is unknown; allowed: {list(NORMS)}")
        if self.image_size < 1 or self.image_size % self.multiple:
            raise ValueError(f"image_size={self.image_size} is invalid; allowed: a multiple of {self.multiple}")

    @property
    def multiple(self) -> int:
        """Image sides must be multiples of this (one halving per level below the first)."""
        return 2 ** (len(self.channels) - 1)


NORMS = {"batch": nn.BatchNorm2d, "instance": lambda c: nn.InstanceNorm2d(c, affine=True)}


def double_conv(c_in: int, c_out: int, norm: str = "batch") -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        NORMS[norm](c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
        NORMS[norm](c_out),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """``forward(x (B, in_channels, H, W)) -> logits (B, 1, H, W)``; H and W multiples of ``config.multiple``."""

    def __init__(self, config: UNetConfig) -> None:
        super().__init__()
        self.config = config
        widths = config.channels
        self.down = nn.ModuleList(
            double_conv(c_in, c_out, config.norm)
            for c_in, c_out in zip((config.in_channels, *widths), widths, strict=False)
        )
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in range(len(widths) - 1)
        )
        self.merge = nn.ModuleList(double_conv(2 * widths[i], widths[i], config.norm) for i in range(len(widths) - 1))
        self.head = nn.Conv2d(widths[0], 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.config.in_channels:
            raise ValueError(f"input has shape {tuple(x.shape)}; allowed: (B, {self.config.in_channels}, H, W)")
        if x.shape[-2] % self.config.multiple or x.shape[-1] % self.config.multiple:
            raise ValueError(
                f"image size {tuple(x.shape[-2:])} is invalid; allowed: multiples of {self.config.multiple}"
            )
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()
        for i in reversed(range(len(self.up))):
            x = self.merge[i](torch.cat([skips.pop(), self.up[i](x)], dim=1))
        return self.head(x)

    def example_input(self, *, batch: int, seq_len: int) -> torch.Tensor:
        """The input the books count FLOPs on: ``batch`` zero images of ``config.image_size`` squared pixels.

        ``seq_len`` (tokens per sequence for the language models) is not used: a U-Net's "token" is a pixel.
        """
        side = self.config.image_size
        device = next(self.parameters()).device
        return torch.zeros(batch, self.config.in_channels, side, side, device=device)


def _build(config: UNetConfig, *, task: str) -> nn.Module:
    return UNet(config)


UNET = ModelFamily(name="unet", tasks=("segment",), build=_build, head_names=("head",))
UNET_PRESETS: dict[str, UNetConfig] = {
    "unet": UNetConfig(),
    "unet-small": UNetConfig(channels=(8, 16, 32, 64)),
    "unet-deep": UNetConfig(channels=(8, 16, 32, 64, 128)),
    "unet-deep-in": UNetConfig(channels=(8, 16, 32, 64, 128), norm="instance"),
}
_HELP = {
    "unet": "2-D U-Net, 4 levels of 16-128 channels (segmentation, arXiv 2205.09107)",
    "unet-small": "2-D U-Net, 4 levels of 8-64 channels (CPU-sized segmentation)",
    "unet-deep": "2-D U-Net, 5 levels of 8-128 channels (nnU-Net's depth at 96 x 96: pooled down to 6 x 6)",
    "unet-deep-in": "unet-deep with instance norm (as nnU-Net and MONAI's BasicUNet use)",
}
register_presets(UNET, UNET_PRESETS, _HELP)
