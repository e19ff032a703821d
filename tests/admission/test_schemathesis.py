"""Property-based API testing: schemathesis drives every route of `/openapi.json` against the real stack.

The stack (nats-server, placement, admission, and two engine hosts heartbeating into
`sf_engines`) runs on its own event loop in a thread, because schemathesis calls the
API synchronously. Every response must be a documented status with a body matching its
schema and content type, never a 5xx.
"""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from services.admission.openapi import OPENAPI
from tests.support.admission import ADMIN_TOKEN, admission_config
from tests.support.threaded_stack import ThreadedStack

# A schema-valid create may still be refused: 422 for a contract incoherent with itself or with the
# backends the fleet measures (rules a static JSON Schema cannot state), 429 while the queue is full.
# An invalid body too large to read is refused 413 before it is looked at: a rejection like a 400.
CONFIG = SchemathesisConfig.from_dict({"checks": {
    "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "422", "429"]},
    "negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "405", "406", "409", "413",
                                                      "415", "422", "428", "429", "5xx"]}}})
# The operator's move needs fence's session log and the mover, which this stack does not run; its
# route and document agree by tests/admission/test_openapi_routes.py, and the browser tests move for real.
schema = schemathesis.openapi.from_dict(OPENAPI, config=CONFIG).exclude(
    path="/v1/admin/sessions/{session_id}/move")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = ThreadedStack(tmp_path_factory.mktemp("nats"), busy={"h0": 0.5, "h1": 0.8},
                      admission=lambda url: admission_config(url, queue_capacity=4, queue_timeout_s=1.0,
                                                             reservation_settle_s=1.0))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http_session():
    with requests.Session() as session:
        yield session


@schema.parametrize()
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case, stack, http_session):
    case.call_and_validate(base_url=stack.base_url, session=http_session,
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def test_served_document_is_the_one_tested(stack, http_session):
    assert http_session.get(f"{stack.base_url}/openapi.json").json() == OPENAPI
