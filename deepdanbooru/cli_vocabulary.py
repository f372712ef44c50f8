"""The names of the command line: one option name per concept, DeepDanbooru 1.0's where it has one;
older spellings as hidden aliases; command suggestions.

VOCABULARY is the table docs/cli.md shows (rendered by `python -m
deepdanbooru.cli_reference > docs/cli.md`) and a test walks every command's
options against it. An alias is a hidden option (`Alias`) that `VocabularyCommand`
folds into its canonical parameter after parsing, so the command's function only
ever sees the canonical name, whatever the version of click.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import click
from click.core import ParameterSource


@dataclass(frozen=True)
class Term:
    name: str  # the canonical option, as --help shows it
    meaning: str
    aliases: tuple[str, ...] = ()  # older spellings, hidden, still accepted
    deepdanbooru: bool = False  # DeepDanbooru 1.0 uses this name


VOCABULARY: tuple[Term, ...] = (
    # Files and folders.
    Term("--project-path", "the project folder (commands that always act on a project show it as their first "
                           "argument PROJECT_PATH, as in DeepDanbooru, and accept --project-path too)",
         deepdanbooru=True),
    Term("--model-path", "a model file (.keras, or DeepDanbooru .h5) to use instead of the project's export",
         ("--model",), deepdanbooru=True),
    Term("--tags-path", "the tags.txt of the model given with --model-path", deepdanbooru=True),
    Term("--source-model", "the model whose structure and weights training starts from", deepdanbooru=True),
    Term("--save-path", "where the command writes its result (a file, or a folder for grad-cam's pictures)",
         ("--output",), deepdanbooru=True),
    Term("--thresholds-csv", "per-tag thresholds written by training"),
    Term("--database", "the dataset's SQLite file (project.json's database_path)"),
    Term("--channel-order", "the channel order (rgb or bgr) an imported checkpoint's weights expect"),
    Term("--sample-image", "an image to also compare on (repeatable)"),
    # What is written and how.
    Term("--overwrite", "replace files that already exist", ("--force",), deepdanbooru=True),
    Term("--format", "the format of what the command prints or writes (printed results: text, json, csv)",
         ("--json",)),
    Term("--save-txt", "write each image's tags beside it as <image name>.txt", deepdanbooru=True),
    Term("--caption-extension", "the extension of the caption files beside the images (.txt, .caption)"),
    Term("--caption-separator", "the string between tags in caption files (kohya's option)"),
    Term("--append", "add to the files that already exist, keeping what they hold"),
    Term("--remove-underscore", "write tags with spaces (long hair), as captions for image generators spell them"),
    Term("--vacuum", "run VACUUM on the database written", deepdanbooru=True),
    Term("--link", "hard-link images instead of copying them"),
    Term("--group-duplicates", "give identical or near-identical pictures one split_id"),
    # Which inputs.
    Term("--allow-folder", "accept folders as targets", deepdanbooru=True),
    Term("--allow-trained", "replace a tags.txt that the project's checkpoints or exported models were trained "
                            "with"),
    Term("--folder-filters", "file-name patterns of the images in folders", deepdanbooru=True),
    Term("--extensions", "image file extensions to pick up"),
    Term("--start-id", "first post id", deepdanbooru=True),
    Term("--end-id", "last post id", deepdanbooru=True),
    Term("--use-deleted", "also use posts marked deleted", deepdanbooru=True),
    Term("--split", "which records to measure: the validation split or all"),
    Term("--alpha", "what becomes of a picture's transparency: composited onto white, or dropped"),
    Term("--padding", "what surrounds a picture not of the model's proportions: its edge pixels, or white "
                      "(project.json's padding)"),
    Term("--minimum-post-count", "least posts a tag must occur in", ("--min-count",), deepdanbooru=True),
    Term("--limit", "most tags", deepdanbooru=True),
    Term("--system-tags", "keep the rating:* system tags (--no-system-tags drops them)"),
    Term("--include-paid-tags", "keep tags whose posts only paid accounts can see"),
    # Scoring.
    Term("--threshold", "report a tag when its score is at least this", deepdanbooru=True),
    Term("--general-threshold", "the threshold of the general tags"),
    Term("--character-threshold", "the threshold of the character tags"),
    Term("--undesired-tags", "tags never reported"),
    Term("--order-by-score", "list tags highest score first"),
    Term("--metrics", "measure the model on the project's labelled records instead of tagging"),
    Term("--batch-size", "images per model call"),
    # Where and how it runs.
    Term("--allow-gpu", "use a visible GPU (hidden by default, as in DeepDanbooru)", deepdanbooru=True),
    Term("--compile", "run the model as a traced graph (--no-compile: eagerly)", deepdanbooru=True),
    Term("--source-tags", "the tags.txt the source model was trained on (DeepDanbooru models record none)"),
    Term("--devices", "the local devices to train on"),
    Term("--workers", "how many processes share the work"),
    Term("--verify", "check what was written (every record's checksum) instead of writing"),
    Term("--time-limit", "stop at the last checkpoint before this much wall-clock time, export, exit 0"),
    Term("--force-mixed-precision", "train in float16 even without a GPU"),
    Term("--verbose", "print progress and throughput on stderr", deepdanbooru=True),
    Term("--port", "the port a data-service server listens on"),
    Term("--dispatcher", "the data-service dispatcher a worker serves (HOST:PORT)"),
    Term("--host", "the name or address other hosts reach this one by"),
    Term("--debug", "show full tracebacks (before the command: deepdanbooru --debug COMMAND)"),
    # The audit.
    Term("--folds", "how many folds: models each trained on the others, scoring the one they did not see"),
    Term("--top", "keep the N first suggestions"),
    Term("--min-probability", "keep the suggestions whose estimated probability of being a mistake is at least P"),
    Term("--apply", "apply the rows of a file (audit.csv's format) to the posts"),
    Term("--dry-run", "print what would change, change nothing"),
    Term("--captions", "the folder of pictures and caption files a dataset was imported from"),
    # Conversion.
    Term("--optimize-default", "TFLite Optimize.DEFAULT", deepdanbooru=True),
    Term("--optimize-experimental-sparsity", "TFLite Optimize.EXPERIMENTAL_SPARSITY", deepdanbooru=True),
    Term("--tolerance", "largest accepted output difference from Keras"),
    # Danbooru.
    Term("--username", "Danbooru user name", deepdanbooru=True),
    Term("--api-key", "Danbooru API key", deepdanbooru=True),
    Term("--chunk-size", "posts read and written per step", deepdanbooru=True),
    Term("--base-url", "the Danbooru server"),
    # Preflight.
    Term("--max-image-checks", "how many images preflight opens"),
    Term("--check-packages", "check the installed package versions"),
    Term("--probe-imports", "import each runtime package in a child process"),
    Term("--probe-tensorflow", "run TensorFlow in a child process"),
    Term("--check-duplicates", "read every image for duplicates across the validation split"),
    # Sizes and the sample.
    Term("--width", "input width in pixels"),
    Term("--height", "input height in pixels"),
    Term("--tags", "number of output tags"),
    Term("--count", "number of posts"),
    Term("--size", "image side in pixels"),
    Term("--seed", "the random seed"),
    Term("--preset", "which synthetic dataset: the sample's basic tags or the hard long-tailed set"),
    Term("--recipe", "the project.json values a new project starts from (DeepDanbooru's, modern, or finetune "
                     "for a --source-model start)"),
    Term("--version", "print the version"),
    Term("--help", "print the command's help (also -h)"),
)
TERMS = {term.name: term for term in VOCABULARY}


class Alias(click.Option):
    """A hidden older spelling of the option whose parameter is `target`.

    `value` is what the alias means for a flag (--json: the format "json"); an alias that takes a
    value passes it on unchanged.
    """

    def __init__(self, declarations, target: str, value=None, **kwargs):
        super().__init__(declarations, hidden=True, **kwargs)
        self.target = target
        self.value = value


class PositionalAlias(click.Argument):
    """An optional positional argument kept for DeepDanbooru's command lines, folded into the option
    `target` (grad-cam's OUTPUT -> --save-path). Not shown in the usage line."""

    def __init__(self, declarations, target: str, **kwargs):
        super().__init__(declarations, required=False, **kwargs)
        self.target = target
        self.value = None

    def get_usage_pieces(self, ctx):
        return []


def alias(spelling: str, target: str, value=None, **kwargs):
    """Decorator: `spelling` as a hidden alias of the parameter `target` (see Alias)."""
    dest = "alias_" + spelling.lstrip("-").replace("-", "_")
    if value is not None:
        kwargs.setdefault("is_flag", True)
    return click.option(spelling, dest, cls=Alias, target=target, value=value, **kwargs)


_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


PROJECT_OPTION = "--project-path"


def takes_project_first(command: click.Command) -> bool:
    """A command whose first argument is PROJECT_PATH (DeepDanbooru's form) and has no --project-path option."""
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    return (bool(arguments) and arguments[0].name == "project_path"
            and not any(isinstance(p, click.Option) and p.name == "project_path" for p in command.params))


def _project_option_to_argument(args: list[str]) -> list[str]:
    """`--project-path P ...` (or `--project-path=P`) -> `P ...`: the same project, given the positional way."""
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg == PROJECT_OPTION and index + 1 < len(args):
            return [args[index + 1], *args[:index], *args[index + 2:]]
        if arg.startswith(PROJECT_OPTION + "="):
            return [arg.split("=", 1)[1], *args[:index], *args[index + 1:]]
    return args


class VocabularyCommand(click.Command):
    """Folds each given Alias into its canonical parameter, as if the canonical option had been given.

    A command that takes PROJECT_PATH positionally also accepts it as --project-path, the name the
    other commands use (hidden: the positional form is DeepDanbooru's and the one --help shows).
    """

    def parse_args(self, ctx, args):
        if takes_project_first(self):
            args = _project_option_to_argument(list(args))
        rest = super().parse_args(ctx, args)
        for param in self.params:
            if not isinstance(param, (Alias, PositionalAlias)):
                continue
            value = ctx.params.pop(param.name, None)
            if ctx.get_parameter_source(param.name) not in _GIVEN:
                continue
            meant = param.value if param.value is not None else value
            canonical = next(p for p in self.params if p.name == param.target)
            if ctx.get_parameter_source(param.target) in _GIVEN and ctx.params.get(param.target) != meant:
                spelling = param.opts[0] if isinstance(param, Alias) else f"argument {param.human_readable_name}"
                raise click.UsageError(f"{spelling} (an older spelling of {canonical.opts[0]}) "
                                       f"contradicts {canonical.opts[0]}; give only {canonical.opts[0]}", ctx)
            ctx.params[param.target] = meant
            ctx.set_parameter_source(param.target, ParameterSource.COMMANDLINE)
        return rest


class VocabularyGroup(click.Group):
    """Commands of this class; the command list shows each summary whole (click cuts them to fit one
    line), and an unknown command suggests the commands it begins or is part of (`train` -> train-project).
    """

    command_class = VocabularyCommand

    def format_commands(self, ctx, formatter):
        rows = [(name, command.get_short_help_str(limit=200)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        if not ctx.resilient_parsing and not name.startswith("-") and self.get_command(ctx, name) is None:
            names = self.list_commands(ctx)
            close = ([candidate for candidate in names if candidate.startswith(name) or name in candidate.split("-")]
                     or difflib.get_close_matches(name, names, n=3))
            hint = f" Did you mean {' or '.join(repr(candidate) for candidate in close)}?" if close else ""
            raise click.UsageError(f"No such command {name!r}.{hint}", ctx)
        return super().resolve_command(ctx, args)


def option_names(param: click.Parameter) -> list[str]:
    """The long spellings of an option as the vocabulary names them (--compile for --compile/--no-compile)."""
    return [name for name in param.opts if name.startswith("--")]


def command_rows(group: click.Group):
    """(command, canonical options, aliases as 'old -> canonical') for every command, in name order."""
    ctx = click.Context(group, info_name="deepdanbooru")
    for name in sorted(group.commands):
        command = group.commands[name]
        params = {p.name: p for p in command.params}
        canonical, aliases = [], []
        if takes_project_first(command):
            aliases.append(f"{PROJECT_OPTION} -> argument PROJECT_PATH")
        for param in command.get_params(ctx):
            if isinstance(param, PositionalAlias):
                aliases.append(f"argument {param.human_readable_name} -> {params[param.target].opts[0]}")
            elif not isinstance(param, click.Option):
                continue
            elif isinstance(param, Alias):
                aliases.append(f"{param.opts[0]} -> {params[param.target].opts[0]}")
            else:
                canonical.extend(option_names(param))
        yield name, canonical, aliases


def render(group: click.Group) -> str:
    positional = ", ".join(f"`{name}`" for name, command in sorted(group.commands.items())
                           if takes_project_first(command))
    lines = [
        "# Command-line options",
        "",
        "Generated from `deepdanbooru/cli_vocabulary.py` and the commands by",
        "`python -m deepdanbooru.cli_reference > docs/cli.md`; a test fails when this",
        "file and the code disagree.",
        "",
        "One name per concept: DeepDanbooru 1.0's name where it has one, so its",
        "scripts keep working. Older spellings still work as hidden aliases (not shown",
        "by `--help`); giving an alias and its canonical option with different values",
        "is an error. Commands that always act on one project take PROJECT_PATH",
        "first, positionally, as DeepDanbooru's do; `--project-path PROJECT` works",
        f"there too ({positional}).",
        "",
        "| option | meaning | DeepDanbooru | hidden aliases |",
        "|---|---|---|---|",
    ]
    for term in VOCABULARY:
        aliases = ", ".join(f"`{a}`" for a in term.aliases)
        lines.append(f"| `{term.name}` | {term.meaning} | {'yes' if term.deepdanbooru else ''} | {aliases} |")
    lines += ["", "## Options of each command", "", "| command | options | hidden aliases |", "|---|---|---|"]
    for name, canonical, aliases in command_rows(group):
        shown = ", ".join(f"`{o}`" for o in canonical)
        hidden = ", ".join(f"`{a}`" for a in aliases)
        lines.append(f"| `{name}` | {shown} | {hidden} |")
    lines += ["", "`grad-cam PROJECT_PATH TARGET OUTPUT` (DeepDanbooru's positional output",
              "folder) is the same as `grad-cam PROJECT_PATH TARGET --save-path OUTPUT`.", ""]
    return "\n".join(lines)

