"""evaluate --save-txt: the caption file beside each image, and what happens to one already there.

Standard library only. Every existing caption is looked at before the model
loads, so a refusal or an unreadable file stops the run before anything is written.
"""

from __future__ import annotations

import os

from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.captions import (DEFAULT_EXTENSION, DEFAULT_SEPARATOR, CaptionError, append_caption,
                                   caption_extension, caption_separator, format_caption, read_caption)
from deepdanbooru.errors import file_field
from deepdanbooru.inference.targets import sidecar_path
from deepdanbooru.wording import plural

@dataclass(frozen=True)
class CaptionOptions:
    extension: str = DEFAULT_EXTENSION
    overwrite: bool = False  # replace caption files already there
    append: bool = False  # add the new tags to caption files already there
    remove_underscore: bool = False  # write 'long hair' for long_hair
    separator: str = DEFAULT_SEPARATOR  # the string between tags

    def check(self, save_txt: bool) -> "CaptionOptions":
        """The options with the extension normalised; refuses those that mean nothing here."""
        given = [name for name, on in (("--overwrite", self.overwrite), ("--append", self.append),
                                       ("--remove-underscore", self.remove_underscore),
                                       ("--caption-extension", self.extension != DEFAULT_EXTENSION),
                                       ("--caption-separator", self.separator != DEFAULT_SEPARATOR)) if on]
        if given and not save_txt:
            raise CaptionError(f"{', '.join(given)}: only used with --save-txt")
        if self.overwrite and self.append:
            raise CaptionError("--overwrite and --append: give one (replace the caption files, or add to them)")
        return CaptionOptions(caption_extension(self.extension), self.overwrite, self.append, self.remove_underscore,
                              caption_separator(self.separator))


def existing_captions(images, options: CaptionOptions) -> dict[Path, str]:
    """The text of each caption file already there that --append will add to ({} without --append).

    Without --overwrite or --append an existing caption, which may be
    hand-written, is never replaced: the run is refused before it starts.
    So is a run where two images would write one caption file.
    """
    existing: dict[Path, str] = {}
    refused = []
    claimed: dict[str, Path] = {}
    for image in images:
        path = sidecar_path(image, options.extension)
        if path == Path(image):
            raise CaptionError(f"{image}: --save-txt would overwrite the image itself with its tags")
        # a.png and a.jpg: one caption file, which a trainer would read for both (however the paths are given).
        key = os.path.normcase(os.path.abspath(path))
        if key in claimed:
            raise CaptionError(file_field(path, None, (
                f"the caption of both {claimed[key]} and {image} (a caption is named after its image without the "
                "extension); rename one of them")))
        claimed[key] = Path(image)
        if not path.exists():
            continue
        if not path.is_file():
            raise CaptionError(file_field(path, None, "is in the way of the caption file and is not a file"))
        if options.append:
            existing[path] = read_caption(path)
        elif not options.overwrite:
            refused.append(path)
    if refused:
        more = f" (and {plural(len(refused) - 1, 'other')})" if len(refused) > 1 else ""
        raise CaptionError(file_field(refused[0], None, f"already exists{more}; --overwrite replaces caption files, "
                                      "--append adds the new tags to them"))
    return existing


def caption_text(tags, existing: str | None = None, remove_underscore: bool = False,
                 separator: str = DEFAULT_SEPARATOR) -> str:
    """'tag1, tag2'; appended to `existing` without the tags it already holds (in any spelling).

    Written and read with the one caption grammar of deepdanbooru.captions, which import-images reads with.
    """
    if existing is None:
        return format_caption(tags, remove_underscore, separator)
    return append_caption(existing, tags, remove_underscore, separator)
