"""Every list of image formats and extensions is derived from deepdanbooru.formats."""

from deepdanbooru import formats
from deepdanbooru.dataset import import_images
from deepdanbooru.inference.targets import DEFAULT_FOLDER_FILTERS
from deepdanbooru.project import config


def test_derived_lists_keep_their_documented_values():
    assert formats.IMAGE_EXTENSIONS == ("png", "jpg", "jpeg", "gif", "webp", "bmp")
    assert formats.DEEPDANBOORU_EXTENSIONS == ("png", "jpg", "jpeg")
    assert DEFAULT_FOLDER_FILTERS == ("*.[Pp][Nn][Gg],*.[Jj][Pp][Gg],*.[Jj][Pp][Ee][Gg],*.[Gg][Ii][Ff],"
                                      "*.[Ww][Ee][Bb][Pp],*.[Bb][Mm][Pp]")
    assert formats.EXTENSION_BY_PILLOW_NAME["MPO"] == "jpg"
    assert formats.stored_extensions("jpeg") == ("jpg", "jpeg", "jpe", "jfif")


def test_every_format_of_the_table_is_known_to_the_graph_and_the_cli():
    from click.testing import CliRunner

    from deepdanbooru.cli import main
    from deepdanbooru.pipeline.header import FORMAT_NAMES

    assert FORMAT_NAMES == ("unknown", *(f.name for f in formats.IMAGE_FORMATS))
    assert import_images.DEFAULT_EXTENSIONS == formats.IMAGE_EXTENSIONS
    assert config.KEY_BY_NAME["image_extensions"].default == formats.DEEPDANBOORU_EXTENSIONS
    help_text = CliRunner().invoke(main, ["make-sample-dataset", "--help"]).output
    assert "[png|jpg|gif|webp|bmp]" in help_text
