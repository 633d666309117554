"""The API client: in-cluster credentials or a kubeconfig, our user agent, and a timeout on every call."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.rest import ApiException

USER_AGENT = "slopilot-controller/0.1"
TIMEOUT = (5.0, 15.0)  # (connect, read) seconds of every call but watches
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

__all__ = ["ApiException", "TIMEOUT", "USER_AGENT", "connect", "get_json", "own_namespace", "status_of"]


def connect(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """In-cluster credentials inside a pod (unless a kubeconfig is given or KUBECONFIG is set), else the
    kubeconfig."""
    cfg = client.Configuration()
    if kubeconfig is None and not os.environ.get("KUBECONFIG") and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    api = client.ApiClient(cfg)
    api.user_agent = USER_AGENT
    return api


def own_namespace(default: str = "default") -> str:
    """The namespace this pod runs in (the service account's), for the Lease; `default` outside a pod."""
    try:
        return SA_NAMESPACE.read_text().strip() or default
    except OSError:
        return os.environ.get("POD_NAMESPACE", default)


def status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, ApiException) else None


def get_json(api: client.ApiClient, path: str):
    """GET of a path the typed APIs have no method for (a group/version's discovery document)."""
    request = api.param_serialize("GET", path, header_params={"Accept": "application/json"},
                                  auth_settings=["BearerToken"])
    response = api.call_api(*request, _request_timeout=TIMEOUT)
    response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(http_resp=response)
    return json.loads(response.data or b"null")
