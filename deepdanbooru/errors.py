"""User-facing errors.

Each is raised where the problem is detected, carries one line that names the
file and the field or row, and is turned into a message and an exit code in
exactly one place (cli.py).
"""

import re

from deepdanbooru import exitcodes


class UserError(Exception):
    """A problem with the user's input; printed as one line, exit code exitcodes.USAGE."""

    exit_code = exitcodes.USAGE


class ConfigError(UserError):
    """project.json is missing, unreadable or holds an invalid value.

    problems: each problem's own line, when one message names several (preflight lists them all).
    """

    def __init__(self, message, problems=()):
        super().__init__(message)
        self.problems = tuple(problems) or (message,)


class TagsError(UserError):
    """tags.txt is missing, empty or has duplicates."""


class DatasetError(UserError):
    """The SQLite database or the images folder is unusable."""


class ImageError(UserError):
    """An image cannot be read or decoded."""


class ModelError(UserError):
    """A model name, model file or model shape is unusable."""


class TrainingError(UserError):
    """Training cannot start or cannot go on (empty data, non-finite loss, lock held)."""


class DependencyError(UserError):
    """An installed package is not a version deepdanbooru works with."""


class NetworkError(UserError):
    """A server could not be reached, refused the credentials or answered something unusable."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with one line on where the command stopped and how to go on; exit code 130 (128 + SIGINT)."""


def file_field(path, field, message):
    """Format the one-line message every error shares: `FILE: FIELD: message`."""
    if field:
        return f"{path}: {field}: {message}"
    return f"{path}: {message}"


SMALLER_BATCH = "use a smaller batch (--batch-size, or minibatch_size in project.json) or image size"


def system_error_line(error: BaseException) -> str:
    """One line for what the operating system refused: `FILE: Permission denied`, `OLD -> NEW: ...`."""
    if isinstance(error, MemoryError):
        return f"out of memory; {SMALLER_BATCH}"
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    first, second = getattr(error, "filename", None), getattr(error, "filename2", None)
    where = f"{first} -> {second}: " if first and second else f"{first}: " if first else ""
    return f"{where}{reason}"


def tf_message_text(error) -> str:
    """A TensorFlow error's message on one line, without its function-node prefixes (`{{function_node ...}}`) and
    the eager op's name at its end (`[Op:ExtractJpegShape] name:`). Plain text: this module never imports TF."""
    text = re.sub(r"\{\{[^}]*\}\}", "", str(getattr(error, "message", error)))
    text = re.sub(r"\s*\[Op:[^\]]*\]( name:\s*\S*)?\s*$", "", text)
    return " ".join(text.split())


def out_of_memory_line(error: BaseException) -> str | None:
    """One line for TensorFlow's out-of-memory error (a batch or picture too large), else None.

    Checked by the class name of TensorFlow's error, so this module never imports TensorFlow.
    """
    if type(error).__name__ != "ResourceExhaustedError" or "tensorflow" not in type(error).__module__:
        return None
    shown = tf_message_text(error).split(" [[")[0].split(" on /job:")[0][:160]
    return f"out of memory ({shown}); {SMALLER_BATCH}"


def json_error_text(error) -> str:
    """A json.JSONDecodeError as one clause: 'invalid JSON at line L column C: ...', naming a trailing comma (the
    commonest hand edit that breaks a file: a comma left after the last entry) as such."""
    text, position = error.doc, error.pos
    before = position - 1
    while before >= 0 and text[before] in " \t\r\n":
        before -= 1
    closing = text[position] if 0 <= position < len(text) else ""
    if before >= 0 and text[before] == "," and closing in "}]" and closing:
        line = text.count("\n", 0, before) + 1
        column = before - (text.rfind("\n", 0, before) + 1) + 1
        what = "entry of an object" if closing == "}" else "item of a list"
        return (f"invalid JSON at line {line} column {column}: a trailing comma after the last {what} (before the "
                f"'{closing}' at line {error.lineno}); JSON allows no comma there, delete it")
    return f"invalid JSON at line {error.lineno} column {error.colno}: {error.msg}"
