"""A picture as the WD-tagger tools feed it to a bundle, with Pillow and numpy only.

kohya's tag_images_by_wd14_tagger (and the other tools, which differ only in
the resampling filter): transparency composited onto white, the picture centred
on a white square, the square resized to the model's input size (area
averaging when shrinking, Lanczos when enlarging), channels flipped to BGR,
float32 values 0-255, NHWC. export-bundle measures its thresholds on exactly
this input.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

WHITE = (255, 255, 255)
DESCRIPTION = ("alpha composited onto white, the picture centred on a white square, the square resized to "
               "{size}x{size} with area averaging when shrinking (Lanczos when enlarging), BGR, float32 0-255: "
               "what kohya's tag_images_by_wd14_tagger feeds")


def on_white(image):
    """An RGB Pillow image with any transparency composited onto white (what the tools do)."""
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, WHITE + (255,))
        canvas.alpha_composite(rgba)
        return canvas.convert("RGB")
    return image.convert("RGB")


def tool_picture(path, size: int, max_image_pixels: int | None = None) -> np.ndarray:
    """float32 [size, size, 3], BGR, 0-255. Raises OSError / ValueError for a picture that cannot be read."""
    from PIL import Image

    with Image.open(path) as opened:
        if max_image_pixels is not None and opened.width * opened.height > max_image_pixels:
            raise ValueError(f"oversized: {opened.width}x{opened.height} is over max_image_pixels {max_image_pixels}")
        return tool_array(opened, size)


def tool_array(image, size: int) -> np.ndarray:
    """A Pillow image as the tools feed it: float32 [size, size, 3], BGR, 0-255."""
    from PIL import Image

    picture = on_white(image)
    side = max(picture.size)
    square = Image.new("RGB", (side, side), WHITE)
    square.paste(picture, ((side - picture.width) // 2, (side - picture.height) // 2))
    if side != size:
        square = square.resize((size, size), Image.Resampling.BOX if side > size else Image.Resampling.LANCZOS)
    return np.asarray(square, dtype=np.float32)[:, :, ::-1]


def tool_batches(paths, size: int, batch_size: int, max_image_pixels: int | None = None, workers: int = 4):
    """(indices into paths, float32 [b, size, size, 3]) in order; (index, reason) of unreadable pictures in
    `skipped` of each yield: (indices, images, skipped)."""
    from PIL import Image

    def load(index):
        try:
            return index, tool_picture(paths[index], size, max_image_pixels), None
        except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as error:
            return index, None, str(error) or type(error).__name__

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(paths), batch_size):
            loaded = list(pool.map(load, range(start, min(len(paths), start + batch_size))))
            kept = [(index, image) for index, image, _ in loaded if image is not None]
            skipped = [(index, reason) for index, image, reason in loaded if image is None]
            images = np.stack([image for _, image in kept]) if kept else np.zeros((0, size, size, 3), np.float32)
            yield [index for index, _ in kept], images, skipped
