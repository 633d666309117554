"""A target that scales by running a command, for scale targets slopilot has no client for:

    --scale-command 'kubectl scale deployment/{target} --replicas={replicas}'

{name} (the autoscaler), {target} (scaleTargetRef.name) and {replicas} are substituted; the command
runs without a shell, split like a shell would. A non-zero exit or a timeout is a ScaleError and the
last applied count stays. The target cannot see readiness: every applied replica counts as ready.
"""

from __future__ import annotations

import shlex
import subprocess

from controlplane.targets.base import Replicas, ScaleError, Target


class CommandTarget(Target):
    def __init__(self, template: str, name: str, target: str, replicas: int, timeout: float = 30.0):
        if "{replicas}" not in template:
            raise ValueError(f"--scale-command {template!r}: must contain {{replicas}}")
        self.template, self.name, self.target = template, name, target
        self.current, self.timeout = replicas, timeout

    def scale(self, desired: int, reason: str) -> None:
        if desired == self.current:
            return
        argv = [a.format(name=self.name, target=self.target, replicas=desired)
                for a in shlex.split(self.template)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ScaleError(f"{argv[0]}: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ScaleError(f"{' '.join(argv)} exited {done.returncode}: {tail[0]}")
        self.current = desired

    def replicas(self) -> Replicas:
        return Replicas(self.current, self.current)
