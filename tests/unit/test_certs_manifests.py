"""Writing the caBundle into webhook configurations changes those values and nothing else."""

from __future__ import annotations

import pytest
import yaml

from certs.manifests import ManifestError, set_ca_bundle

BUNDLE = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="


def mutating(*webhooks: str, header: str = "") -> str:
    body = "".join(webhooks)
    return (
        f"{header}apiVersion: admissionregistration.k8s.io/v1\n"
        "kind: MutatingWebhookConfiguration\n"
        "metadata:\n"
        "  name: tessera  # the one webhook configuration\n"
        f"webhooks:\n{body}"
    )


def webhook(name: str, client_config: str) -> str:
    return f"  - name: {name}\n    clientConfig:\n{client_config}    sideEffects: None\n"


SERVICE = "      service: {name: tessera-webhook, namespace: tessera-system, path: /mutate}\n"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param('      caBundle: ""\n', f'      caBundle: "{BUNDLE}"\n', id="double-quoted"),
        pytest.param("      caBundle: ''\n", f"      caBundle: '{BUNDLE}'\n", id="single-quoted"),
        pytest.param("      caBundle: Cg==\n", f"      caBundle: {BUNDLE}\n", id="plain"),
        pytest.param("      caBundle:\n", f"      caBundle: {BUNDLE}\n", id="empty"),
        pytest.param(
            "      caBundle: Cg==  # filled by make certs\n",
            f"      caBundle: {BUNDLE}  # filled by make certs\n",
            id="trailing-comment",
        ),
        pytest.param(
            "      caBundle: >-\n        Cg==\n        Cg==\n",
            f"      caBundle: {BUNDLE}\n",
            id="folded-block",
        ),
        pytest.param("", f"      caBundle: {BUNDLE}\n", id="absent"),
    ],
)
def test_each_spelling_of_ca_bundle_is_replaced_in_place(before: str, after: str) -> None:
    header = "# Tessera's webhook: see README\n---\n"
    original = mutating(webhook("mutate.tessera.dev", before + SERVICE), header=header)
    patched = set_ca_bundle(original, BUNDLE)
    assert patched.text == mutating(webhook("mutate.tessera.dev", after + SERVICE), header=header)
    assert patched.webhooks == 1


@pytest.mark.parametrize(
    ("client_config", "expected"),
    [
        ('{caBundle: "", url: "https://x"}', f'{{caBundle: "{BUNDLE}", url: "https://x"}}'),
        ('{url: "https://x"}', f'{{caBundle: {BUNDLE}, url: "https://x"}}'),
        ("{}", f"{{caBundle: {BUNDLE}}}"),
    ],
)
def test_flow_style_client_config(client_config: str, expected: str) -> None:
    text = mutating(f"  - name: a\n    clientConfig: {client_config}\n")
    assert set_ca_bundle(text, BUNDLE).text == mutating(
        f"  - name: a\n    clientConfig: {expected}\n"
    )


def test_every_webhook_of_every_configuration_and_nothing_else() -> None:
    other = (
        "---\n# a validating one is not ours to touch\n"
        "kind: ValidatingWebhookConfiguration\n"
        "webhooks:\n  - name: v\n    clientConfig:\n      caBundle: keep-me\n"
        "---\nkind: ConfigMap\ndata:\n  caBundle: keep-me-too\n"
    )
    text = (
        mutating(
            webhook("a", '      caBundle: ""\n' + SERVICE),
            webhook("b", "      caBundle: old\n" + SERVICE),
        )
        + other
        + "---\n"
        + mutating(webhook("c", SERVICE))
    )
    patched = set_ca_bundle(text, BUNDLE)
    assert patched.webhooks == 3
    assert patched.text.count(BUNDLE) == 3
    assert patched.text.endswith(
        other + "---\n" + mutating(webhook("c", f"      caBundle: {BUNDLE}\n" + SERVICE))
    )
    documents = list(yaml.safe_load_all(patched.text))
    bundles = [w["clientConfig"].get("caBundle") for d in documents for w in d.get("webhooks", [])]
    assert bundles == [BUNDLE, BUNDLE, "keep-me", BUNDLE]
    assert "# the one webhook configuration" in patched.text


def test_patching_twice_changes_nothing_the_second_time() -> None:
    once = set_ca_bundle(mutating(webhook("a", SERVICE)), BUNDLE).text
    assert set_ca_bundle(once, BUNDLE).text == once


def test_a_webhook_without_client_config_is_noted_and_left_alone() -> None:
    text = mutating("  - name: lonely\n    sideEffects: None\n")
    patched = set_ca_bundle(text, BUNDLE)
    assert (patched.text, patched.webhooks) == (text, 0)
    assert patched.notes == ("webhook lonely: no clientConfig, left alone",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [unclosed\n", "not valid YAML"),
        (
            mutating(webhook("a", "      caBundle: {x: 1}\n")),
            "webhook a: caBundle is not a plain value",
        ),
    ],
)
def test_what_cannot_be_edited_is_an_error(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        set_ca_bundle(text, BUNDLE)
