import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from deepdanbooru.errors import ImageError
from deepdanbooru.preflight.images import BadImage, ImageInfo, image_problem, inspect_bytes, inspect_image

WIDTH, HEIGHT = 21, 13


def picture(mode="RGB"):
    rng = np.random.default_rng(7)
    rgba = Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 4), dtype=np.uint8), "RGBA")
    if mode == "RGBA":
        return rgba
    if mode == "P":
        return rgba.convert("RGB").quantize(16)
    return rgba.convert(mode)


def encode(image, pillow_format, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=pillow_format, **options)
    return buffer.getvalue()


def animation(pillow_format):
    first = picture()
    return encode(first, pillow_format, save_all=True, append_images=[first.transpose(Image.Transpose.ROTATE_180)])


# name -> (bytes, format, animated, has_alpha)
GOOD = {
    "jpeg": (encode(picture(), "JPEG"), "jpeg", False, False),
    "jpeg_gray": (encode(picture("L"), "JPEG"), "jpeg", False, False),
    "jpeg_progressive": (encode(picture(), "JPEG", progressive=True), "jpeg", False, False),
    "jpeg_cmyk": (encode(picture("CMYK"), "JPEG"), "jpeg", False, False),
    "png": (encode(picture(), "PNG"), "png", False, False),
    "png_rgba": (encode(picture("RGBA"), "PNG"), "png", False, True),
    "png_palette": (encode(picture("P"), "PNG"), "png", False, False),
    "png_gray16": (encode(Image.fromarray(np.full((HEIGHT, WIDTH), 40000, np.uint16)), "PNG"), "png", False, False),
    "apng": (animation("PNG"), "png", True, False),
    "gif": (encode(picture(), "GIF"), "gif", False, False),
    "gif_animated": (animation("GIF"), "gif", True, False),
    "bmp": (encode(picture(), "BMP"), "bmp", False, False),
    "bmp_8bit": (encode(picture("P"), "BMP"), "bmp", False, False),
    "bmp_1bit": (encode(picture("1"), "BMP"), "bmp", False, False),
    "bmp_32bit": (encode(picture("RGBA"), "BMP"), "bmp", False, False),
    "webp": (encode(picture(), "WEBP"), "webp", False, False),
    "webp_lossless": (encode(picture(), "WEBP", lossless=True), "webp", False, False),
    "webp_alpha": (encode(picture("RGBA"), "WEBP"), "webp", False, True),
    "webp_animated": (animation("WEBP"), "webp", True, False),
}


@pytest.mark.parametrize("name", GOOD)
def test_reads_format_and_size_of_each_kind(tmp_path, name):
    data, kind, animated, alpha = GOOD[name]
    path = tmp_path / f"image.{name}"  # the name's extension is deliberately not the format's
    path.write_bytes(data)
    info = inspect_image(path)
    assert info == ImageInfo(kind, WIDTH, HEIGHT, animated=animated, has_alpha=alpha)
    assert info.pixels == WIDTH * HEIGHT
    assert image_problem(path) is None
    assert image_problem(path, max_pixels=WIDTH * HEIGHT) is None


@pytest.mark.parametrize("name", GOOD)
def test_every_truncation_is_detected(name):
    data = GOOD[name][0]
    missed = []
    for cut in range(len(data)):
        try:
            inspect_bytes(data[:cut])
        except Exception as error:  # noqa: BLE001 - any exception type other than the parser's is a bug
            assert type(error).__name__ == "_Bad", (cut, error)
        else:
            missed.append(cut)
    assert missed == []


@pytest.mark.parametrize("name, reason", [
    ("jpeg", "truncated JPEG: no end-of-image marker"),
    ("png", "truncated PNG"),
    ("gif", "truncated GIF"),
    ("bmp", "truncated BMP"),
    ("webp", "truncated WebP"),
])
def test_truncated_file_gives_a_short_reason(tmp_path, name, reason):
    data = GOOD[name][0]
    path = tmp_path / "cut"
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(BadImage) as caught:
        inspect_image(path)
    assert caught.value.reason.startswith(reason)
    assert str(caught.value) == f"{path}: {caught.value.reason}"
    assert isinstance(caught.value, ImageError)
    assert image_problem(path).startswith(reason)


def test_missing_empty_directory_and_not_an_image(tmp_path):
    assert image_problem(tmp_path / "nope.jpg") == "file not found"
    assert image_problem(tmp_path) == "is a directory, not a file"
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    assert image_problem(empty) == "empty file (0 bytes)"
    text = tmp_path / "text.png"
    text.write_text("this is not a picture at all\n")
    assert image_problem(text) == "not an image: unknown signature 74 68 69 73 20 69 73 20"
    short = tmp_path / "short.jpg"
    short.write_bytes(b"\x00\x01\x02")
    assert image_problem(short) == "too short to be an image (3 bytes)"
    riff = tmp_path / "sound.webp"
    riff.write_bytes(b"RIFF" + struct.pack("<I", 4) + b"WAVE")
    assert image_problem(riff) == "truncated WebP: incomplete RIFF header"
    riff.write_bytes(b"RIFF" + struct.pack("<I", 8) + b"WAVEfmt ")
    assert image_problem(riff) == "not an image: RIFF file of type 'WAVE', not WebP"


def test_structural_corruption_without_truncation():
    png = bytearray(GOOD["png"][0])
    png[50] ^= 0xFF  # inside the first IDAT: its CRC no longer matches
    with pytest.raises(Exception, match="corrupt PNG: bad CRC in chunk 'IDAT'"):
        inspect_bytes(bytes(png))
    # A JPEG whose scan starts before any frame header.
    with pytest.raises(Exception, match=r"no frame header \(SOF\)"):
        inspect_bytes(b"\xff\xd8\xff\xda\x00\x02\x00\xff\xd9")
    with pytest.raises(Exception, match="end-of-image marker before any scan"):
        inspect_bytes(b"\xff\xd8\xff\xd9")
    # GIF header and trailer with no image between them.
    gif = b"GIF89a" + struct.pack("<HHBBB", 4, 4, 0, 0, 0) + b"\x3b"
    with pytest.raises(Exception, match="corrupt GIF: no image in the file"):
        inspect_bytes(gif)


def test_a_header_declaring_no_pixels_is_bad():
    header = struct.pack(">IIBBBBB", 0, 5, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + header + struct.pack(">I", zlib.crc32(b"IHDR" + header))
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    idat_body = zlib.compress(b"")
    idat = struct.pack(">I", len(idat_body)) + b"IDAT" + idat_body + struct.pack(">I", zlib.crc32(b"IDAT" + idat_body))
    with pytest.raises(Exception, match="png header declares a 0x5 image"):
        inspect_bytes(b"\x89PNG\r\n\x1a\n" + chunk + idat + end)


def test_pixel_limit_reason(tmp_path):
    path = tmp_path / "big.png"
    path.write_bytes(GOOD["png"][0])
    assert image_problem(path, max_pixels=100) == f"{WIDTH}x{HEIGHT} = {WIDTH * HEIGHT:,} pixels is over max_image_pixels 100"


def test_trailing_bytes_after_the_image_are_tolerated():
    # Cameras and editors append data after EOI; decoders ignore it, so must we.
    assert inspect_bytes(GOOD["jpeg"][0] + b"trailing metadata").format == "jpeg"
