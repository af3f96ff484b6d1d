"""Sphinx directives that render reference pages from the code at build time.

``mqserver-options`` lists every ``twistd mqserver`` option from
``mqserver.tap.Options`` (plugins' options included), and ``mqserver-http-api``
lists every HTTP endpoint from the same route table ``/openapi.json`` is
generated from.  Written by hand, these pages would drift from the code the
first time someone added an option or a route; generated, they cannot.

Nodes are built directly rather than by emitting reStructuredText, so option
help and route summaries need no escaping.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx


def _paragraph(text: str) -> nodes.paragraph:
    return nodes.paragraph(text=" ".join(text.split()))


def _item(term: list[nodes.Node], *body: nodes.Node) -> nodes.definition_list_item:
    return nodes.definition_list_item(
        "", nodes.term("", "", *term), nodes.definition("", *body)
    )


def option_rows() -> list[tuple[str, str | None, str | None, str]]:
    """(long name, short name, default or None, help) for every option, sorted by name.

    Parameters and flags come from the Options tables; options implemented as
    ``opt_*`` methods (``--protocol``, ``--version``) from their docstrings,
    which are what ``--help`` prints too.
    """
    from mqserver.tap import Options

    rows: list[tuple[str, str | None, str | None, str]] = []
    for long, short, default, doc, *_ in Options.optParameters:
        rows.append((long, short, "" if default is None else str(default), doc))
    for long, short, doc in Options.optFlags:
        rows.append((long, short, None, doc))
    aliases = {}
    for name, method in inspect.getmembers(Options, inspect.isfunction):
        if name.startswith("opt_"):
            aliases.setdefault(method, []).append(name[4:])
    for method, names in aliases.items():
        if method.__qualname__.startswith("Options.") and method.__doc__:
            long = max(names, key=len)
            short = min(names, key=len) if len(names) > 1 else None
            rows.append((long.replace("_", "-"), short, None, inspect.cleandoc(method.__doc__)))
    return sorted(rows)


class OptionsDirective(Directive):
    """``.. mqserver-options::``: every option of ``twistd mqserver`` with its default."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        items = nodes.definition_list()
        for long, short, default, doc in option_rows():
            term: list[nodes.Node] = [nodes.literal(text=f"--{long}")]
            if short:
                term += [nodes.Text(", "), nodes.literal(text=f"-{short}")]
            body: list[nodes.Node] = [_paragraph(doc)]
            if default:
                body.append(nodes.paragraph("", "Default: ", nodes.literal(text=default)))
            items += _item(term, *body)
        return [items]


def _json_block(value: Any) -> nodes.literal_block:
    block = nodes.literal_block(text=json.dumps(value, indent=2, sort_keys=True))
    block["language"] = "json"
    return block


class HTTPAPIDirective(Directive):
    """``.. mqserver-http-api::``: every endpoint of the OpenAPI spec, grouped by tag."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from mqserver.web.app import all_routes
        from mqserver.web.openapi import spec

        document = spec(all_routes())
        by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
        for path, methods in document["paths"].items():
            for method, operation in methods.items():
                tag = operation.get("tags", ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method.upper(), operation))
        result: list[nodes.Node] = [_paragraph(document["info"]["description"])]
        for tag in sorted(by_tag):
            result.append(nodes.rubric(text=tag.capitalize()))
            items = nodes.definition_list()
            for path, method, operation in by_tag[tag]:
                items += _item([nodes.literal(text=f"{method} {path}")],
                               *self._operation(operation))
            result.append(items)
        result.append(nodes.rubric(text="Schemas"))
        schemas = nodes.definition_list()
        for name, schema in sorted(document["components"]["schemas"].items()):
            schemas += _item([nodes.literal(text=name)], _json_block(schema))
        result.append(schemas)
        return result

    def _operation(self, operation: dict[str, Any]) -> list[nodes.Node]:
        body: list[nodes.Node] = [_paragraph(operation["summary"])]
        schemes = {name for requirement in operation.get("security", [])
                   for name in requirement}
        if schemes == {"token"}:
            body.append(_paragraph("Needs the bearer token (--http-token)."))
        elif schemes:
            body.append(_paragraph("Needs the bearer token (--http-token) "
                                   "or the read token (--http-read-token)."))
        else:
            body.append(_paragraph("Open: needs no token."))
        params = nodes.bullet_list()
        for param in operation.get("parameters", []):
            text = f" ({param['in']})"
            if param.get("description"):
                text += f": {param['description']}"
            params += nodes.list_item("", nodes.paragraph(
                "", "", nodes.literal(text=param["name"]), nodes.Text(text)))
        if len(params):
            body += [_paragraph("Parameters:"), params]
        request = operation.get("requestBody")
        if request:
            [(kind, content)] = request["content"].items()
            body += [_paragraph(f"Request body ({kind}):"), _json_block(content["schema"])]
        answers = nodes.bullet_list()
        for status, response in operation["responses"].items():
            answers += nodes.list_item("", nodes.paragraph(
                "", "", nodes.literal(text=status), nodes.Text(f": {response['description']}")))
        body += [_paragraph("Responses:"), answers]
        return body


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("mqserver-options", OptionsDirective)
    app.add_directive("mqserver-http-api", HTTPAPIDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
