"""The command line: a thin click group.

Each command parses its options and calls one function of a room, imported
inside the command so that `deepdanbooru --help`, create-project and preflight
never import TensorFlow. User errors become one stderr line and exit code 2
here, and only here.
"""

from __future__ import annotations

import sys
import warnings

import click

from deepdanbooru import __version__
from deepdanbooru.errors import UserError


class _Group(click.Group):
    """Maps UserError to a one-line message; a traceback only with --debug."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as error:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {error}", err=True)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


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


@main.command("create-project")
@click.argument("project_path", type=click.Path(file_okay=False, path_type=str))
@click.option("--force", is_flag=True, help="Overwrite an existing project.json.")
def create_project(project_path, force):
    """Create PROJECT_PATH with a default project.json."""
    from deepdanbooru.project.create import create_project as create

    create(project_path, force=force, echo=click.echo)


@main.command("make-sample-dataset")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--count", default=200, show_default=True, type=click.IntRange(min=1), help="Number of posts.")
@click.option("--size", default=64, show_default=True, type=click.IntRange(min=16), help="Image side in pixels.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Same seed, same files.")
@click.option("--format", "image_format", default="jpg", show_default=True,
              type=click.Choice(["jpg", "png", "webp", "gif", "bmp"]), help="Image file format.")
@click.option("--overwrite", is_flag=True, help="Replace an existing dataset.sqlite and tags.txt.")
def make_sample_dataset(directory, count, size, seed, image_format, overwrite):
    """Write a synthetic DeepDanbooru-layout dataset (SQLite + images + tags.txt) to DIRECTORY."""
    from deepdanbooru.sample.generator import generate_sample_dataset

    database, tags = generate_sample_dataset(directory, count=count, size=size, seed=seed,
                                             image_format=image_format, overwrite=overwrite)
    click.echo(f"Wrote {count} posts with {len(tags)} tags: {database}")
    click.echo(f"Vocabulary: {database.parent / 'tags.txt'}")
    click.echo(f"Use it in a project: set database_path to {database.resolve()} and copy tags.txt beside project.json")


def run():
    main(prog_name="deepdanbooru")


if __name__ == "__main__":
    run()
