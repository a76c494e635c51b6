"""A fuzz of the live server: hypothesis drives 500 hostile requests against a real `multispec serve` (a
subprocess on localhost, the default pair). The machinery is the benchmark's (`benchmarks/serve_fuzz.py`,
which runs longer fuzzes); see it for the checks each answer gets."""

import importlib.util
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "serve_fuzz", Path(__file__).resolve().parents[2] / "benchmarks" / "serve_fuzz.py"
)
serve_fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_fuzz)

RSS_LIMIT = 6 * 2**30  # the default pair in bfloat16 holds about 1.5 GiB; every request is bounded far below this
FOLDER = tempfile.mkdtemp(prefix="multispec-fuzz-")
PLANTED = serve_fuzz.Planted(FOLDER)


@pytest.fixture(scope="module")
def fuzz():
    server = serve_fuzz.ServerProcess(*serve_fuzz.SERVER_ARGS)
    try:
        yield serve_fuzz.Fuzz(server, PLANTED, RSS_LIMIT)
    finally:
        server.stop()


@settings(max_examples=500, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=serve_fuzz.bodies(PLANTED.paths, 8))
def test_hostile_requests_get_a_2xx_or_a_4xx_and_leave_the_server_well(fuzz, case):
    fuzz.send(*case)


def test_the_fuzz_ran_its_requests(fuzz):
    summary = fuzz.summary()
    print("\nfuzz:", summary)
    assert summary["requests"] >= 500
    assert sum(v for k, v in summary["statuses"].items() if k.startswith("2")) >= 20  # some requests generated
