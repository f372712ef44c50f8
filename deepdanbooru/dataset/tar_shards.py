"""import-images from tar shards in the WebDataset layout. Standard library and Pillow only.

A shard's members that share a key (the member's path up to the first dot of its file name: `0001.jpg`,
`0001.json`, `0001.txt`) make one sample, and a sample's members stand next to each other, as WebDataset
writes and reads them; so a shard is read as one stream, one sample at a time, and any size of shard is
imported in the memory of one sample. A sample with a picture and a Danbooru post object (`.json`) or a
caption (`.txt`, or the --caption-extension) becomes a post, the picture stored under the MD5 of its bytes as
a picture from a folder is.
"""

from __future__ import annotations

import json
import os
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.captions import parse_caption
from deepdanbooru.dataset.build import with_rating_tag
from deepdanbooru.dataset.post_files import ReadSummary, post_row, short_reason
from deepdanbooru.errors import DatasetError, file_field

POST_EXTENSION = "json"
COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")
_END_BLOCKS = b"\0" * 1024  # the two zero blocks that end a tar archive


def is_shard(path: Path) -> bool:
    return path.is_file() and (path.suffix.lower() == ".tar" or path.name.lower().endswith((".tar.gz", ".tgz")))


def find_shards(sources, extensions, warn, skip=()) -> list[Path]:
    """The shards SRC names: each .tar file given, and the .tar files in each folder given (sorted, recursively).

    [] when SRC is one folder holding pictures (read as before; shards beside them are named and left alone). A
    file given that is not a shard, or a folder without shards among several SRC, is refused with one line.
    skip: folders not searched (the dataset being written, which may live inside SRC: its pictures are not SRC's).
    """
    sources = [Path(source) for source in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    shards = []
    for source in sources:
        if source.is_file():
            if not is_shard(source):
                raise DatasetError(file_field(source, None, "is a file but not a .tar shard; SRC is a folder of "
                                                            "pictures, or .tar shards (or folders of them)"))
            shards.append(source)
        elif source.is_dir():
            found, pictures = _walk(source, extensions, skip)
            if pictures and len(sources) == 1:
                if found:
                    warn(f"note: {source}: holds pictures, read as a folder of pictures; its "
                         f"{len(found)} .tar shard(s) are not read (give them as SRC on their own)")
                return []
            if not found and len(sources) > 1:
                raise DatasetError(file_field(source, None, "holds no .tar shards; several SRC are read as shards "
                                                            "(import a folder of pictures on its own)"))
            shards.extend(found)
        elif len(sources) > 1:
            raise DatasetError(file_field(source, None, "not found"))
    return shards


def _walk(folder: Path, extensions, skip=()) -> tuple[list[Path], bool]:
    """(the shards under folder in name order, whether it holds a picture); hidden entries and `skip` skipped."""
    shards, pictures = [], False
    skipped = {Path(path).resolve() for path in skip}
    for directory, folders, files in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith(".")
                            and Path(directory, name).resolve() not in skipped)
        for name in files:
            path = Path(directory, name)
            if name.startswith("."):
                continue
            if is_shard(path):
                shards.append(path)
            elif path.suffix.lower().lstrip(".") in extensions:
                pictures = True
    return sorted(shards, key=lambda path: path.relative_to(folder).as_posix()), pictures


def split_key(name: str) -> tuple[str, str]:
    """(key, extension) as WebDataset splits a member name: at the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (extension.lower() if dot else "")


@dataclass
class Sample:
    shard: Path
    key: str
    members: dict = field(default_factory=dict)  # extension -> (member name, bytes)

    def where(self, extension: str) -> str:
        return f"{self.shard}:{self.members[extension][0]}"


def samples(shard: Path, extensions, caption_ext: str, problems: list, skip=()):
    """Yield the Samples of one shard in order; a shard that cannot be opened, is truncated or is damaged is
    named in `problems` (with the last good member) and what came before it is yielded. Members with an extension
    in `skip` are kept without their bytes (b"")."""
    wanted = set(extensions) | {POST_EXTENSION, caption_ext}
    current, last_good = None, None
    try:
        with open(shard, "rb") as raw:
            compressed = raw.read(6).startswith(COMPRESSED_MAGIC)
            raw.seek(0)
            with tarfile.open(fileobj=raw, mode="r|*") as archive:
                for member in archive:
                    name = member.name
                    if member.isdir():
                        continue
                    key, extension = split_key(name)
                    if current is not None and key != current.key:
                        yield current
                        current = None
                    if extension not in wanted or Path(name).name.startswith("."):
                        last_good = name
                        continue
                    if not member.isfile():
                        problems.append((f"{shard}:{name}", "is a link or a device, not a file; skipped"))
                        last_good = name
                        continue
                    data = b"" if extension in skip else archive.extractfile(member).read()
                    if current is None:
                        current = Sample(shard, key)
                    current.members.setdefault(extension, (name, data))
                    last_good = name
                end = archive.offset
            if not compressed and not _ends_cleanly(raw, end):
                raise tarfile.ReadError("no end-of-archive blocks after it")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        after = f"after member {last_good}" if last_good else "before its first member"
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        problems.append((str(shard), f"is truncated or damaged {after} ({reason}); the samples before it are "
                                     "imported"))
    if current is not None:
        yield current


def _ends_cleanly(raw, offset: int) -> bool:
    """Whether the two zero blocks of a complete archive follow its last member (a cut file lacks them)."""
    raw.seek(offset)
    return raw.read(len(_END_BLOCKS)) == _END_BLOCKS


def sample_tags(sample: Sample, caption_ext: str, separator: str) -> tuple[list[str] | None, str, int | None]:
    """(tags, where, general tags) from the sample's post object, else its caption; tags None with the reason
    when neither can be read; general tags None where a caption does not tell them apart."""
    if POST_EXTENSION in sample.members:
        where = sample.where(POST_EXTENSION)
        try:
            post = json.loads(sample.members[POST_EXTENSION][1])
        except ValueError as error:
            return None, f"{where}: not a JSON post object ({short_reason(error)})", None
        try:
            row = post_row(_with_file_ext(post), where, None, ReadSummary())
        except DatasetError as error:
            return None, str(error), None
        tag_string, general = row[3], row[4]
        if not isinstance(tag_string, str):
            return None, f"{where}: tag_string is not text", None
        tag_string, _ = with_rating_tag(tag_string, row[5])
        tags = list(dict.fromkeys(tag_string.split()))
        return tags, where, general if isinstance(general, int) and not isinstance(general, bool) else None
    text, where = caption_text(sample, caption_ext)
    return (None if text is None else parse_caption(text, separator)), where, None


def caption_text(sample: Sample, caption_ext: str) -> tuple[str | None, str]:
    """(the caption's text, where it is), or (None, why it cannot be read)."""
    where = sample.where(caption_ext)
    try:
        return sample.members[caption_ext][1].decode("utf-8-sig"), where
    except UnicodeDecodeError as error:
        return None, f"{where}: is not UTF-8 text (byte at offset {error.start})"


def read_captions(shards, extensions, caption_ext: str, separator: str, tally) -> None:
    """A first pass over the captions collect will read (a caption beside a picture and no post object), the
    pictures' bytes passed over: each caption goes to tally(name, text, tags, mark) until it returns True (the
    separator's mark found). Problems are left for collect to name."""
    caption_ext = caption_ext.lstrip(".").lower()
    extensions, mark = tuple(extensions), separator.strip()
    for shard in shards:
        for sample in samples(shard, extensions, caption_ext, [], skip=extensions):
            members = sample.members
            has_picture = any(ext in members for ext in extensions)
            if not has_picture or POST_EXTENSION in members or caption_ext not in members:
                continue
            text, _ = caption_text(sample, caption_ext)
            if text is not None and tally(f"{shard.name}:{members[caption_ext][0]}", text,
                                          parse_caption(text, separator), mark):
                return


def _with_file_ext(post):
    """The picture decides file_ext; a post object need not carry it."""
    return {**post, "file_ext": post.get("file_ext", "")} if isinstance(post, dict) else post


def collect(shards, intake, caption_ext: str, separator: str, extensions):
    """(rows to insert, (post id, new values) for known pictures whose tags changed), as import_images._collect
    gives for a folder, through the same intake (dataset.intake.Intake), so a picture and its tags are judged
    exactly as from a folder; problems are added to intake.summary and the rest is imported.
    """
    summary = intake.summary
    caption_ext = caption_ext.lstrip(".").lower()
    extensions = tuple(extensions)
    for shard in shards:
        for sample in samples(shard, extensions, caption_ext, summary.malformed):
            picture = next((ext for ext in sample.members if ext in extensions), None)
            has_text = POST_EXTENSION in sample.members or caption_ext in sample.members
            if picture is None:
                names = ", ".join(name for name, _ in sample.members.values())
                summary.untagged.append((f"{shard}:{names}", "no picture beside it"))
                continue
            where = sample.where(picture)
            if not has_text:
                summary.untagged.append((where, f"no .{POST_EXTENSION} post object or .{caption_ext} caption beside "
                                                "it"))
                continue
            tags, source, general = sample_tags(sample, caption_ext, separator)
            if tags is None:
                summary.malformed.append(tuple(source.split(": ", 1)))
                continue
            if not tags:
                summary.untagged.append((where, f"{source[len(str(shard)) + 1:]} holds no tags"))
                continue
            values = intake.post_values(tags)
            if general is not None:  # the post object's own count of general tags
                values["tag_count_general"] = general
            intake.add(where, sample.members[picture][1], tags, values, where)
    return intake.finish()
