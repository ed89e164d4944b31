"""Field tables of the messages a plugin sees, generated from their classes so the docs cannot drift.

Each table sits in a Markdown file between `<!-- fields:Name -->` and `<!-- /fields -->`; `render(text)` fills
every such block from `pipeline.messages.Name` (a field's type as written, its default, and the docstring under
it), and `python -m pipeline.message_docs docs/plugins.md` rewrites the file (`--check`: exit 1 if it is stale,
which `tests/docs/test_plugins_doc.py` asserts it is not).
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import msgspec

from pipeline import messages

BLOCK = re.compile(r"(<!-- fields:(\w+) -->\n)(.*?)(<!-- /fields -->)", re.S)


def field_docs(cls: type) -> dict[str, tuple[str, str]]:
    """`{field: (annotation as written, the docstring under it)}` from the class's source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, tuple[str, str]] = {}
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            doc = ""
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                doc = " ".join(after.value.value.split())
            out[stmt.target.id] = (ast.unparse(stmt.annotation), doc)
    return out


def _default(field: msgspec.structs.FieldInfo) -> str:
    if field.default is not msgspec.NODEFAULT:
        return f"`{field.default!r}`"
    if field.default_factory is not msgspec.NODEFAULT:
        return f"`{field.default_factory()!r}`"
    return "required"


def field_table(cls: type) -> str:
    """A Markdown table of the Struct `cls`'s fields, in wire order."""
    docs = field_docs(cls)
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for field in msgspec.structs.fields(cls):  # type: ignore[arg-type]
        annotation, doc = docs.get(field.name, ("", ""))
        meaning = doc.replace("|", r"\|")
        rows.append(f"| `{field.name}` | `{annotation.replace('|', 'or')}` | {_default(field)} | {meaning} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with every `<!-- fields:Name -->` block holding `pipeline.messages.Name`'s table."""

    def fill(match: re.Match[str]) -> str:
        cls = getattr(messages, match.group(2), None)
        if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
            raise LookupError(f"<!-- fields:{match.group(2)} -->: no such message in pipeline.messages")
        return match.group(1) + field_table(cls) + match.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"]
    stale = []
    for path in paths:
        text = path.read_text()
        fresh = render(text)
        if fresh != text:
            stale.append(str(path))
            if not check:
                path.write_text(fresh)
    if check and stale:
        print(f"stale message field tables in {', '.join(stale)}: run python -m pipeline.message_docs {' '.join(stale)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
