"""What fills the part of the output a picture does not cover, and what becomes of its transparency.

The one place that decides it for training (the warp's fill), validation,
evaluate and grad-cam: every path through the pipeline takes a Fill.

padding
    "border" (DeepDanbooru's): the warp clamps its samples to the picture, so
    its border pixels are repeated outward. "white": outside the picture is
    white, as the WD tagger tools pad a picture to a square and as WD's models
    were trained.
alpha
    "drop" (DeepDanbooru's): the colour channels as stored, whatever lies under
    transparent pixels (often black). "white": PNG and WebP transparency is
    composited onto white, as the tools do.

The defaults keep DeepDanbooru's pipeline bit for bit: the white variants are
separate code paths, chosen in Python, not arithmetic on a flag.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdanbooru.project.config import ALPHA_MODES, PADDING_MODES

WHITE = 255


@dataclass(frozen=True)
class Fill:
    padding: str = "border"
    alpha: str = "drop"

    def __post_init__(self):
        if self.padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {', '.join(PADDING_MODES)}, got {self.padding!r}")
        if self.alpha not in ALPHA_MODES:
            raise ValueError(f"alpha must be one of {', '.join(ALPHA_MODES)}, got {self.alpha!r}")

    @classmethod
    def from_config(cls, config, alpha: str | None = None, padding: str | None = None) -> Fill:
        """The project's fill (DeepDanbooru's when `config` is None); `alpha` and `padding` override it
        (evaluate's --alpha and --padding)."""
        base = cls(config.padding, config.alpha) if config is not None else cls()
        return cls(padding or base.padding, alpha or base.alpha)

    @property
    def white_padding(self) -> bool:
        return self.padding == "white"

    @property
    def alpha_on_white(self) -> bool:
        return self.alpha == "white"
