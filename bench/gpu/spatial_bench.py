"""The runner of bench/gpu/spatial.sh: N small inference services on one GPU under five ways of sharing it.

Configurations (each run starts N fresh processes of bench/gpu/spatial_worker.py on GPU 0):
  plain         time-slicing by the driver: no gpuslice, no MPS
  gs-timeslice  ``gpuslice run --memory M --compute 100/N`` (hard shares, launches paced)
  mps           raw MPS, a daemon of this runner, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/N
  gs-spatial    ``gpuslice run --engine spatial --memory M --compute 100/N`` (gpuslice's own daemon)
  mps-nolimit   raw MPS without a thread limit (reference)
A run: start the N workers, wait until all are warm (cudnn autotuned), open a common measured window,
sample memory in it (gpuslice ps --json: the enforcer's books; nvidia-smi: the driver's per-process
numbers), collect each worker's requests and latency percentiles. Orders are ABBA per N; runs that would
end after the deadline (--budget) are skipped and listed as skipped. Then the fault experiment (illegal
address and SIGKILL of one spatial client among four, with an agent watching) and the lifecycle check (no
MPS process and no pipe directory left). Writes <out>/<date>-h100-spatial.md (device named, table last)
and raw.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "spatial_worker.py"
GiB = 1 << 30
MEMORY = {"resnet50": "3GiB", "encoder": "3GiB", "train": "16GiB"}
ITEMS = {"resnet50": "img/s", "encoder": "seq/s", "train": "img/s"}


@dataclass
class Run:
    model: str
    n: int
    config: str
    rep: int
    extra: tuple[tuple[str, str, int], ...] = ()  # (model, name, compute) of processes beside the services
    share: int | None = None  # each service's compute share (None: 100/N)
    results: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    smi: dict[int, int] = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0

    @property
    def label(self) -> str:
        mix = "+".join(f"{m}:{c}%" for m, _, c in self.extra)
        return f"{self.model} N={self.n}{' +' + mix if mix else ''} {self.config} #{self.rep}"


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tmp = Path(args.tmp)  # short: MPS sockets live under it
        self.out = Path(args.out)
        self.state = self.tmp / "state"
        self.t_end = time.monotonic() + args.budget
        self.env = dict(os.environ)
        self.env.update(GPUSLICE_STATE_DIR=str(self.state), PYTHONUNBUFFERED="1", GPUSLICE_KILL_GRACE="3")
        for k in [k for k in self.env if k.startswith("CUDA_MPS_")]:
            del self.env[k]
        self.device = args.device
        self.raw: list[dict] = []
        self.skipped: list[str] = []

    # ------------------------------------------------------------------------------------ processes
    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def gs(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpuslice.cli", *args]

    def worker(self, model: str, *extra: str) -> list[str]:
        cmd = [sys.executable, str(WORKER), "--model", model, *extra]
        return cmd + (["--dry"] if self.args.dry else [])

    def launch(self, run: Run, i: int, model: str, compute: int, folder: Path, mps_env: dict | None) -> subprocess.Popen:
        w = self.worker(model, "--ready", str(folder / f"ready.{i}"), "--go", str(folder / "go"),
                        "--out", str(folder / f"out.{i}.json"), "--window", str(self.args.window), "--tail", "2")
        env = dict(self.env, CUDA_VISIBLE_DEVICES=self.device)
        log = open(folder / f"log.{i}.txt", "w")
        if run.config.startswith("gs-"):
            opts = ["run", "--device", "0", "--memory", MEMORY[model], "--compute", str(compute)]
            if run.config == "gs-spatial":
                opts += ["--engine", "spatial"]
            cmd = self.gs(*opts, "--", *w)
        else:
            cmd = w
            env.update(mps_env or {})
            if run.config == "mps" and 0 < compute < 100:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(compute)
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    # ------------------------------------------------------------------------------------ raw MPS
    def raw_mps_start(self) -> dict:
        pipe, logs = self.tmp / "raw" / "pipe", self.tmp / "raw" / "log"
        shutil.rmtree(self.tmp / "raw", ignore_errors=True)
        pipe.mkdir(parents=True)
        logs.mkdir(parents=True)
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs),
                   CUDA_VISIBLE_DEVICES=self.device)
        subprocess.run([self.args.mps_control, "-d"], env=env, check=True, timeout=20)
        for _ in range(200):
            r = subprocess.run([self.args.mps_control], input="get_server_list\n", env=env, capture_output=True,
                               text=True, timeout=10)
            if r.returncode == 0:
                return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
            time.sleep(0.05)
        raise RuntimeError("the raw MPS daemon did not answer")

    def raw_mps_stop(self) -> None:
        pipe = self.tmp / "raw" / "pipe"
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
        subprocess.run([self.args.mps_control], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
        deadline = time.time() + 15
        while mps_pids(self.tmp / "raw") and time.time() < deadline:
            time.sleep(0.1)
        shutil.copytree(self.tmp / "raw" / "log", self.out / "mps-logs" / f"raw-{int(time.time())}", dirs_exist_ok=True)
        left = mps_pids(self.tmp / "raw")
        if left:
            raise RuntimeError(f"the raw MPS daemon did not quit: {left}")
        shutil.rmtree(self.tmp / "raw", ignore_errors=True)

    # ------------------------------------------------------------------------------------ one run
    def execute(self, run: Run, estimate: float) -> Run:
        if time.monotonic() + estimate > self.t_end:
            self.skipped.append(run.label)
            self.say(f"skip {run.label}: the time budget is spent")
            return run
        self.say(f"run {run.label}")
        t0 = time.monotonic()
        folder = self.tmp / "runs" / f"{len(self.raw):03d}"
        folder.mkdir(parents=True)
        mps_env = self.raw_mps_start() if run.config.startswith("mps") else None
        share = (run.share or 100 // run.n) if run.config != "mps-nolimit" else 100
        members = [(run.model, share)] * run.n + [(m, c) for m, _, c in run.extra]
        procs = [self.launch(run, i, m, c, folder, mps_env) for i, (m, c) in enumerate(members)]
        try:
            self.measure(run, folder, procs)
        except Exception as exc:  # a run that fails is reported, the bench goes on
            run.error = str(exc)[:300]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            if mps_env is not None:
                self.raw_mps_stop()
        run.results = [json.loads(f.read_text()) for f in sorted(folder.glob("out.*.json"),
                                                                  key=lambda f: int(f.name.split(".")[1]))]
        if len(run.results) < len(members) and not run.error:
            run.error = "some workers wrote no result: " + " | ".join(
                (folder / f"log.{i}.txt").read_text()[-200:] for i in range(len(members))
                if not (folder / f"out.{i}.json").exists())
        run.seconds = time.monotonic() - t0
        self.raw.append(run.__dict__ | {"label": run.label})
        return run

    def measure(self, run: Run, folder: Path, procs: list[subprocess.Popen]) -> None:
        deadline = time.time() + 120
        while len(list(folder.glob("ready.*"))) < len(procs):
            dead = [i for i, p in enumerate(procs) if p.poll() is not None]
            if dead:
                tail = (folder / f"log.{dead[0]}.txt").read_text()[-300:].replace("\n", " | ")
                raise RuntimeError(f"a worker ended before it was ready (rc {procs[dead[0]].returncode}): {tail}")
            if time.time() > deadline:
                raise RuntimeError("workers were not ready within 120 s")
            time.sleep(0.05)
        go = time.time() + 0.5
        (folder / "go.tmp").write_text(f"{go}\n")
        (folder / "go.tmp").rename(folder / "go")
        time.sleep(max(0.0, go + self.args.window * 0.3 - time.time()))  # ps takes ~1 s: sample early
        if run.config.startswith("gs-"):
            run.memory = self.gs_memory()
        run.smi = smi_memory()
        for p in procs:
            p.wait(timeout=self.args.window + 60)

    def gs_memory(self) -> list[dict]:
        r = subprocess.run(self.gs("ps", "--json"), env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            return [{"error": r.stderr[-200:]}]
        view = json.loads(r.stdout)
        return [{k: s[k] for k in ("grant_id", "memory_limit", "memory_used", "memory_peak", "pids", "engine", "mps")}
                for s in view["slices"]]

    # ------------------------------------------------------------------------------------ plans
    def abba(self, model: str, n: int, configs: list[str], reps: int, estimate: float) -> list[Run]:
        order = configs + configs[::-1]
        runs = []
        for k, config in enumerate(order * ((reps + 1) // 2)):
            rep = k // len(configs) + 1
            if rep <= reps:
                runs.append(self.execute(Run(model, n, config, rep), estimate))
        return runs


def mps_pids(under: Path) -> list[int]:
    """MPS processes (control or server) whose pipe directory is under ``under``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm.startswith("nvidia-cuda-mps") and any(
                e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=" + str(under).encode()) for e in env):
            found.append(int(entry))
    return found


def smi_memory() -> dict[int, int]:
    """pid -> MiB of device memory, as nvidia-smi reports the compute processes (empty without nvidia-smi)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in r.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            out[int(parts[0])] = int(parts[1])
    return out


# ---------------------------------------------------------------------------------------- the plan
def plan(b: Bench) -> list[tuple[str, object]]:
    """(what, callable) in the order they run; the first ones are the goals' numbers."""
    four = ["plain", "gs-timeslice", "mps", "gs-spatial"]
    steps: list[tuple[str, object]] = [
        ("ResNet-50 alone", lambda: b.execute(Run("resnet50", 1, "plain", 1), 20)),
        ("ResNet-50 N=4, ABBA x2 over " + ", ".join(four), lambda: b.abba("resnet50", 4, four, 2, 20)),
        ("ResNet-50 N=8, ABBA x2", lambda: b.abba("resnet50", 8, four, 2, 25)),
        ("fault experiment (illegal address, SIGKILL) with spatial slices", None),
        ("ResNet-50 N=2, AB (once each)", lambda: b.abba("resnet50", 2, four, 1, 18)),
        ("trainer (40%) + 3 ResNet-50 services (20% each): plain, gs-timeslice, gs-spatial, mps",
         lambda: [b.execute(Run("resnet50", 3, c, 1, (("train", "trainer", 40),), share=20), 25)
                  for c in ("plain", "gs-timeslice", "gs-spatial", "mps")]),
        ("transformer encoder alone and N=4 (AB)", lambda: [b.execute(Run("encoder", 1, "plain", 1), 20),
                                                           *b.abba("encoder", 4, four, 1, 20)]),
        ("raw MPS without limits, N=4 and N=8 (reference)",
         lambda: [b.execute(Run("resnet50", n, "mps-nolimit", 1), 25) for n in (4, 8)]),
        # the N=4 gap to raw MPS (0.90x on 2026-11-25, 2 repeats) once more with twice the repeats
        ("ResNet-50 N=4, ABBA x4 over mps, gs-spatial (the N=4 goal, more repeats)",
         lambda: b.abba("resnet50", 4, ["mps", "gs-spatial"], 4, 20)),
    ]
    return steps


def report(b: Bench, fault: dict, leftovers: list[int], device_name: str, started: float) -> str:
    from spatial_report import fault_lines, mixes, ratios, table

    date = time.strftime("%Y-%m-%d", time.gmtime(started))
    lines = [f"# gpuslice spatial engine on {device_name} ({date})", "",
             f"Device: {device_name}; driver {b.args.driver}; window {b.args.window:g} s per run, workers started "
             f"fresh per run; equal shares (100/N % compute: hard time shares for gs-timeslice, MPS active-thread "
             f"percentage for mps and gs-spatial); memory limit per service {MEMORY['resnet50']} (trainer "
             f"{MEMORY['train']}). Wall time {time.time() - started:.0f} s.", ""]
    if b.skipped:
        lines += ["Skipped for the time budget: " + "; ".join(b.skipped), ""]
    lines += ["## Ratios (ResNet-50 fp16 batch 8)", *ratios(b.raw), "", "## Trainer + services", *mixes(b.raw), "",
              "## Faults (4 spatial services at 20 % each, an agent watching)", *fault_lines(fault), "",
              f"## Lifecycle: MPS processes left after the bench: {len(leftovers)} "
              f"({', '.join(map(str, leftovers)) or 'none'}); pipe directories left: "
              f"{len([p for p in (b.tmp).rglob('pipe') if p.is_dir()]) if b.tmp.exists() else 0}", "",
              "## Throughput and latency (aggregate: items/s of the N services together; p99 per service)",
              *table(b.raw)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--device", required=True, help="the GPU's UUID")
    ap.add_argument("--device-name", default="(unknown device)")
    ap.add_argument("--driver", default="?")
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all runs; later ones are skipped")
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--steps", default="", help="run only these steps of the plan (numbers, comma-separated)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    b = Bench(args)
    steps = plan(b)
    if args.plan_only:
        print(f"plan (budget {args.budget:g} s; each run starts its workers fresh, {args.window:g} s window):")
        for i, (what, _) in enumerate(steps, 1):
            print(f"  {i}. {what}")
        return 0
    b.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    fault: dict = {}
    chosen = {int(x) for x in args.steps.split(",") if x.strip()} if args.steps else set(range(1, len(steps) + 1))
    for k, (what, step) in enumerate(steps, 1):
        if k not in chosen:
            continue
        if step is None:
            from spatial_fault import FaultExperiment

            if time.monotonic() + 100 > b.t_end:
                b.skipped.append(what)
                continue
            b.say(what)
            fault = FaultExperiment(b).run()
        else:
            step()
    leftovers = mps_pids(b.tmp)
    text = report(b, fault, leftovers, args.device_name, started)
    part = "" if len(chosen) == len(steps) else "-steps-" + "-".join(map(str, sorted(chosen)))
    name = f"{time.strftime('%Y-%m-%d', time.gmtime(started))}-h100-spatial{part}.md"
    (b.out / name).write_text(text)
    (b.out / f"raw{part}.json").write_text(json.dumps({"runs": b.raw, "fault": fault, "skipped": b.skipped}, indent=1,
                                               default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
