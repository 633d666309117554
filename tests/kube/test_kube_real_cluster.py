"""Against a real cluster, only when asked: SLOPILOT_TEST_KUBECONFIG=path/to/kubeconfig. The real API
server validates deploy/base (CRD, RBAC, Deployment) in a server-side dry run; nothing is created.
The behaviour tests need the stand-in's internals (fake kubelet, audit log, fault injection) and run
there only."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.kube.helpers import ROOT

KUBECONFIG = os.environ.get("SLOPILOT_TEST_KUBECONFIG")
pytestmark = pytest.mark.skipif(not KUBECONFIG or shutil.which("kubectl") is None,
                                reason="set SLOPILOT_TEST_KUBECONFIG to a real cluster's kubeconfig")


def test_the_real_api_server_accepts_the_base_in_a_dry_run():
    env = {**os.environ, "KUBECONFIG": KUBECONFIG}
    done = subprocess.run(["kubectl", "apply", "-k", str(ROOT / "deploy" / "base"), "--dry-run=server"],
                          env=env,
                          capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert "customresourcedefinition.apiextensions.k8s.io/inferenceautoscalers.slopilot.dev" in done.stdout
