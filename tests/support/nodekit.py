"""Helpers of local-mode tests: run the CLI as a real process, start a real agent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def gpuslice(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuslice.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


class AgentProcess:
    def __init__(self, env: dict[str, str], interval: float = 0.2, reclaim_interval: float = 0.5,
                 extra: tuple[str, ...] = ()):
        self.state = Path(env["GPUSLICE_STATE_DIR"])
        self.proc = gpuslice("agent", "--port", "0", "--interval", str(interval), "--reclaim-interval",
                             str(reclaim_interval), *extra, env=env)
        deadline = time.monotonic() + 30
        info = self.state / "agent.json"
        while not info.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out, err = self.proc.communicate(timeout=5)
                raise RuntimeError(f"agent did not start (rc={self.proc.returncode}): {err}")
            time.sleep(0.05)
        self.info = json.loads(info.read_text())
        self.socket = Path(self.info["socket"])
        self.url = self.info["dashboard"]

    def client(self):
        """An HTTP client of the agent's UNIX socket API (``with agent.client() as http: ...``)."""
        import httpx

        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://agent", timeout=30)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


