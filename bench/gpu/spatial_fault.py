"""The fault experiment of bench/gpu/spatial.sh: what a faulting spatial client does to its neighbours, and
how long gpuslice takes to see it and to serve a new spatial slice again.

With an agent watching (samples every 0.25 s, reconciles every 0.5 s), four spatial ResNet-50 services run
on GPU 0 (20 % of the SMs each). Then:
  illegal   a fifth spatial slice launches a kernel that stores to address 8 (CUDA_ERROR_ILLEGAL_ADDRESS);
  sigkill   (fresh services) one service's worker process is SIGKILLed.
For each: the neighbours' requests per second before and after, and the first error each one got (text and
time after the fault); the first time gpuslice's node view (ps --json through the agent) reports the daemon
in fault or down; for ``illegal``, once the faulted clients have exited, the time until a new spatial service
answers its first request (gpuslice restarts the faulted daemon once no client of it is left), and the
daemon's pid before and after. The daemons' logs are copied to <out>/mps-logs (the lines MPS writes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SERVICES = 4
SHARE = 20


def events(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def rate(evs: list[dict], t0: float, t1: float) -> float | None:
    """Requests per second between t0 and t1 from a service's progress lines."""
    inside = [e for e in evs if t0 <= e["t"] <= t1 and "ok" in e]
    if len(inside) < 2:
        return None
    return (inside[-1]["ok"] - inside[0]["ok"]) / max(1e-6, inside[-1]["t"] - inside[0]["t"])


class FaultExperiment:
    def __init__(self, bench):
        self.b = bench
        self.dir = bench.tmp / "fault"
        self.agent: subprocess.Popen | None = None

    def view(self) -> dict:
        r = subprocess.run(self.b.gs("ps", "--json"), env=self.b.env, capture_output=True, text=True, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else {"errors": [r.stderr[-200:]], "mps": []}

    def start_services(self, tag: str, seconds: float) -> list[tuple[subprocess.Popen, Path]]:
        out = []
        for i in range(SERVICES):
            ev, ready = self.dir / f"{tag}.{i}.events", self.dir / f"{tag}.{i}.ready"
            cmd = self.b.gs("run", "--device", "0", "--engine", "spatial", "--memory", "3GiB", "--compute",
                            str(SHARE), "--", *self.b.worker("resnet50", "--serve", str(seconds), "--events", str(ev),
                                                            "--ready", str(ready)))
            log = open(self.dir / f"{tag}.{i}.log", "w")
            out.append((subprocess.Popen(cmd, env=self.b.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True), ev))
        deadline = time.time() + 120
        while not all((self.dir / f"{tag}.{i}.ready").exists() for i in range(SERVICES)):
            if time.time() > deadline or any(p.poll() is not None for p, _ in out):
                raise RuntimeError(f"{tag}: the services did not all start")
            time.sleep(0.05)
        return out

    def watch(self, t_fault: float, limit: float, acted: int) -> tuple[float | None, list[str]]:
        """Seconds from the fault until the node view shows a daemon not running or a fault acted on (its
        clients fail within seconds and the daemon is restarted or retired with them, between two polls),
        and its error lines."""
        deadline = t_fault + limit
        while time.time() < deadline:
            v = self.view()
            lines = [e for e in v.get("errors", []) if "MPS" in e]
            # a daemon not running, or one more fault acted on (restarted, or retired with its ended slices)
            # than before the fault (``acted``: an earlier experiment's fault stays among the errors a while)
            if any(d.get("state") != "running" for d in v.get("mps", [])) or v.get("mps_faults", 0) > acted:
                return time.time() - t_fault, lines
            time.sleep(0.1)
        return None, []

    def neighbours(self, services, t_fault: float) -> list[dict]:
        out = []
        for _, ev in services:
            evs = events(ev)
            err = next((e for e in evs if "error" in e), None)
            out.append({"before_rps": rate(evs, t_fault - 2.0, t_fault),
                        "after_rps": rate(evs, t_fault + 0.5, t_fault + 2.5),
                        "error_after_s": None if err is None else round(err["t"] - t_fault, 3),
                        "error": None if err is None else err["error"]})
        return out

    def end(self, services) -> None:
        for p, _ in services:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p, _ in services:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def daemon_pid(self) -> int | None:
        return next((d.get("pid") for d in self.view().get("mps", [])), None)

    def illegal(self) -> dict:
        services = self.start_services("illegal", 40)
        try:
            time.sleep(3)
            pid_before = self.daemon_pid()
            acted = self.view().get("mps_faults", 0)
            t_fault = time.time()
            faulter = subprocess.run(self.b.gs("run", "--device", "0", "--engine", "spatial", "--memory", "2GiB",
                                               "--compute", str(SHARE), "--", *self.b.worker("resnet50", "--fault",
                                                                                              "illegal")),
                                     env=self.b.env, capture_output=True, text=True, timeout=120)
            detect, lines = self.watch(t_fault, 20, acted)
            # the neighbours that got the fault end (exit 3); give them 15 s in all, then measure
            deadline = time.time() + 15
            while time.time() < deadline and any(p.poll() is None for p, _ in services):
                time.sleep(0.1)
            result = {"faulter_rc": faulter.returncode, "faulter_out": faulter.stdout.strip()[-300:],
                      "detected_after_s": None if detect is None else round(detect, 2), "view_errors": lines[:3],
                      "neighbours": self.neighbours(services, t_fault), "daemon_pid_before": pid_before}
            still = [p for p, _ in services if p.poll() is None]
            result["neighbours_still_running"] = len(still)
            self.end(services)
            t_new = time.time()
            new = self.start_services("recovered", 6)
            first = None
            while first is None and time.time() - t_new < 60:
                evs = events(new[0][1])
                first = next((e["t"] for e in evs if e.get("ok")), None)
                time.sleep(0.1)
            result["new_service_first_request_s"] = None if first is None else round(first - t_new, 2)
            result["recovered_after_fault_s"] = None if first is None else round(first - t_fault, 2)
            result["daemon_pid_after"] = self.daemon_pid()
            self.end(new)
            return result
        finally:
            self.end(services)

    def sigkill(self) -> dict:
        services = self.start_services("sigkill", 20)
        try:
            time.sleep(3)
            victim = json.loads((self.dir / "sigkill.0.ready").read_text())["pid"]
            acted = self.view().get("mps_faults", 0)
            t_fault = time.time()
            os.kill(victim, signal.SIGKILL)
            detect, lines = self.watch(t_fault, 5, acted)
            time.sleep(3)
            return {"victim_pid": victim, "detected_after_s": None if detect is None else round(detect, 2),
                    "view_errors": lines[:3], "neighbours": self.neighbours(services[1:], t_fault)}
        finally:
            self.end(services)

    def run(self) -> dict:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.agent = subprocess.Popen(self.b.gs("agent", "--port", "-1", "--interval", "0.25", "--reclaim-interval",
                                                "0.5"), env=self.b.env, stdout=open(self.dir / "agent.log", "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True)
        result: dict = {}
        try:
            for name in ("illegal", "sigkill"):
                try:
                    result[name] = getattr(self, name)()
                except Exception as exc:
                    result[name] = {"error": str(exc)[:300]}
        finally:
            self.agent.terminate()
            self.agent.wait(timeout=30)
            logs = self.b.state / "mps" / "logs"
            if logs.exists():
                shutil.copytree(logs, self.b.out / "mps-logs" / "gpuslice", dirs_exist_ok=True)
        return result
