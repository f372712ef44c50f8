"""docs/project-json.md is rendered from the key table, so the reference cannot drift from the code.

    python -m deepdanbooru.project.reference > docs/project-json.md
"""

from __future__ import annotations

import json

from deepdanbooru.project.config import KEYS, NEW_PROJECT_OVERRIDES
from deepdanbooru.project.recipes import DEFAULT_RECIPE, RECIPES

HEADER = """# project.json reference

Generated from `deepdanbooru/project/config.py` by
`python -m deepdanbooru.project.reference > docs/project-json.md`; a test fails
when this file and the code disagree.

Every key is optional. A missing key takes its default, and the defaults of
the keys marked *ours* keep a DeepDanbooru 1.0 project training exactly as it
did. An unknown key close to a known one (`minibatch_sise`), or another tool's
name for one (`epochs`, `lr`, `image_size`, `batch_size`), is an error naming
both, since training would otherwise run on the default; an unrelated unknown
key is a warning. A bad value stops every command that uses the key with one
line naming the file, the key and the value (a command that does not use it,
such as `make-tags` for `model`, warns and goes on); every such problem of
the file is named at once (`3 problems: ...; ...; ...`). Integers must be JSON
integers (`true`, `32.0` and `"32"` are refused); NaN and infinities are
refused everywhere, naming the key.

| key | type | default | valid values | meaning |
|---|---|---|---|---|
"""

FOOTER = """
`create-project` writes DeepDanbooru's keys above in this order (without
`learning_rates`) plus {overrides}.
`create-project --recipe NAME` lays a recipe's values over those (the default,
`{default}`, is DeepDanbooru's and changes nothing); [quality.md](quality.md)
has how they were chosen and what they measured:

{recipes}

A relative `database_path` is resolved against the project directory. The
dataset's `images/` folder sits beside the SQLite file.
"""


def _default(key) -> str:
    if key.name == "learning_rates":
        return "absent"
    value = list(key.default) if isinstance(key.default, tuple) else key.default
    return f"`{json.dumps(value)}`"


def render() -> str:
    rows = []
    for key in KEYS:
        origin = "" if key.spec else " *(ours)*"
        rows.append(f"| `{key.name}`{origin} | {key.type_name} | {_default(key)} | {key.valid} | {key.meaning} |")
    overrides = ", ".join(f"`{name}: {json.dumps(value)}`" for name, value in NEW_PROJECT_OVERRIDES.items())
    recipes = "\n".join(
        f"- `{name}`: " + (", ".join(f"`{key}: {json.dumps(value)}`" for key, value in values.items()) or "nothing")
        for name, values in RECIPES.items())
    return HEADER + "\n".join(rows) + "\n" + FOOTER.format(overrides=overrides, default=DEFAULT_RECIPE,
                                                             recipes=recipes)


if __name__ == "__main__":
    print(render(), end="")
