"""A workload whose fields have the wrong JSON type is denied as invalid, not a 500.

kube-apiserver decodes a Job or Pod into its Go types before admission, so it never
sends these; anyone who reaches the webhook's port can. Found by ``tests/fuzz``: each
case is a golden review with one field given another type, which raised out of the
rules (``ValueError``, ``TypeError``, ``AttributeError``) and so out of the handler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio
from cluster.files import load_objects
from webhook.policy_build import policy_from_objects
from webhook.review_flow import review
from webhook.rules.outcome import AdmitConfig

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "webhook"
POLICY = policy_from_objects(load_objects(GOLDEN / "policy.yaml"))
CONFIG = AdmitConfig(managed_namespaces=frozenset({"team-sandbox"}))
TEMPLATE_SPEC = ("spec", "template", "spec")
REQUIRED = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
TERMS = (*TEMPLATE_SPEC, *REQUIRED, "nodeSelectorTerms")


@pytest.mark.parametrize(
    ("case", "path", "value", "said"),
    [
        pytest.param(
            "job-capture", (*TEMPLATE_SPEC, "affinity"), [["x"]], "affinity", id="affinity-a-list"
        ),
        pytest.param(
            "job-flavor-user-affinity",
            (*TEMPLATE_SPEC, "affinity", "nodeAffinity"),
            [["x"]],
            "nodeAffinity",
            id="node-affinity-a-list",
        ),
        pytest.param(
            "job-flavor-user-affinity", TERMS, 7, "nodeSelectorTerms", id="terms-a-number"
        ),
        pytest.param(
            "job-flavor-user-affinity",
            (*TERMS, 0, "matchExpressions"),
            {"a": 1},
            "matchExpressions",
            id="expressions-an-object",
        ),
        pytest.param(
            "job-flavor-user-affinity",
            (*TERMS, 0, "matchExpressions"),
            "x",
            "matchExpressions",
            id="expressions-a-string",
        ),
        pytest.param(
            "job-reinvoked",
            ("spec", "template", "metadata", "labels"),
            "x",
            "labels",
            id="template-labels-a-string",
        ),
        pytest.param(
            "job-reinvoked",
            ("spec", "template", "metadata", "annotations"),
            [["x"]],
            "annotations",
            id="template-annotations-a-list",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_denied_as_invalid(
    case: str, path: tuple[str | int, ...], value: object, said: str
) -> None:
    review_ = jsonio.loads((GOLDEN / f"{case}.request.json").read_bytes())
    node: Any = review_["request"]["object"]
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    outcome = review(jsonio.dumps(review_), POLICY, CONFIG)
    assert outcome.status == 200
    response = jsonio.loads(outcome.body)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert said in response["status"]["message"]
