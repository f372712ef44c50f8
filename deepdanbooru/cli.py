"""The command line: a thin click group.

Each command parses its options and calls one function of a room, imported
inside the command so that `deepdanbooru --help`, create-project and preflight
never import TensorFlow. User errors become one stderr line and their exit
code (exitcodes.py) here, and only here.
"""

from __future__ import annotations

import io
import logging
import math
import os
import select
import sys
import warnings

import click

from deepdanbooru import __version__, exitcodes
from deepdanbooru.cli_vocabulary import PositionalAlias, VocabularyGroup, alias
from deepdanbooru.errors import UserError, out_of_memory_line, system_error_line
from deepdanbooru.formats import IMAGE_FORMATS
from deepdanbooru.inference.targets import DEFAULT_FOLDER_FILTERS
from deepdanbooru.preflight.options import PREFLIGHT_OPTIONS
from deepdanbooru.project.recipes import DEFAULT_RECIPE, RECIPES
from deepdanbooru.tfimport import install_quiet_import


class _Group(VocabularyGroup):
    """Maps UserError to a one-line message; a traceback only with --debug."""

    def parse_args(self, ctx, args):
        # The group's own options (before any command): their errors read like a command's.
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as error:
            _usage_error(ctx, error)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as error:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {error}", err=True)
            ctx.exit(error.exit_code)
        except click.UsageError as error:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            _usage_error(ctx, error)
        except BrokenPipeError as error:
            if not _quiet_if_stdout_is_gone():
                _system_error(ctx, error)
            ctx.exit(exitcodes.BROKEN_PIPE)
        except (OSError, MemoryError) as error:
            _system_error(ctx, error)
        except Exception as error:
            line = out_of_memory_line(error)
            if line is None or (ctx.obj and ctx.obj.get("debug")):
                raise
            click.echo(f"error: {line}", err=True)
            ctx.exit(exitcodes.USAGE)
        except KeyboardInterrupt as interrupt:
            # errors.Interrupted carries where the command stopped; a bare Ctrl-C has nothing to add.
            click.echo(f"interrupted: {interrupt}" if str(interrupt) else "interrupted", err=True)
            ctx.exit(exitcodes.INTERRUPTED)


def _system_error(ctx, error: BaseException):
    """What the file system or the memory refused (a read-only folder, a full disk, a batch too large): one line
    naming the file, as for bad input."""
    if ctx.obj and ctx.obj.get("debug"):
        raise error
    click.echo(f"error: {system_error_line(error)}", err=True)
    ctx.exit(exitcodes.USAGE)


def _quiet_if_stdout_is_gone() -> bool:
    """Whether the output's reader stopped reading (`deepdanbooru make-tags P | head -1`): then there is nothing
    to report and nowhere to say it, and what is left to print goes nowhere."""
    try:
        descriptor = sys.stdout.fileno()
        poller = select.poll()
        poller.register(descriptor, select.POLLOUT)
        # A pipe whose reader has gone reports an error condition on the writing end.
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
        os.dup2(os.open(os.devnull, os.O_WRONLY), descriptor)
    except (OSError, ValueError, AttributeError):
        return False
    return True


def _usage_error(ctx, error: click.UsageError):
    """An unknown command, a missing argument, an option's bad value: one line, like bad input, and where the
    options are listed, instead of click's usage block."""
    context = error.ctx if error.ctx is not None else ctx
    path = context.command_path
    # An option's missing value is raised without the command's context, while the group's names the command
    # being parsed: the hint names that command's --help, where its options are.
    if context is ctx and ctx.invoked_subcommand:
        path = f"{path} {ctx.invoked_subcommand}"
    message = error.format_message().rstrip(".")
    listed = "commands" if message.startswith(("No such command", "Missing command")) else "options"
    click.echo(f"error: {message} ({path} --help lists the {listed})", err=True)
    ctx.exit(error.exit_code)


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange without nan (it passes every comparison, so a range cannot refuse it) and infinities."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _show_warning(message, category, filename, lineno, file=None, line=None):
    click.echo(f"warning: {message}", err=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="deepdanbooru")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.pass_context
def main(ctx, debug):
    """Train and use multi-label image taggers (DeepDanbooru-compatible projects)."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    warnings.showwarning = _show_warning
    # A file name that is not UTF-8 is printed as the bytes it is, not refused by a strict UTF-8 stream.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.encoding.lower().replace("-", "") == "utf8":
            stream.reconfigure(errors="surrogateescape")
    # TensorFlow's C++ start-up chatter (CPU feature notes, plugin registration) buries our
    # own one-line messages; keep it unless the user chose a level or asked for --debug.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if debug else "3")
    # ... and the lines its libraries print while loading ignore that level: filter them (tfimport.py).
    install_quiet_import()


@main.command("create-project")
@click.argument("project_path", type=click.Path(file_okay=False, path_type=str))
@click.option("--overwrite", is_flag=True,
              help="Replace an existing project.json (one that models were trained with is kept beside it first).")
@alias("--force", "overwrite", value=True)
@click.option("--recipe", default=DEFAULT_RECIPE, show_default=True, type=click.Choice(list(RECIPES)),
              help="deepdanbooru: DeepDanbooru's defaults. modern: resnet_small, AdamW, asymmetric loss, a 40-epoch "
                   "step schedule; at equal time on the hard sample it led resnet_small with cross-entropy on "
                   "macro-F1 at threshold 0.5, not on mAP or with per-tag thresholds (docs/quality.md). finetune: "
                   "for a --source-model start: AdamW at 1e-3, a 1-epoch warm-up, cosine decay, asymmetric loss, only "
                   "the last 2 blocks or stages and the head trained (trainable_blocks 2), the last export a mix of the "
                   "start and the trained weights chosen by validation mAP (wise_ft, best_model_metric map), "
                   "validation_fraction 0.2. At equal time on emoji (docs/quality.md): from a resnet_small pretrained "
                   "on other emoji it led modern from scratch by 0.06-0.12 mAP; from a small ViT or a ConvNeXt-atto "
                   "pretrained on them, modern from scratch led by 0.05-0.14; 2 blocks tied or led every block. The "
                   "mix, on 400 posts, took 0.7-0.8 of the trained weights in three of eight runs, raising the mean AP "
                   "of the tags the source knew by 0.054-0.065 (the plain recipe: 0.037-0.042) and mAP by "
                   "0.013-0.022 on the posts that chose it, and 0.9-1 in the others; chosen on half the validation "
                   "posts, its mAP on the other half moved by -0.016 to +0.032, a gain only where the fine-tune had "
                   "forgotten clearly; on 2,672 posts, "
                   "where nothing was forgotten, it kept the trained weights, its validations at the end costing up "
                   "to 0.011 mAP in 4-minute runs. On a few hundred posts it can lose tags the source knew: from a "
                   "second source it lost 1-6 of the 14-18 measured on each of four 400-post draws; an output ensemble "
                   "with the source, 3e-4 and a frozen trunk kept no more, source_distillation 1 kept more on three "
                   "draws (0-4 lost) for 0.011-0.044 less mAP (docs/quality.md).")
@click.option("--database", "database", type=click.Path(exists=True, dir_okay=False, path_type=str),
              help="The dataset's SQLite file: sets database_path, and minimum_tag_count and image_extensions "
                   "to fit the posts it holds.")
def create_project(project_path, overwrite, recipe, database):
    """Create PROJECT_PATH with a default project.json (or a recipe's)."""
    from deepdanbooru.project.create import create_project as create

    settings, notes = None, ()
    if database is not None:
        from deepdanbooru.dataset.fit import fit_to_database

        settings, notes = fit_to_database(database, project_path)
    create(project_path, overwrite=overwrite, echo=click.echo, recipe=recipe, settings=settings, notes=notes)


@main.command("train-project")
@click.argument("project_path", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--source-model", type=click.Path(path_type=str),
              help="Start from this .keras/.h5 model's structure and weights, or a timm checkpoint folder's "
                   "(a WD v3 tagger); a checkpoint, if any, is restored on top. Its checkpoints record it: "
                   "resuming needs no --source-model (the same one is accepted, another refused).")
@click.option("--source-tags", type=click.Path(dir_okay=False, path_type=str),
              help="The tags.txt the --source-model was trained with (ours read it from the model's "
                   "thresholds.csv); its head is then mapped onto this project's tags by name.")
@click.option("--force-mixed-precision", is_flag=True,
              help="With mixed_precision true, train in float16 even without a GPU (very slow on CPUs; "
                   "also DEEPDANBOORU_FORCE_MIXED_PRECISION=1).")
@click.option("--devices", default="all", show_default=True, metavar="all|cpu|0,1,...",
              help="Local devices to train on: every visible GPU (mirrored when more than one), the CPU only, "
                   "or these GPU indices. With TF_CONFIG set, this host's part of a multi-worker cluster.")
@click.option("--time-limit", metavar="DURATION",
              help="Stop in time (e.g. 3h50m, 90m, 900s): at the last checkpoint before the limit, export, "
                   "print how to continue and exit 0. Running again resumes exactly there. Needed by "
                   'epoch_count "fit", which plans the epochs that fit it.')
def train_project(project_path, source_model, source_tags, force_mixed_precision, devices, time_limit):
    """Train PROJECT_PATH, resuming from its latest checkpoint if there is one.

    Several GPUs and several hosts: see docs/distributed.md (minibatch_size is the global batch).
    """
    from deepdanbooru.training.budget import parse_duration
    from deepdanbooru.training.train import train_project as train

    seconds = parse_duration(time_limit) if time_limit is not None else None
    train(project_path, source_model=source_model, force_mixed_precision=force_mixed_precision, echo=click.echo,
          devices=devices, source_tags=source_tags, time_limit=seconds, time_limit_text=time_limit)


@main.command("pack")
@click.argument("project_path", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="Processes that pack shards side by side (each uses its share of the cores).")
@click.option("--verify", is_flag=True,
              help="Pack nothing: read every record of the packed shards and check its checksum; exit 1 when "
                   "any is damaged (each is named with its shard, byte offset and picture).")
def pack(project_path, workers, verify):
    """Fit every eligible picture to the training size once and write it to PROJECT_PATH/shards.

    train-project then reads the shards instead of decoding every original again each epoch: the same
    records in the same order, the same augmentation. Running it again continues an interrupted pack;
    after tags.txt, the database, the image size or the augmentation's scale changed, it packs anew
    (training refuses stale shards and says so).
    """
    if verify:
        from deepdanbooru.packing.verify import verify_shards

        def bar(keys):
            return click.progressbar(keys, label="Verifying", file=click.get_text_stream("stderr"))

        if verify_shards(project_path, echo=click.echo, progress=bar).bad:
            click.get_current_context().exit(exitcodes.FAILED)
        return
    from deepdanbooru.packing.pack import pack_project

    pack_project(project_path, workers=workers, echo=click.echo)


def _preflight_options(options):
    """click options from preflight's option table, which the stdlib scripts read too."""
    def decorate(command):
        for option in reversed(options):
            if option.alias:
                spelling, value = option.alias
                command = alias(spelling, option.name, value=value)(command)
            if option.metavar:
                command = click.option(option.flag, option.name, metavar=option.metavar,
                                       type=click.Path(path_type=str), help=option.help)(command)
            elif option.choices:
                command = click.option(option.flag, option.name, default=option.default, show_default=True,
                                       type=click.Choice(option.choices), help=option.help)(command)
            elif option.default is None:
                command = click.option(option.flag, option.name, is_flag=True, help=option.help)(command)
            else:
                command = click.option(option.flag, option.name, default=option.default, show_default=True,
                                       type=click.IntRange(min=0), metavar="N", help=option.help)(command)
        return command
    return decorate


@main.command("preflight")
@click.argument("project_path", type=click.Path(exists=True, file_okay=False, path_type=str))
@_preflight_options(PREFLIGHT_OPTIONS)
@click.pass_context
def preflight(ctx, project_path, max_image_checks, check_packages, probe_imports, probe_tensorflow, check_duplicates,
              source_model, output_format):
    """Read-only checks of PROJECT_PATH before training. Exit 0: all good, 1: a check failed."""
    from deepdanbooru.preflight.main import report, training_preflight

    results = training_preflight(project_path, max_image_checks, check_packages, probe_imports, probe_tensorflow,
                                 check_duplicates, source_model)
    ctx.exit(report(project_path, results, output_format == "json", echo=click.echo))


@main.command("make-sample-dataset")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--count", default=6000, show_default=True, type=click.IntRange(min=1),
              help="Number of posts (the default is what sample-project is tuned for).")
@click.option("--size", default=64, show_default=True, type=click.IntRange(min=16), help="Image side in pixels.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Same seed, same files.")
@click.option("--format", "image_format", default="jpg", show_default=True,
              type=click.Choice([f.extension for f in IMAGE_FORMATS]), help="Image file format.")
@click.option("--preset", default="basic", show_default=True, type=click.Choice(["basic", "hard"]),
              help="basic: the sample project's 17 tags; hard: 197 long-tailed tags of counts, sizes and "
                   "relations on textured, noisy backgrounds (docs/sample.md).")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing dataset.sqlite and tags.txt (one made with the same options is kept).")
def make_sample_dataset(directory, count, size, seed, image_format, preset, overwrite):
    """Write a synthetic DeepDanbooru-layout dataset (SQLite + images + tags.txt) to DIRECTORY."""
    from deepdanbooru.sample.generator import existing_recipe, generate_sample_dataset

    before = existing_recipe(directory)
    database, tags = generate_sample_dataset(directory, count=count, size=size, seed=seed,
                                             image_format=image_format, overwrite=overwrite,
                                             reuse_identical=True, preset=preset)
    if not overwrite and before is not None:  # anything but an identical earlier dataset raised above
        click.echo(f"{database} already holds this sample dataset ({count} posts); nothing to do")
    else:
        click.echo(f"Wrote {count} posts with {len(tags)} tags: {database}")
    click.echo(f"Vocabulary: {database.parent / 'tags.txt'}")
    from deepdanbooru.sample.generator import project_using

    project = project_using(database)
    if project is not None:
        click.echo(f"{project / 'project.json'} already uses it; next: deepdanbooru train-project {project}")
    else:
        click.echo(f"Use it in a project: set database_path to {database.resolve()} and copy tags.txt beside "
                   "project.json")


_GROUP_DUPLICATES = click.option(
    "--group-duplicates", is_flag=True,
    help="Read every image and give identical or near-identical pictures (64-bit dHash within 4 bits) a shared "
         "split_id, so each group lands on one side of the validation split (new datasets; docs/datasets.md).")


@main.command("make-training-database")
@click.argument("source_path", type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.argument("output_path", type=click.Path(dir_okay=False, path_type=str))
@click.option("--start-id", default=1, show_default=True, type=int, help="First post id to copy.")
@click.option("--end-id", default=2**63 - 1, type=int, help="Last post id to copy.  [default: no limit]")
@click.option("--use-deleted", is_flag=True, help="Also copy posts whose is_deleted is set.")
@click.option("--chunk-size", default=100_000, show_default=True, type=click.IntRange(min=1),
              help="Posts read and written per step; bounds memory.")
@click.option("--overwrite", is_flag=True, help="Replace an existing OUTPUT_PATH.")
@click.option("--vacuum", is_flag=True, help="Run VACUUM on the output before it is put in place.")
@_GROUP_DUPLICATES
def make_training_database(source_path, output_path, start_id, end_id, use_deleted, chunk_size, overwrite, vacuum,
                           group_duplicates):
    """Copy posts of SOURCE_PATH into a training database OUTPUT_PATH.

    SOURCE_PATH is a SQLite database with a posts table, Danbooru post
    objects as JSON Lines or a JSON array (either gzipped; API fields or the
    Danbooru20xx layout) or a Parquet table of them (needs pyarrow), told
    apart by their content. Appends the system tag rating:general/sensitive/questionable/explicit for
    rating g/s/q/e, skips deleted posts and posts without a usable md5. The
    output is written to a temporary file and renamed, so a failed run leaves
    no half database.
    """
    from deepdanbooru.dataset.build import make_training_database as make

    make(source_path, output_path, start_id=start_id, end_id=end_id, use_deleted=use_deleted,
         chunk_size=chunk_size, overwrite=overwrite, vacuum=vacuum, echo=click.echo,
         progress=lambda line: click.echo(line, err=True), group_duplicates=group_duplicates)


@main.command("download-tags")
@click.argument("path", type=click.Path(file_okay=False, path_type=str))
@click.option("--username", required=True, envvar="DANBOORU_USERNAME", show_envvar=True,
              help="Danbooru user name.")
@click.option("--api-key", required=True, envvar="DANBOORU_API_KEY", show_envvar=True,
              help="Danbooru API key (the environment variable keeps it out of shell history).")
@click.option("--limit", default=10000, show_default=True, type=click.IntRange(min=1),
              help="Most tags per category.")
@click.option("--minimum-post-count", default=500, show_default=True, type=click.IntRange(min=0),
              help="Least posts a tag needs.")
@click.option("--overwrite", is_flag=True, help="Replace existing tag files in PATH.")
@click.option("--allow-trained", is_flag=True,
              help="With --overwrite, where PATH is a project: replace the tags.txt that its checkpoints or exported "
                   "models were trained with (refused otherwise); the old file is kept beside it as "
                   "tags.replaced-<time>.txt.")
@click.option("--base-url", default="https://danbooru.donmai.us", show_default=True, help="Danbooru server.")
@click.option("--include-paid-tags", is_flag=True,
              help="Keep loli, shota and toddlercon, whose posts only paid accounts can see (left out by default, "
                   "as in DeepDanbooru).")
def download_tags(path, username, api_key, limit, minimum_post_count, overwrite, allow_trained, base_url,
                  include_paid_tags):
    """Download Danbooru general and character tags into PATH.

    Writes tags-general.txt and tags-character.txt (each in natural name
    order, as DeepDanbooru does), tags.txt = general + character + the four
    rating system tags, categories.json and download-tags.log. Nothing is
    written unless every download succeeds.
    """
    from deepdanbooru.dataset.download import download_tags as download

    download(path, username, api_key, limit=limit, minimum_post_count=minimum_post_count, overwrite=overwrite,
             allow_trained=allow_trained, base_url=base_url, echo=click.echo,
             notice=lambda line: click.echo(f"warning: {line}", err=True), include_paid_tags=include_paid_tags)


@main.command("import-images")
@click.argument("src", nargs=-1, required=True, type=click.Path(exists=True, path_type=str))
@click.argument("dataset", type=click.Path(file_okay=False, path_type=str))
@click.option("--link", is_flag=True, help="Hard-link images instead of copying them (same file system only).")
@click.option("--extensions", default="png,jpg,jpeg,gif,webp,bmp", show_default=True,
              help="Comma-separated image file extensions to pick up.")
@_GROUP_DUPLICATES
@click.option("--project-path", type=click.Path(file_okay=False, path_type=str),
              help="The project the dataset is for: the closing advice gives database_path relative to it.")
@click.option("--caption-extension", default=".txt", show_default=True,
              help="The caption files' extension (IMAGE.caption with .caption).")
@click.option("--caption-separator", default=",", show_default=True,
              help="The string between tags in the caption files (the spaces around it do not matter: ' | ' "
                   "reads as '|'; whitespace alone: ' ' or a tab between tags, a line break for one tag a line). "
                   "One other than the default that no caption holds is refused, with nothing written.")
def import_images(src, dataset, link, extensions, group_duplicates, project_path, caption_extension,
                  caption_separator):
    """Import SRC (a folder of images with same-name .txt tag files, or tar shards) into DATASET.

    A caption file IMAGE.txt (or IMAGE.ext.txt) holds comma-separated tags
    (then line breaks also separate), one tag a line, or space-separated tags
    (a lone 'white background,' is one tag); --caption-separator '|' reads
    '|' where the comma stands. Prompt weights such as
    (masterpiece:1.2) are stripped, tags lower-cased, inner spaces become
    underscores and backslash escapes (\\( \\) \\,) are undone; evaluate
    --save-txt writes the same grammar. Writes DATASET/dataset.sqlite (new
    ids after the largest existing one) and DATASET/images/<md5[0:2]>/<md5>.<ext> named by the real MD5 of
    the bytes, with file_ext from the detected format. An image already in
    DATASET whose caption changed gets the new tags. Duplicates (same bytes)
    and images without tags are skipped and counted; unreadable images are
    reported and skipped; a caption that is not UTF-8 stops the import.

    SRC may also be one or more .tar shards in the WebDataset layout (or
    folders of them): each sample with a picture and a Danbooru post object
    (KEY.json) or a caption (KEY.txt) becomes a post; a member without its
    pair, an unreadable picture or a malformed post object is named and
    skipped, a truncated shard is named with its last good member.
    """
    from deepdanbooru.dataset.import_images import import_images as run_import

    run_import(src[0] if len(src) == 1 else src, dataset, link=link, extensions=extensions,
               group_duplicates=group_duplicates, echo=click.echo,
               warn=lambda line: click.echo(line, err=True), project=project_path, caption_ext=caption_extension,
               separator=caption_separator)


@main.command("make-tags")
@click.argument("project_path", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--minimum-post-count", default=1, show_default=True, type=click.IntRange(min=1),
              help="Least training posts (eligible posts outside the validation split, as train-project "
                   "splits them) a tag must occur in.")
@alias("--min-count", "minimum_post_count", type=click.IntRange(min=1))
@click.option("--limit", default=0, show_default=True, type=click.IntRange(min=0),
              help="Most tags, the most frequent first (0: no limit; rating tags not counted).")
@click.option("--system-tags/--no-system-tags", default=True, show_default=True,
              help="Keep rating:* tags found in the data, listed last.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--allow-trained", is_flag=True,
              help="With --overwrite: replace the tags.txt that the project's checkpoints or exported models were "
                   "trained with (refused otherwise); the old file is kept beside it as tags.replaced-<time>.txt.")
@click.option("--save-path", type=click.Path(dir_okay=False, path_type=str),
              help="Write here instead of PROJECT_PATH/tags.txt.")
@alias("--output", "save_path", type=click.Path(dir_okay=False, path_type=str))
def make_tags(project_path, minimum_post_count, limit, system_tags, overwrite, allow_trained, save_path):
    """Write tags.txt from the tags of the project's database.

    Counts, for each tag, the training posts it occurs in: the eligible posts
    (file_ext and minimum_tag_count of project.json) outside the validation
    split (validation_fraction, seed), the posts train-project learns from.
    Lists tags by descending count, ties by name. rating:* system tags (see
    make-training-database) are kept by default and put last, in the order
    general, sensitive, questionable, explicit, as DeepDanbooru's tags.txt
    has them. A tags.txt that checkpoints or exported models were trained
    with is only replaced with --overwrite --allow-trained.
    """
    from deepdanbooru.dataset.build import make_tags as make

    make(project_path, minimum_post_count=minimum_post_count, limit=limit, overwrite=overwrite, save_path=save_path,
         system_tags=system_tags, allow_trained=allow_trained, echo=click.echo)


@main.command("show-model")
@click.argument("name")
@click.option("--width", default=299, show_default=True, type=click.IntRange(min=1),
              help="Input width (project.json image_width).")
@click.option("--height", default=299, show_default=True, type=click.IntRange(min=1),
              help="Input height (project.json image_height).")
@click.option("--tags", "n_tags", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Number of output tags (lines of tags.txt).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object with trainable, non_trainable, input_shape, output_shape, model, layers.")
@alias("--json", "output_format", value="json")
def show_model(name, width, height, n_tags, output_format):
    """Build model NAME and print its input and output shapes and parameter counts.

    NAME is a project.json `model` value: resnet_152, resnet_custom_v1 to
    resnet_custom_v4, resnet_small, convnext_tiny, convnext_small,
    efficientnetv2_b0, efficientnetv2_s, vit_small_patch16 (docs/models.md).
    The defaults are the reference size of the ResNets' parameter counts in
    the docs (299x299, 1000 tags).
    """
    from deepdanbooru.models.show import show_model as show

    show(name, width=width, height=height, n_tags=n_tags, as_json=output_format == "json", echo=click.echo)


def _model_source_options(command):
    command = click.option("--tags-path", type=click.Path(dir_okay=False, path_type=str),
                           help="tags.txt of the model given with --model-path.")(command)
    command = click.option("--model-path", type=click.Path(dir_okay=False, path_type=str),
                           help="A .keras (or DeepDanbooru .h5) model file instead of the project's export.")(command)
    command = click.option("--project-path", type=click.Path(file_okay=False, path_type=str),
                           help="Project whose export and tags.txt are used: the final export (model-<model>.keras, "
                                "else a --time-limit stop's, else .h5), or the best one when it validated better "
                                "(docs/evaluation.md).")(command)
    return command


_THRESHOLD = click.option("--threshold", type=FiniteFloatRange(0.0, 1.0),
                          help="Report tags whose score is at least this, for every tag  [default: the per-tag "
                               "thresholds CSV training wrote beside the model, if there is one, else 0.5].")
_THRESHOLDS_CSV = click.option("--thresholds-csv", type=click.Path(dir_okay=False, exists=True, path_type=str),
                               help="Per-tag thresholds (a *.thresholds.csv written by training); "
                                    "tags it does not list use --threshold.")
_ALLOW_GPU = click.option("--allow-gpu/--no-allow-gpu", default=False, show_default=True,
                          help="Use a GPU if one is visible (by default GPUs are hidden, as in DeepDanbooru).")
_BATCH_SIZE = click.option("--batch-size", default=32, show_default=True, type=click.IntRange(min=1),
                           help="Images per model call.")
def _FORMAT(command):
    command = alias("--json", "output_format", value="json")(command)
    return click.option("--format", "output_format", default="text", show_default=True,
                        type=click.Choice(["text", "json", "csv"]),
                        help="text: DeepDanbooru's layout; json: one JSON object per image and line (with "
                             "--metrics: one object, with a row per tag under per_tag); csv: path,tag,score rows (with "
                             "--metrics: the rows per tag).")(command)


def _record_options(when: str):
    """--split, --start-id, --end-id: which of the project's labelled posts a model is measured on."""
    def decorate(command):
        command = click.option("--end-id", type=int, help=f"{when}only posts with id <= this.")(command)
        command = click.option("--start-id", type=int, help=f"{when}only posts with id >= this.")(command)
        return click.option("--split", type=click.Choice(["validation", "all"]), default="validation",
                            show_default=True,
                            help=f"{when}the project's validation split, or every eligible post.")(command)
    return decorate


def _exit_if_skipped(summary):
    if summary.skipped:
        click.get_current_context().exit(exitcodes.FAILED)


@main.command("evaluate")
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=str))
@_model_source_options
@_THRESHOLD
@_THRESHOLDS_CSV
@click.option("--allow-folder", is_flag=True, help="Accept folders as TARGETS and tag the images in them, recursively.")
@click.option("--folder-filters", default=DEFAULT_FOLDER_FILTERS, show_default=True,
              help="Comma-separated file-name patterns for the images in folders.")
@click.option("--general-threshold", type=FiniteFloatRange(0.0, 1.0),
              help="Threshold of the general tags (categories.json beside tags.txt says which, or the "
                   "<name>.categories.json import-model wrote beside --model-path).")
@click.option("--character-threshold", type=FiniteFloatRange(0.0, 1.0),
              help="Threshold of the character tags (categories.json beside tags.txt says which, or the "
                   "<name>.categories.json import-model wrote beside --model-path).")
@click.option("--undesired-tags", default="", metavar="TAG,TAG", help="Comma-separated tags never reported.")
@click.option("--order-by-score", is_flag=True, help="List each image's tags highest score first (not tags.txt order).")
@click.option("--save-txt", is_flag=True, help="Write the tags beside each image as <image name>.txt ('tag1, tag2', "
                                               "read back by import-images as the same tags); "
                                               "an existing caption file needs --overwrite or --append.")
@click.option("--caption-extension", default=".txt", show_default=True, help="With --save-txt: the caption files' extension.")
@click.option("--caption-separator", default=", ", show_default=True,
              help="With --save-txt: the string between tags, as in kohya's tagger (a space: tags keep their "
                   "underscores; a line break: one tag a line).")
@click.option("--overwrite", is_flag=True, help="With --save-txt: replace caption files already there.")
@click.option("--append", is_flag=True, help="With --save-txt: add the tags a caption file does not hold yet to it "
                                             "(written back as 'tag1, tag2').")
@click.option("--remove-underscore", is_flag=True,
              help="With --save-txt: write 'long hair' for long_hair (tags of 3 characters or fewer, such as ^_^, kept).")
@_ALLOW_GPU
@click.option("--compile/--no-compile", "compile_model", default=True, show_default=True,
              help="Run the model as a traced TensorFlow graph (--no-compile: eagerly, slower; for debugging).")
@click.option("--verbose", is_flag=True, help="Print the model used, progress and throughput on stderr.")
@click.option("--alpha", type=click.Choice(["white", "drop"]), default="white", show_default=True,
              help="Transparent PNG / WebP pictures: composited onto white, as the WD tagger tools do, or drop "
                   "the alpha channel (the colours stored under it; before this option, always).")
@click.option("--padding", type=click.Choice(["border", "white"]),
              help="Around a picture not of the model's proportions: its edge pixels repeated (border) or white, "
                   "as the WD tagger tools pad  [default: the project's padding key; border without a project].")
@_FORMAT
@_BATCH_SIZE
def evaluate(targets, project_path, model_path, tags_path, threshold, thresholds_csv, allow_folder,
             folder_filters, general_threshold, character_threshold, undesired_tags, order_by_score, save_txt,
             caption_extension, caption_separator, overwrite, append, remove_underscore, allow_gpu, compile_model,
             verbose, alpha, padding, output_format, batch_size):
    """Tag the images TARGETS (files, or folders with --allow-folder).

    Images that cannot be read are named on stderr and skipped; the exit code
    is then 1 (0: every image tagged; 2: bad options or input).
    """
    from deepdanbooru.inference.caption_files import CaptionOptions
    from deepdanbooru.inference.evaluate import TaggingOptions, evaluate as run_evaluate

    caption = CaptionOptions(extension=caption_extension, overwrite=overwrite, append=append,
                             remove_underscore=remove_underscore, separator=caption_separator)
    options = TaggingOptions(threshold=threshold, thresholds_csv=thresholds_csv, allow_folder=allow_folder,
                             folder_filters=folder_filters, save_txt=save_txt, caption=caption,
                             general_threshold=general_threshold, character_threshold=character_threshold,
                             undesired_tags=undesired_tags, order_by_score=order_by_score, output_format=output_format,
                             batch_size=batch_size, allow_gpu=allow_gpu, compile_model=compile_model, verbose=verbose,
                             alpha=alpha, padding=padding)
    summary = run_evaluate(targets, options, project_path=project_path, model_path=model_path, tags_path=tags_path,
                           echo=click.echo)
    _exit_if_skipped(summary)


_METRICS_ONLY = ("model_path", "split", "start_id", "end_id")


@main.command("evaluate-project")
@click.argument("project_path", type=click.Path(file_okay=False, path_type=str))
@click.argument("target", required=False, type=click.Path(path_type=str))
@_THRESHOLD
@_THRESHOLDS_CSV
@_ALLOW_GPU
@_FORMAT
@_BATCH_SIZE
@click.option("--metrics", is_flag=True,
              help="Instead of tagging TARGET, measure the model on the project's labelled records and print the "
                   "validation metrics (docs/metrics.md); --format json adds one row per tag (per_tag), --format "
                   "csv writes those rows alone.")
@click.option("--model-path", type=click.Path(dir_okay=False, path_type=str),
              help="With --metrics: the model file to measure [default: the project's final export, or its best "
                   "one when that validated better].")
@alias("--model", "model_path", type=click.Path(dir_okay=False, path_type=str))
@_record_options("With --metrics: ")
@click.pass_context
def evaluate_project(ctx, project_path, target, threshold, thresholds_csv, allow_gpu, output_format, batch_size,
                     metrics, model_path, split, start_id, end_id):
    """Tag TARGET (an image, or a folder searched recursively) with PROJECT_PATH's model.

    Same as `evaluate TARGET --project-path PROJECT_PATH --allow-folder`; exit code 1 when an image was skipped.

    With --metrics (and no TARGET): the metrics of the model over the
    project's validation split (or --split all, limited by --start-id and
    --end-id); the working threshold defaults to the project's
    validation_threshold.
    """
    from click.core import ParameterSource

    def given(name):
        return ctx.get_parameter_source(name) != ParameterSource.DEFAULT

    if metrics:
        if target is not None:
            raise click.UsageError("TARGET is not used with --metrics (the project's records are measured)")
        if thresholds_csv is not None:
            raise click.UsageError("--thresholds-csv applies to tagging, not to --metrics")
        from deepdanbooru.inference.project_metrics import project_metrics

        summary = project_metrics(project_path, model_path=model_path, split=split, start_id=start_id,
                                  end_id=end_id, threshold=threshold, batch_size=batch_size,
                                  allow_gpu=allow_gpu, output_format=output_format, echo=click.echo)
        _exit_if_skipped(summary)
        return
    misplaced = [f"--{name.replace('_', '-')}" for name in _METRICS_ONLY if given(name)]
    if misplaced:
        raise click.UsageError(f"{', '.join(misplaced)} can only be used with --metrics")
    if target is None:
        raise click.UsageError("Missing argument 'TARGET' (or pass --metrics to measure the model instead)")
    from deepdanbooru.inference.evaluate import TaggingOptions, evaluate as run_evaluate

    options = TaggingOptions(threshold=threshold, thresholds_csv=thresholds_csv, allow_folder=True,
                             output_format=output_format, batch_size=batch_size, allow_gpu=allow_gpu)
    summary = run_evaluate([target], options, project_path=project_path, echo=click.echo)
    _exit_if_skipped(summary)


@main.command("grad-cam")
@click.argument("project_path", type=click.Path(file_okay=False, path_type=str))
@click.argument("target", type=click.Path(path_type=str))
@click.argument("output", cls=PositionalAlias, target="save_path", type=click.Path(file_okay=False, path_type=str))
@click.option("--save-path", default=".", show_default=True, type=click.Path(file_okay=False, path_type=str),
              help="Folder for the pictures (DeepDanbooru's third argument OUTPUT_PATH also works).")
@click.option("--threshold", default=0.5, show_default=True, type=FiniteFloatRange(0.0, 1.0),
              help="Explain the tags whose score is at least this.")
@_ALLOW_GPU
def grad_cam(project_path, target, save_path, threshold, allow_gpu):
    """Explain each predicted tag of TARGET (an image or a folder) with PNG maps under SAVE_PATH/<image name>/.

    Per tag: <tag>.gradcam.png (Grad-CAM of the last convolutional stage over
    the image), <tag>.saliency.png (input-gradient map, DeepDanbooru's
    "grad-cam") and <tag>.masked.png (the image weighted by that map).
    """
    from deepdanbooru.inference.gradcam import grad_cam_command

    summary = grad_cam_command(project_path, target, save_path, threshold=threshold, allow_gpu=allow_gpu,
                               echo=click.echo)
    _exit_if_skipped(summary)


@main.command("conv2tflite")
@click.option("--project-path", type=click.Path(file_okay=False, path_type=str),
              help="Convert the project's final export (or its best one when that validated better).")
@click.option("--model-path", type=click.Path(dir_okay=False, path_type=str),
              help="Convert this .keras (or .h5) file instead.")
@click.option("--save-path", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Output file (written only after the comparison passed).")
@click.option("--optimize-default", is_flag=True,
              help="TFLite Optimize.DEFAULT: 8-bit weights (about 4x smaller; larger differences).")
@click.option("--optimize-experimental-sparsity", is_flag=True, help="TFLite Optimize.EXPERIMENTAL_SPARSITY.")
@click.option("--format", "output_format", type=click.Choice(["tflite", "onnx"]),
              help="Default: onnx when --save-path ends in .onnx, else tflite. ONNX needs deepdanbooru[onnx].")
@click.option("--tolerance", type=FiniteFloatRange(min=0.0),
              help="Largest accepted output difference from Keras [default: 1e-4; 0.05 with --optimize-default].")
@click.option("--sample-image", "sample_images", multiple=True, type=click.Path(dir_okay=False, path_type=str),
              help="Also compare on this image (repeatable), preprocessed as evaluate does.")
def conv2tflite(project_path, model_path, save_path, optimize_default, optimize_experimental_sparsity,
                output_format, tolerance, sample_images):
    """Convert a model to TFLite (or ONNX), then check it against Keras on sample inputs.

    Exit code 1 (and no file written) when the outputs differ by more than --tolerance.
    """
    from deepdanbooru.inference.convert import conv2tflite as convert

    convert(project_path=project_path, model_path=model_path, save_path=save_path,
            optimize_default=optimize_default, optimize_sparsity=optimize_experimental_sparsity,
            output_format=output_format, tolerance=tolerance, sample_images=sample_images, echo=click.echo)


@main.command("import-model")
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--save-path", type=click.Path(dir_okay=False, path_type=str),
              help="The Keras model to write (FILE.keras; FILE.tags.txt and, with selected_tags.csv, "
                   "FILE.categories.json go beside it).  [required]")
@alias("--output", "save_path", type=click.Path(dir_okay=False, path_type=str))
@click.option("--channel-order", type=click.Choice(["rgb", "bgr"]),
              help="The channel order the checkpoint's weights expect  [default: bgr when SOURCE has a "
                   "selected_tags.csv (WD taggers), else rgb].")
@click.option("--overwrite", is_flag=True, help="Replace FILE.keras and the files beside it.")
def import_model(source, save_path, channel_order, overwrite):
    """Import the timm checkpoint folder SOURCE (config.json, model.safetensors, optionally selected_tags.csv).

    The written model is a plain Keras model (keras.models.load_model opens it
    without deepdanbooru): RGB in [0, 1] at the checkpoint's input size, the
    checkpoint's mean, std and channel order folded in, one sigmoid score per
    head row. Supported: timm's VisionTransformer, EVA02, ConvNeXt and
    SwinTransformerV2 (WD v3's ViT, EVA02, ConvNeXt and SwinV2 taggers); see
    docs/finetuning.md. Nothing is downloaded.
    """
    if save_path is None:
        raise click.UsageError("give --save-path FILE.keras")
    from deepdanbooru.models.timm.write import import_model as run

    run(source, save_path, channel_order=channel_order, overwrite=overwrite, echo=click.echo)


@main.command("export-bundle")
@click.argument("project_path", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.argument("save_path", type=click.Path(dir_okay=True, file_okay=False, path_type=str))
@click.option("--model-path", type=click.Path(dir_okay=False, path_type=str),
              help="The model to bundle [default: the project's final export, or its best one when that "
                   "validated better].")
@_record_options("Thresholds and metrics: ")
@click.option("--size", type=click.IntRange(min=1, max=4096), default=448, show_default=True,
              help="The ONNX input's side in pixels, 1 to 4096 (kohya's tagger always feeds 448); the graph "
                   "resizes to the model's own size.")
@click.option("--overwrite", is_flag=True, help="Replace the bundle in SAVE_PATH.")
@_ALLOW_GPU
@_BATCH_SIZE
def export_bundle(project_path, save_path, model_path, split, start_id, end_id, size, overwrite, allow_gpu,
                  batch_size):
    """Write SAVE_PATH as a WD-tagger-style bundle for today's tagger tools.

    model.onnx (BGR 0-255 white-padded square input; conversion and resize
    folded in; four WD rating rows, then general, then character),
    selected_tags.csv with the per-tag thresholds evaluate uses (the
    model's *.thresholds.csv), metrics.json and preprocess.json, measured
    on pictures fed as the tools feed them; check-bundle compares it with
    evaluate; see docs/evaluation.md. Needs the optional packages: pip install 'deepdanbooru[onnx]'.
    """
    from deepdanbooru.inference.bundle import export_bundle as export

    export(project_path, save_path, model_path=model_path, split=split, start_id=start_id, end_id=end_id,
           size=size, overwrite=overwrite, batch_size=batch_size, allow_gpu=allow_gpu, echo=click.echo)


@main.command("check-bundle")
@click.argument("bundle", type=click.Path(path_type=str))
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--project-path", type=click.Path(file_okay=False, path_type=str),
              help="The project whose model the bundle was exported from (its model and thresholds are evaluate's).")
@click.option("--model-path", type=click.Path(dir_okay=False, path_type=str),
              help="The model evaluate would use [default: the project's, as evaluate chooses it].")
@click.option("--tolerance", type=FiniteFloatRange(0.0, 1.0), default=0.05, show_default=True,
              help="The largest score difference between the two roads that still agrees.")
@_ALLOW_GPU
@_BATCH_SIZE
def check_bundle(bundle, targets, project_path, model_path, tolerance, allow_gpu, batch_size):
    """Run BUNDLE as the WD tagger tools feed it on the pictures in TARGETS and compare with evaluate.

    onnxruntime on pictures padded to a white square, resized to the bundle's input and flipped to BGR, read
    by selected_tags.csv's rows and thresholds; beside evaluate with the same model, preprocessing and default
    thresholds. Prints how many pictures get the same tags, the largest score difference and why any picture
    differs; exit code 0 when they agree within --tolerance, 1 when not (docs/evaluation.md).
    """
    from deepdanbooru.inference.bundle_check import check_bundle as check

    check(bundle, targets, project_path=project_path, model_path=model_path, tolerance=tolerance,
          batch_size=batch_size, allow_gpu=allow_gpu, echo=click.echo,
          echo_err=lambda line: click.echo(line, err=True))


@main.command("report")
@click.argument("project_path", type=click.Path(file_okay=False, path_type=str))
@click.option("--model-path", type=click.Path(dir_okay=False, path_type=str),
              help="The model to report on [default: the project's best export, else the model evaluate-project "
                   "uses].")
@alias("--model", "model_path", type=click.Path(dir_okay=False, path_type=str))
@click.option("--save-path", type=click.Path(dir_okay=False, path_type=str),
              help="The page to write [default: PROJECT_PATH/report.html]; its thumbnails go in the folder beside "
                   "it named after it (report_files/).")
@alias("--output", "save_path", type=click.Path(dir_okay=False, path_type=str))
@_ALLOW_GPU
@_BATCH_SIZE
def report(project_path, model_path, save_path, allow_gpu, batch_size):
    """Write one HTML page of what PROJECT_PATH's tagger learned: the run, its curves, every tag's figures,
    precision-recall curve and worst pictures, and the validation pictures it gets most wrong.

    Scores the validation split once. The page opens from disk with no network (docs/evaluation.md).
    Needs the report extra: pip install 'deepdanbooru[report]'.
    """
    from deepdanbooru.report.make import make_report

    make_report(project_path, model_path=model_path, output=save_path, batch_size=batch_size, allow_gpu=allow_gpu,
                echo=click.echo)


@main.command("audit")
@click.argument("project_path", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("--folds", type=int, metavar="K",
              help="Train K models with the project's own recipe (train-project's entry), each on the other folds, "
                   "and score every post with the one that did not see it. Resumes fold by fold.")
@click.option("--model-path", type=click.Path(exists=True, path_type=str),
              help="Score with this model instead (a .keras/.h5 file or a timm checkpoint folder, as "
                   "--source-model takes) that never saw these posts; its tags are matched to tags.txt by name.")
@click.option("--time-limit", metavar="DURATION", help="With --folds: each fold's training time, as train-project's.")
@click.option("--top", type=click.IntRange(min=1), metavar="N",
              help="List the N labels most likely a mistake  [default: those with a probability of 0.5 or more, "
                   "no more than the estimated number of label errors].")
@click.option("--min-probability", type=click.FloatRange(0.0, 1.0), metavar="P",
              help="List the labels whose estimated probability of being a mistake is P or more (with --top: "
                   "the first N of them).")
@_BATCH_SIZE
@click.option("--apply", "apply_file", type=click.Path(dir_okay=False, path_type=str),
              help="Apply the rows of FILE (audit.csv's format: the page's export, or a copy of audit.csv without "
                   "the rejected rows) to the posts table, after a backup of the database.")
@click.option("--dry-run", is_flag=True, help="With --apply: list each change (post, tag, add or remove, caption "
                                               "file), then the totals; change nothing.")
@click.option("--captions", type=click.Path(file_okay=False, path_type=str),
              help="With --apply: the folder import-images read; the pictures' caption files are brought in line "
                   "with the rows, also where the database already holds them.")
@click.option("--caption-extension", default=".txt", show_default=True, help="With --captions: their extension.")
@click.option("--caption-separator", default=",", show_default=True,
              help="With --captions: the string between their tags, as import-images read them.")
def audit(project_path, folds, model_path, time_limit, top, min_probability, batch_size, apply_file, dry_run,
          captions, caption_extension, caption_separator):
    """Rank the tags of PROJECT_PATH's posts most likely wrong or missing (PROJECT_PATH/audit.csv, audit.html).

    Scores come from models that did not train on the post (--folds K or --model-path); each label gets the
    probability that it is a mistake, from those scores and the post's other tags, calibrated tag by tag on
    the posts. docs/audit.md.
    """
    if apply_file is None:
        if dry_run or captions is not None:
            raise click.UsageError("--dry-run and --captions go with --apply FILE")
        from deepdanbooru.audit.main import run_audit
        from deepdanbooru.training.budget import parse_duration

        seconds = parse_duration(time_limit) if time_limit is not None else None
        run_audit(project_path, folds=folds, model_path=model_path, time_limit=seconds, time_limit_text=time_limit,
                  top=top, min_probability=min_probability, batch_size=batch_size, echo=click.echo)
        return
    if folds is not None or model_path is not None or time_limit is not None or top is not None or \
            min_probability is not None:
        raise click.UsageError("--apply applies a file of an earlier audit; it takes no --folds, --model-path, "
                               "--time-limit, --top or --min-probability")
    from deepdanbooru.audit.apply import apply_audit

    apply_audit(project_path, apply_file, dry_run=dry_run, captions=captions, caption_ext=caption_extension,
                caption_separator=caption_separator, echo=click.echo)


@main.command("data-service")
@click.argument("role", type=click.Choice(["dispatcher", "worker"]))
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="The port to listen on [default: dispatcher 5050, worker any free port].")
@click.option("--dispatcher", metavar="HOST:PORT", help="worker: the dispatcher to serve.")
@click.option("--host", metavar="NAME",
              help="The name or address the trainer reaches this host by [default: its host name].")
def data_service(role, port, dispatcher, host):
    """Run a tf.data service dispatcher or worker: other hosts' CPUs make the training batches.

    Set "data_service": "HOST:PORT" (the dispatcher) in project.json; workers read
    the images at the same paths as the trainer. See docs/distributed.md.
    """
    if role == "worker" and not dispatcher:
        raise click.UsageError("a worker needs --dispatcher HOST:PORT")
    if role == "dispatcher" and dispatcher:
        raise click.UsageError("--dispatcher is for workers")
    from deepdanbooru.pipeline.service import DEFAULT_PORT, serve

    serve(role, port=DEFAULT_PORT if port is None and role == "dispatcher" else port or 0, dispatcher=dispatcher,
          host=host, echo=click.echo)


def run():
    """The console entry point (and `python -m deepdanbooru`).

    After a command that loaded TensorFlow, the interpreter's own shutdown spends ~2 s tearing down
    TensorFlow's objects and threads with nothing left to save (measured after train-project,
    docs/performance.md). Every file is closed and the lock released by then, so once our output
    is flushed the process leaves at once. Tests that call `main` directly are not affected.
    """
    try:
        main(prog_name="deepdanbooru")
        code = 0
    except SystemExit as done:
        code = done.code
    if "tensorflow" not in sys.modules:
        sys.exit(code)
    _exit_now(code)


def _exit_now(code) -> None:
    """sys.exit's meaning of `code`, without the interpreter's shutdown."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
