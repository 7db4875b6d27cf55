"""Writing the ``caBundle`` into MutatingWebhookConfiguration YAML, leaving all else as is.

Layer: PURE (text in, text out). Must not touch files: ``certs.store`` reads and writes.

Admins keep comments and layout in their manifests, and a YAML dump would lose both, so
this is a textual edit: PyYAML's composer gives the exact character span of every
``caBundle`` value and only those spans are replaced. The result is then parsed again
and compared with the original parsed with the new caBundle put in by value, so an edit
that changed anything else (or missed a webhook) is an error, never a silent corruption.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

KIND = "MutatingWebhookConfiguration"


class ManifestError(ValueError):
    """The text is not YAML, or a webhook's caBundle cannot be written in place."""


@dataclass(frozen=True, slots=True)
class BundlePatch:
    text: str
    webhooks: int
    """How many webhooks now carry the caBundle (whether or not their value changed)."""
    notes: tuple[str, ...]
    """Webhooks left alone, and why (no ``clientConfig``)."""


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int
    end: int
    text: str


def set_ca_bundle(text: str, ca_bundle: str) -> BundlePatch:
    """Set ``clientConfig.caBundle`` of every webhook of every MutatingWebhookConfiguration."""
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ManifestError(f"not valid YAML: {_one_line(exc)}") from None
    edits: list[_Edit] = []
    notes: list[str] = []
    webhooks = 0
    for document in documents:
        for position, webhook in enumerate(_webhooks(document)):
            label = _scalar(_get(webhook, "name")) or f"#{position + 1}"
            client_config = _get(webhook, "clientConfig")
            if not isinstance(client_config, MappingNode):
                notes.append(f"webhook {label}: no clientConfig, left alone")
                continue
            edits.append(_edit(client_config, ca_bundle, text, label))
            webhooks += 1
    patched = text
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        patched = patched[: edit.start] + edit.text + patched[edit.end :]
    _check(text, patched, ca_bundle)
    return BundlePatch(text=patched, webhooks=webhooks, notes=tuple(notes))


def _webhooks(document: Node | None) -> list[MappingNode]:
    if not isinstance(document, MappingNode) or _scalar(_get(document, "kind")) != KIND:
        return []
    items = _get(document, "webhooks")
    if not isinstance(items, SequenceNode):
        return []
    return [item for item in items.value if isinstance(item, MappingNode)]


def _edit(client_config: MappingNode, ca_bundle: str, text: str, label: str) -> _Edit:
    value = _get(client_config, "caBundle")
    if value is None:
        return _insert(client_config, ca_bundle, text)
    if not isinstance(value, ScalarNode):
        raise ManifestError(f"webhook {label}: caBundle is not a plain value")
    start, end = value.start_mark.index, value.end_mark.index
    if value.style in ('"', "'"):
        return _Edit(start, end, f"{value.style}{ca_bundle}{value.style}")
    if value.style in ("|", ">"):
        # A block scalar's span runs to the start of the next line: keep its line breaks.
        original = text[start:end]
        return _Edit(start, end, ca_bundle + original[len(original.rstrip()) :])
    if start == end:  # `caBundle:` with nothing after the colon
        return _Edit(start, end, f" {ca_bundle}")
    return _Edit(start, end, ca_bundle)


def _insert(client_config: MappingNode, ca_bundle: str, text: str) -> _Edit:
    """A new ``caBundle`` key, placed before the first key so it inherits the indentation."""
    if not client_config.value:
        start, end = client_config.start_mark.index, client_config.end_mark.index
        if text[start:end].replace(" ", "") != "{}":
            raise ManifestError("clientConfig is empty and not written as {}")
        return _Edit(start, end, f"{{caBundle: {ca_bundle}}}")
    first_key = client_config.value[0][0]
    at = first_key.start_mark.index
    if client_config.flow_style:
        return _Edit(at, at, f"caBundle: {ca_bundle}, ")
    return _Edit(at, at, f"caBundle: {ca_bundle}\n{' ' * first_key.start_mark.column}")


def _check(original: str, patched: str, ca_bundle: str) -> None:
    expected = list(yaml.safe_load_all(original))
    for document in expected:
        if isinstance(document, dict) and document.get("kind") == KIND:
            for webhook in document.get("webhooks") or []:
                if isinstance(webhook, dict) and isinstance(webhook.get("clientConfig"), dict):
                    webhook["clientConfig"]["caBundle"] = ca_bundle
    try:
        actual = list(yaml.safe_load_all(patched))
    except yaml.YAMLError as exc:
        raise ManifestError(f"could not edit in place (result: {_one_line(exc)})") from None
    if actual != expected:
        raise ManifestError("could not edit the caBundle in place without changing other values")


def _get(mapping: MappingNode, key: str) -> Node | None:
    for key_node, value_node in mapping.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value_node if isinstance(value_node, Node) else None
    return None


def _scalar(node: Node | None) -> str | None:
    return node.value if isinstance(node, ScalarNode) else None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
