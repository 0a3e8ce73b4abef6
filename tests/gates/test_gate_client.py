"""Model references and URLs as the gate command lines take them."""
import pytest

from rankops.gates.client import normalize_url, parse_model_ref


@pytest.mark.parametrize("text, ref", [("ranker", ("ranker", "")), ("ranker:3", ("ranker", "3")),
                                       ("ctr-ranker_v2:12", ("ctr-ranker_v2", "12"))])
def test_model_ref(text, ref):
    assert parse_model_ref(text) == ref


@pytest.mark.parametrize("text", ["", ":3", "ranker:latest", "ranker:1:2"])
def test_bad_model_ref(text):
    with pytest.raises(ValueError, match="NAME or NAME:VERSION"):
        parse_model_ref(text)


@pytest.mark.parametrize("text, url", [("svc:8000", "svc:8000"), ("http://svc:8000/", "svc:8000"),
                                       (" https://svc.ns.svc:8000 ", "svc.ns.svc:8000")])
def test_url(text, url):
    assert normalize_url(text) == url


def test_empty_url():
    with pytest.raises(ValueError, match="HOST:PORT"):
        normalize_url("http://")
