"""Writes docs/cli.md from the command line itself: `python -m deepdanbooru.cli_reference > docs/cli.md`.

Apart from cli_vocabulary so that module never imports cli.py, which imports it.
"""

from deepdanbooru.cli import main
from deepdanbooru.cli_vocabulary import render

if __name__ == "__main__":
    print(render(main), end="")
