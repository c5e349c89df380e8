"""The operator authenticates its outcome posts with its ServiceAccount token (issue #16): the
real client against the real estimator service guarded by a TokenReview server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import functools
import pathlib

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service, work
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import planner
from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, resources, settings
from gpuplan_testing import tokenreviews as tr
from gpuplan_testing.operator_builders import LocalServer

PLAN = resources.StatusPlan(
    gpu_type="NVIDIA-L4", device="l4", gpu_count=1, gpus_per_node=1, nodes=1,
    estimated_seconds=100.0, step_time_ms=10.0, memory_bytes_per_gpu=2**30, cost_usd=1.0,
    predictor="roofline", observed_generation=1,
)


def guarded_estimator(db_url: str, api_url: str) -> object:
    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                     predictor=roofline.RooflinePredictor(),
                                     predictor_source="roofline")
    return service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                            service.ServiceSettings(bundle_poll_s=3600, workers=1),
                            outcome_sink=serving.perfdb_outcome_sink(db_url),
                            outcome_history=serving.perfdb_outcome_history(db_url),
                            write_guard=tr.guard_for(api_url, ttl_s=0))


def test_outcomes_carry_the_current_service_account_token(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    token = tmp_path / "token"

    async def report(base: str, uid: str, token_file: str) -> None:
        body = estimator_client.build_outcome(job_uid=uid, plan=PLAN, actual_seconds=120.0)
        await estimator_client.report_outcome(base, body, timeout_seconds=30,
                                              token_file=token_file)

    async def main() -> list[str]:
        async with tr.serving(tr.FakeApiServer()) as api, \
                LocalServer(guarded_estimator(url, api.url)) as srv:  # type: ignore[arg-type]
            token.write_text("operator-token\n")
            await report(srv.url, "first", str(token))
            # The kubelet rotates projected tokens: the next post reads the new one.
            api.users = {"rotated-token": tr.OPERATOR}
            token.write_text("rotated-token")
            await report(srv.url, "second", str(token))
            failures = []
            for uid, token_file, content in [
                    ("tenant", str(token), "tenant-token"),
                    ("absent", str(tmp_path / "no-such-file"), None),
                    ("disabled", "", None)]:
                if content is not None:
                    api.users[content] = tr.TENANT
                    token.write_text(content)
                with pytest.raises(errors.EstimatorUnavailableError) as failed:
                    await report(srv.url, uid, token_file)
                failures.append(str(failed.value))
            return failures

    failures = asyncio.run(main())
    assert list(PerfStore.open(url).job_outcomes()["job_uid"]) == ["first", "second"]
    # The estimator's reason reaches the operator's warning event.
    assert "(403)" in failures[0] and tr.TENANT in failures[0]
    assert all("(401)" in f and "Bearer" in f for f in failures[1:])


def test_the_token_file_is_a_setting_with_the_in_pod_default() -> None:
    default = settings.Settings(estimator_url="http://e:8080").validate()
    assert default.estimator_token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    got = settings.Settings.from_env({"GPUPLAN_ESTIMATOR_URL": "http://e:8080",
                                      "GPUPLAN_ESTIMATOR_TOKEN_FILE": "/t/token"})
    assert got.estimator_token_file == "/t/token"


@pytest.mark.parametrize(("content", "headers"), [
    ("abc.def\n", {"Authorization": "Bearer abc.def"}),
    (None, {}),
])
def test_bearer_headers(tmp_path: pathlib.Path, content: str | None,
                        headers: dict[str, str]) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    assert estimator_client.bearer_headers(str(path)) == headers
    assert estimator_client.bearer_headers("") == {}
    path.write_text("  \n")
    with pytest.raises(errors.EstimatorUnavailableError, match="no ServiceAccount token"):
        estimator_client.bearer_headers(str(path))
