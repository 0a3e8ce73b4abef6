"""The harness's own Kubernetes client: raw REST calls on dicts, over a kubernetes ApiClient's
authentication and TLS.

Deliberately not the operator's client (rankops.controller.kube): the harness plays the kubelet
and the cluster around the code under test, so what it sees must not change when that code does.
"""
from __future__ import annotations

import json
from typing import Any


class Api:
    """The few calls the pod runner makes: `call` (JSON in, JSON out; None for 404) and `stream`
    (a watch, read as it comes)."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import config

        self.client = config.new_client_from_config(config_file=kubeconfig)
        self.server = self.client.configuration.host

    def call(self, method: str, path: str, body: Any = None, query: list | None = None,
             content_type: str = "application/json", timeout: float = 30) -> Any:
        from kubernetes.client.exceptions import ApiException

        status, reason, data = self._send(method, path, body, query, timeout,
                                          {"Content-Type": content_type, "Accept": "application/json"})
        if status == 404:
            return None
        if status >= 400:
            raise ApiException(status=status, reason=f"{reason}: {data[:300]!r}")
        return json.loads(data) if data else {}

    def stream(self, path: str, query: list, timeout: float = 90) -> Any:
        """The urllib3 response of a GET whose body is read as it comes; ApiException if refused."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json"}
        if hasattr(self.client, "param_serialize"):  # kubernetes >= 37
            method, url, headers, _, _ = self.client.param_serialize(
                method="GET", resource_path=path, query_params=query, header_params=headers,
                auth_settings=["BearerToken"])
            response = self.client.call_api(method, url, header_params=headers, _request_timeout=timeout).response
        else:  # older clients raise ApiException themselves
            response = self.client.call_api(path, "GET", query_params=query, header_params=headers,
                                            auth_settings=["BearerToken"], _preload_content=False,
                                            _request_timeout=timeout, _return_http_data_only=True)
        if response.status >= 400:
            raise ApiException(status=response.status, reason=response.reason or "")
        return response

    def _send(self, method: str, path: str, body: Any, query: list | None, timeout: float,
              headers: dict[str, str]) -> tuple[int, str, bytes]:
        """(status, reason, body) of one request, any status answered; both generations of the
        generated client (kubernetes >= 37 has param_serialize; rankops pins below it)."""
        from kubernetes.client.exceptions import ApiException

        if hasattr(self.client, "param_serialize"):
            method, url, headers, _, _ = self.client.param_serialize(
                method=method, resource_path=path, query_params=query or [], header_params=headers,
                auth_settings=["BearerToken"])
            # Dict bodies go out as JSON, which is also valid merge-patch and apply-patch YAML.
            response = self.client.call_api(method, url, header_params=headers, body=body, _request_timeout=timeout)
            response.read()
            return response.status, response.reason or "", response.data or b""
        try:
            response = self.client.call_api(path, method, query_params=query or [], header_params=headers, body=body,
                                            auth_settings=["BearerToken"], _preload_content=False,
                                            _request_timeout=timeout, _return_http_data_only=True)
        except ApiException as exc:
            raw = exc.body if isinstance(exc.body, bytes) else (exc.body or "").encode()
            return exc.status or 0, exc.reason or "", raw
        return response.status, response.reason or "", response.data or b""
