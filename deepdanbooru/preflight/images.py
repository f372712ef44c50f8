"""Is this file a whole image, and how big is it? Answered from its bytes, without decoding.

Standard library only, so preflight works where TensorFlow and Pillow are
missing. Each parser walks the container structure far enough to see that
the file is complete (JPEG end marker after the scan, PNG chunks up to IEND
with their CRCs, GIF blocks up to the trailer, the BMP pixel array, WebP RIFF
chunks) and reads the pixel size from the header. The format comes from the
signature, never from the file name.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ImageError


@dataclass(frozen=True)
class ImageInfo:
    format: str  # jpeg, png, gif, bmp, webp
    width: int
    height: int
    animated: bool = False
    has_alpha: bool = False

    @property
    def pixels(self) -> int:
        return self.width * self.height


class BadImage(ImageError):
    """The file is missing, empty, truncated, corrupt or not an image; `reason` is short, without the path."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


class _Bad(Exception):
    """Raised by the parsers with a reason; inspect_image adds the path."""



def inspect_image(path) -> ImageInfo:
    """The image's format and size from its header, or BadImage with a short reason."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadImage(path, "file not found") from None
    except IsADirectoryError:
        raise BadImage(path, "is a directory, not a file") from None
    except OSError as error:
        raise BadImage(path, f"cannot be read: {error.strerror or error}") from None
    try:
        return inspect_bytes(data)
    except _Bad as error:
        raise BadImage(path, str(error)) from None


def image_problem(path, max_pixels: int | None = None) -> str | None:
    """None for a good image, else the short reason (for logs that explain a dropped record)."""
    try:
        info = inspect_image(path)
    except BadImage as error:
        return error.reason
    if max_pixels is not None and info.pixels > max_pixels:
        return too_large(info, max_pixels)
    return None


def too_large(info: ImageInfo, max_pixels: int) -> str:
    return f"{info.width}x{info.height} = {info.pixels:,} pixels is over max_image_pixels {max_pixels:,}"


def inspect_bytes(data: bytes) -> ImageInfo:
    if not data:
        raise _Bad("empty file (0 bytes)")
    for signature, parse in _SIGNATURES:
        if data.startswith(signature):
            info = parse(data)
            if info.width <= 0 or info.height <= 0:
                raise _Bad(f"{info.format} header declares a {info.width}x{info.height} image")
            return info
    if len(data) < 12:
        raise _Bad(f"too short to be an image ({len(data)} bytes)")
    raise _Bad(f"not an image: unknown signature {data[:8].hex(' ')}")


# --- JPEG ---------------------------------------------------------------------

# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM and RSTn have no length field


def _jpeg(data: bytes) -> ImageInfo:
    size = None
    position = 2
    end = len(data)
    while True:
        if position >= end:
            raise _Bad("truncated JPEG: ends before the image data")
        if data[position] != 0xFF:
            raise _Bad(f"corrupt JPEG: expected a marker at byte {position}")
        while position < end and data[position] == 0xFF:  # fill bytes
            position += 1
        if position >= end:
            raise _Bad("truncated JPEG: ends inside a marker")
        marker = data[position]
        position += 1
        if marker in _STANDALONE:
            continue
        if marker == 0xD9:
            raise _Bad("corrupt JPEG: end-of-image marker before any scan")
        if position + 2 > end:
            raise _Bad("truncated JPEG: ends inside a segment header")
        (length,) = struct.unpack_from(">H", data, position)
        if length < 2 or position + length > end:
            raise _Bad(f"truncated JPEG: segment 0xFF{marker:02X} runs past the end of the file")
        if marker in _SOF:
            if length < 8:
                raise _Bad("corrupt JPEG: frame header too short")
            height, width = struct.unpack_from(">HH", data, position + 3)
            size = (width, height)
        position += length
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            break
    if size is None:
        raise _Bad("corrupt JPEG: no frame header (SOF) before the scan")
    # 0xFF inside entropy-coded data is always stuffed as FF 00, so FF D9 can only be the end marker.
    if data.find(b"\xff\xd9", position) < 0:
        raise _Bad("truncated JPEG: no end-of-image marker")
    return ImageInfo("jpeg", size[0], size[1])


# --- PNG ----------------------------------------------------------------------

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png(data: bytes) -> ImageInfo:
    position = len(_PNG_SIGNATURE)
    end = len(data)
    header = None
    animated = has_alpha = seen_data = False
    while True:
        if position + 8 > end:
            raise _Bad("truncated PNG: no IEND chunk")
        length, kind = struct.unpack_from(">I4s", data, position)
        body = position + 8
        if body + length + 4 > end:
            raise _Bad(f"truncated PNG: chunk {kind.decode('latin-1')!r} runs past the end of the file")
        (crc,) = struct.unpack_from(">I", data, body + length)
        if zlib.crc32(data[position + 4: body + length]) != crc:
            raise _Bad(f"corrupt PNG: bad CRC in chunk {kind.decode('latin-1')!r}")
        if header is None:
            if kind != b"IHDR" or length != 13:
                raise _Bad("corrupt PNG: the first chunk is not IHDR")
            width, height, _, colour_type = struct.unpack_from(">IIBB", data, body)
            header = (width, height)
            has_alpha = colour_type in (4, 6)
        elif kind == b"tRNS":
            has_alpha = True
        elif kind == b"acTL":
            animated = True
        elif kind == b"IDAT":
            seen_data = True
        elif kind == b"IEND":
            break
        position = body + length + 4
    if not seen_data:
        raise _Bad("corrupt PNG: no image data (IDAT)")
    return ImageInfo("png", header[0], header[1], animated=animated, has_alpha=has_alpha)


# --- GIF ----------------------------------------------------------------------


def _gif(data: bytes) -> ImageInfo:
    end = len(data)
    if end < 13:
        raise _Bad("truncated GIF: incomplete header")
    width, height, flags = struct.unpack_from("<HHB", data, 6)
    position = 13
    if flags & 0x80:
        position += 3 << ((flags & 0x07) + 1)
    frames = 0
    while True:
        if position >= end:
            raise _Bad("truncated GIF: no trailer")
        block = data[position]
        if block == 0x3B:
            break
        if block == 0x21:  # extension: label, then sub-blocks
            position = _skip_sub_blocks(data, position + 2)
        elif block == 0x2C:  # image descriptor, optional local colour table, LZW code size, sub-blocks
            if position + 10 > end:
                raise _Bad("truncated GIF: incomplete image descriptor")
            local = data[position + 9]
            position += 10
            if local & 0x80:
                position += 3 << ((local & 0x07) + 1)
            position = _skip_sub_blocks(data, position + 1)
            frames += 1
        else:
            raise _Bad(f"corrupt GIF: unknown block 0x{block:02X} at byte {position}")
    if frames == 0:
        raise _Bad("corrupt GIF: no image in the file")
    return ImageInfo("gif", width, height, animated=frames > 1)


def _skip_sub_blocks(data: bytes, position: int) -> int:
    end = len(data)
    while True:
        if position >= end:
            raise _Bad("truncated GIF: ends inside a data block")
        length = data[position]
        position += 1 + length
        if length == 0:
            return position


# --- BMP ----------------------------------------------------------------------

_BI_RGB, _BI_BITFIELDS, _BI_ALPHABITFIELDS = 0, 3, 6


def _bmp(data: bytes) -> ImageInfo:
    end = len(data)
    if end < 26:
        raise _Bad("truncated BMP: incomplete header")
    (offset,) = struct.unpack_from("<I", data, 10)
    (header_size,) = struct.unpack_from("<I", data, 14)
    if header_size == 12:  # OS/2 BITMAPCOREHEADER
        width, height, _, bits = struct.unpack_from("<HHHH", data, 18)
        compression = _BI_RGB
    elif header_size >= 40:
        if end < 14 + 40:
            raise _Bad("truncated BMP: incomplete header")
        width, height, _, bits, compression = struct.unpack_from("<iiHHI", data, 18)
    else:
        raise _Bad(f"corrupt BMP: unknown header size {header_size}")
    height = abs(height)  # negative means rows stored top-down
    if offset < 14 + header_size or offset > end:
        raise _Bad(f"truncated BMP: pixel data offset {offset} is outside the file")
    if compression in (_BI_RGB, _BI_BITFIELDS, _BI_ALPHABITFIELDS):
        if bits not in (1, 2, 4, 8, 16, 24, 32):
            raise _Bad(f"corrupt BMP: {bits} bits per pixel")
        row = (bits * width + 31) // 32 * 4
        needed = offset + row * height
        if needed > end:
            raise _Bad(f"truncated BMP: {end} bytes, the pixel array needs {needed}")
    return ImageInfo("bmp", width, height, has_alpha=compression == _BI_ALPHABITFIELDS)


# --- WebP ---------------------------------------------------------------------


def _webp(data: bytes) -> ImageInfo:
    end = len(data)
    if end < 16:
        raise _Bad("truncated WebP: incomplete RIFF header")
    if data[8:12] != b"WEBP":
        raise _Bad(f"not an image: RIFF file of type {data[8:12].decode('latin-1')!r}, not WebP")
    (riff_size,) = struct.unpack_from("<I", data, 4)
    if 8 + riff_size > end:
        raise _Bad(f"truncated WebP: RIFF declares {8 + riff_size} bytes, the file has {end}")
    end = 8 + riff_size  # bytes after the RIFF payload are not part of the image
    view = memoryview(data)  # chunk slices without copying the image data
    chunks = {}
    position = 12
    while position + 8 <= end:
        kind, length = struct.unpack_from("<4sI", data, position)
        body = position + 8
        if body + length > end:
            raise _Bad(f"truncated WebP: chunk {kind.decode('latin-1')!r} runs past the end of the file")
        chunks.setdefault(kind, view[body: body + length])
        position = body + length + (length & 1)  # chunks are padded to even length
    if not chunks:
        raise _Bad("truncated WebP: no chunks")
    first = next(iter(chunks))
    if first == b"VP8X":
        return _webp_extended(chunks)
    if first == b"VP8 ":
        width, height = _vp8_size(chunks[first])
        return ImageInfo("webp", width, height)
    if first == b"VP8L":
        width, height, alpha = _vp8l_size(chunks[first])
        return ImageInfo("webp", width, height, has_alpha=alpha)
    raise _Bad(f"corrupt WebP: unexpected first chunk {first.decode('latin-1')!r}")


def _webp_extended(chunks: dict) -> ImageInfo:
    header = chunks[b"VP8X"]
    if len(header) < 10:
        raise _Bad("corrupt WebP: VP8X chunk too short")
    flags = header[0]
    width = 1 + int.from_bytes(header[4:7], "little")
    height = 1 + int.from_bytes(header[7:10], "little")
    animated = bool(flags & 0x02)
    if animated:
        if b"ANMF" not in chunks:
            raise _Bad("corrupt WebP: animated, but holds no frame")
    elif b"VP8 " in chunks:
        _vp8_size(chunks[b"VP8 "])
    elif b"VP8L" in chunks:
        _vp8l_size(chunks[b"VP8L"])
    else:
        raise _Bad("corrupt WebP: no image data (VP8 or VP8L chunk)")
    return ImageInfo("webp", width, height, animated=animated, has_alpha=bool(flags & 0x10))


def _vp8_size(chunk: bytes) -> tuple[int, int]:
    # 3-byte frame tag, start code 9D 01 2A, then 14-bit width and height.
    if len(chunk) < 10 or chunk[3:6] != b"\x9d\x01\x2a":
        raise _Bad("corrupt WebP: bad VP8 frame header")
    width, height = struct.unpack_from("<HH", chunk, 6)
    return width & 0x3FFF, height & 0x3FFF


def _vp8l_size(chunk: bytes) -> tuple[int, int, bool]:
    # Signature 0x2F, then width-1 and height-1 in 14 bits each and an alpha hint bit.
    if len(chunk) < 5 or chunk[0] != 0x2F:
        raise _Bad("corrupt WebP: bad VP8L header")
    (bits,) = struct.unpack_from("<I", chunk, 1)
    return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF), bool((bits >> 28) & 1)


_SIGNATURES = (
    (b"\xff\xd8\xff", _jpeg),
    (_PNG_SIGNATURE, _png),
    (b"GIF87a", _gif),
    (b"GIF89a", _gif),
    (b"BM", _bmp),
    (b"RIFF", _webp),
)
