"""Issue 42: what a shared server's per-model port lets through (triton/route.py), as rules."""
import pytest

from rankops.triton.route import RouteError, allowed, checked_routes, parse_routes


@pytest.mark.parametrize("path", [
    "/v2/models/coarse", "/v2/models/coarse/infer", "/v2/models/coarse/ready", "/v2/models/coarse/config",
    "/v2/models/coarse/versions/3/infer", "/v2/models/coarse/stats?x=1", "/v2/health/ready", "/v2/health/live", "/v2"])
def test_the_members_paths_and_the_health_checks_pass(path):
    assert allowed(path, "coarse")


@pytest.mark.parametrize("path", [
    "/v2/models/fine/infer", "/v2/models/coarse2/infer", "/v2/models/coarse/../fine/infer", "/v2/models/./coarse",
    "/v2/models//coarse", "/v2/models/coars%65/infer", "/v2/models/coarse%2F..%2Ffine/infer",
    "/v2/models\\fine", "/v2/repository/index", "/v2/repository/models/coarse/load", "/v2/repository/models/fine/unload",
    "/v2/systemsharedmemory/region/x/register", "/v2/cudasharedmemory/status", "/v2/trace/setting",
    "/v2/logging", "/metrics", "", "v2/models/coarse", "/v2/health", "/v2/health/ready/"])
def test_everything_else_is_refused(path):
    assert not allowed(path, "coarse")


def test_routes_are_checked_whole():
    assert parse_routes('{"8100": "coarse", "8101": "fine"}') == {8100: "coarse", 8101: "fine"}
    for bad in ('{"80": "coarse"}', '{"8100": "../x"}', '{"x": "coarse"}', '[1]', 'nope', '{"8100": 5}'):
        with pytest.raises(RouteError):
            parse_routes(bad)
    assert checked_routes({"8100": "a.b-c_d"}) == {8100: "a.b-c_d"}
