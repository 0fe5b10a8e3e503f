"""The dashboard in real headless Chromium (Debian's ``chromium``, driven by Playwright), against a real
agent whose grants' regions are fed with scripted usage while the page is open."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from nodekit import AgentProcess  # noqa: E402
from regionfile import DeviceRecord, ProcRecord, write_region  # noqa: E402

from gpuslice.host import procs  # noqa: E402
from gpuslice.spec import GiB, MiB  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "bench" / "results" / "2026-11-22-cpu-dashboard.png"  # GPUSLICE_SAVE_SCREENSHOT=1 rewrites it


TICK = re.compile(r"0|[1-9]\d* (B|KiB|MiB|GiB|TiB)|\d+(\.\d+)?%")  # a round number and a unit, or zero


def chromium() -> str:
    """The browser; installed with apt when root and absent. In CI a missing browser fails, never skips."""
    if not Path(CHROMIUM).exists() and os.geteuid() == 0 and shutil.which("apt-get"):
        apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        if subprocess.run(install, capture_output=True, timeout=600, env=apt_env).returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True, timeout=600, env=apt_env)  # a fresh image
            subprocess.run(install, capture_output=True, timeout=600, env=apt_env)
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


class Feeder(threading.Thread):
    """Writes two slices' regions 10×/s: memory ramps, compute busy time at 30 % and 60 %."""

    def __init__(self, grants: list[dict], shares: list[float]):
        super().__init__(daemon=True)
        self.grants, self.shares = grants, shares
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        me = (os.getpid(), procs.start_time(os.getpid()))
        while not self.stop.is_set():
            elapsed = time.monotonic() - start
            for k, (grant, share) in enumerate(zip(self.grants, self.shares)):
                s = grant["slices"][0]
                used = int(min(s["memory"], (1 + k) * GiB * (0.3 + 0.2 * elapsed)))
                used -= used % MiB
                proc = ProcRecord(pid=me[0], start_time=me[1], used={0: used}, busy_ns={0: int(elapsed * share * 1e9)})
                write_region(Path(grant["region_file"]),
                             [DeviceRecord(s["uuid"], s["memory"], used=used, peak=used)], [proc])
            time.sleep(0.1)


def _series_pixels(png: bytes, box: dict, color: str) -> list[tuple[int, int]]:
    """(x, y) of the pixels inside `box` drawn in `color` (#rrggbb), anti-aliased edges excluded."""
    from io import BytesIO

    from PIL import Image

    want = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
    image = Image.open(BytesIO(png)).convert("RGB")
    left, top = int(box["x"]), int(box["y"])
    crop = image.crop((left, top, left + int(box["width"]), top + int(box["height"])))
    raw, width = crop.tobytes(), crop.width
    return [((i // 3) % width, (i // 3) // width) for i in range(0, len(raw), 3)
            if max(abs(raw[i] - want[0]), abs(raw[i + 1] - want[1]), abs(raw[i + 2] - want[2])) <= 40]


@pytest.fixture
def state_env(tmp_path, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUSLICE_DEVICE_SNAPSHOT", "h100-80gb")
    return {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_dashboard_plots_live_data(state_env, tmp_path):
    browser_path = chromium()
    from playwright.sync_api import sync_playwright

    agent = AgentProcess(state_env, interval=0.2)
    feeder = None
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(agent.socket)), base_url="http://a", timeout=30) as http:
            me = {"owner": "alice", "holder_pid": os.getpid(), "holder_start": procs.start_time(os.getpid())}
            grants = [http.post("/v1/grants", json={**me, "request": {"memory": m, "compute": c}}).json()
                      for m, c in (("8GiB", 30), ("16GiB", 60))]
        assert all("grant" in g for g in grants), grants
        assert {g["slices"][0]["uuid"] for g in grants} == {grants[0]["slices"][0]["uuid"]}  # binpack
        feeder = Feeder(grants, [0.3, 0.6])
        feeder.start()
        time.sleep(2.0)  # a few seconds of history before the page opens
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=browser_path, args=ARGS)
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(agent.url, wait_until="load")
            page.wait_for_function("Number(document.body.dataset.updates || 0) >= 3", timeout=20000)
            page.wait_for_function(  # the slices' lines carry at least 5 points (samples arrive 5×/s)
                "[...document.querySelectorAll('#plot-slice-compute polyline.series, #plot-slice-memory "
                "polyline.series')].filter(e => Number(e.dataset.points) >= 5).length === 4", timeout=30000)
            for plot in ("slice-memory", "slice-compute", "device-memory", "device-compute"):
                counts = page.eval_on_selector_all(f"#plot-{plot} polyline.series",
                                                   "els => els.map(e => Number(e.dataset.points))")
                expected = 2 if plot.startswith("slice") else 8  # two slices; eight H100s in the snapshot
                assert len(counts) == expected, (plot, counts)
                # every slice has points; of the devices only GPU 0 carries the two slices' data
                assert all(c >= 5 for c in (counts if plot.startswith("slice") else counts[:1])), (plot, counts)
            ticks = {p: page.eval_on_selector_all(f"#plot-{p} text.tick", "els => els.map(e => e.textContent)")
                     for p in ("slice-memory", "device-memory", "slice-compute")}
            assert ticks["device-memory"] == ["0", "20 GiB", "40 GiB", "60 GiB", "80 GiB"], ticks  # 79.6 GiB H100s
            assert ticks["slice-compute"] == ["0%", "25%", "50%", "75%", "100%"], ticks
            assert all(TICK.fullmatch(t) for t in ticks["slice-memory"]) and ticks["slice-memory"][0] == "0", ticks
            rows = page.eval_on_selector_all("#grants tbody tr", "rows => rows.map(r => r.innerText)")
            assert len(rows) == 2 and all("alice" in r for r in rows)
            assert any("30%" in r for r in rows) and any("60%" in r for r in rows)
            # freeze the page (its 1-s refresh would grow the lines between the screenshot and the geometry
            # read below): later ticks still fetch but draw nothing
            page.evaluate("window.render = () => {}")
            png = page.screenshot(full_page=True)
            (tmp_path / SCREENSHOT.name).write_bytes(png)
            if os.environ.get("GPUSLICE_SAVE_SCREENSHOT") == "1":  # refresh the committed one on purpose only
                SCREENSHOT.write_bytes(png)
            # Each slice's line is really drawn: in its own colour, across the columns it spans, and only at the
            # heights its data says. (Both memory lines start near zero, where the second one drawn covers the
            # first: hence 80 % of the columns, not all.) The time axis is at least 60 s wide, so a few seconds
            # of data are a short line: the check scales with the line's own extent, not a fixed pixel count.
            for plot in ("slice-memory", "slice-compute"):
                box = page.locator(f"#plot-{plot}").bounding_box()
                lines = page.eval_on_selector_all(f"#plot-{plot} polyline.series", """els => els.map(e => {
                    const r = e.getBoundingClientRect();
                    return {color: e.getAttribute('stroke'), width: r.width,
                            ys: e.getAttribute('points').split(' ').map(p => Number(p.split(',')[1]))}; })""")
                assert len(lines) == 2, (plot, lines)
                for line in lines:
                    pixels = _series_pixels(png, box, line["color"])
                    columns = {x for x, _ in pixels}
                    assert line["width"] >= 5 and len(columns) >= 0.8 * line["width"], (plot, line, len(columns))
                    rows = [y for _, y in pixels]
                    low, high = (v * box["height"] / 200 for v in (min(line["ys"]), max(line["ys"])))  # viewBox: 200 high
                    # a 2.5-px stroke reaches 1.25 px past its points, and a mitred corner up to 4 times that
                    # (SVG's default miter limit): 6 px of slack, still far below one grid step (41 px)
                    assert low - 6 <= min(rows) and max(rows) <= high + 6, (plot, line["color"], min(rows), max(rows),
                                                                            low, high)
            compute = page.eval_on_selector_all("#plot-slice-compute polyline.series", """els => els.map(e =>
                e.getAttribute('points').split(' ').map(p => (176 - Number(p.split(',')[1])) / 1.66))""")
            # the plotted shares are the fed ones: 30 % and 60 % of the device's time
            medians = sorted(sorted(v)[len(v) // 2] for v in compute)
            assert abs(medians[0] - 30) <= 2 and abs(medians[1] - 60) <= 2, compute
            browser.close()
    finally:
        if feeder is not None:
            feeder.stop.set()
        agent.stop()


# Data tops the axes must read well at: nothing, a few bytes, just under a unit, a slice, an H100, petabytes.
SCALES = [0, 1.1, 1023, 3000, 300 * MiB, GiB, 4.4 * GiB, 24 * GiB, 81559 * MiB, 640 * GiB, 3 * 2**40, 5 * 2**50]


def test_dashboard_axes_are_round_with_units_at_every_scale_and_at_zero(state_env):
    """With nothing granted (all usage zero) the memory axes read 0 … 1 GiB in round steps, not
    `0.8250000000000001 B`; the page's own tick function gives, at every scale from zero to petabytes, 0
    and at most four equal round steps in one unit that reach the data's top and no further than one step."""
    browser_path = chromium()
    from playwright.sync_api import sync_playwright

    agent = AgentProcess(state_env, interval=0.2)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=browser_path, args=ARGS)
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(agent.url, wait_until="load")
            page.wait_for_function("Number(document.body.dataset.updates || 0) >= 2", timeout=20000)
            labels = {p: page.eval_on_selector_all(f"#plot-{p} text.tick", "els => els.map(e => e.textContent)")
                      for p in ("slice-memory", "device-memory", "slice-compute", "device-compute")}
            assert labels["slice-memory"] == ["0", "256 MiB", "512 MiB", "768 MiB", "1 GiB"], labels
            assert labels["device-memory"] == ["0", "20 GiB", "40 GiB", "60 GiB", "80 GiB"], labels
            assert labels["slice-compute"] == labels["device-compute"] == ["0%", "25%", "50%", "75%", "100%"]
            # the labels sit on the grid lines they name, evenly spaced from the bottom of the plot up
            ys = page.eval_on_selector_all("#plot-slice-memory text.tick",
                                           "els => els.map(e => Number(e.getAttribute('y')))")
            gaps = {round(b - a, 6) for a, b in zip(ys[1:], ys)}
            assert len(gaps) == 1 and gaps.pop() > 0, ys
            for top in SCALES:
                axis = page.evaluate("([v]) => niceAxis(v, 'bytes')", [top])
                ticks, names = axis["ticks"], axis["labels"]
                step = ticks[1] - ticks[0]
                assert ticks[0] == 0 and 2 <= len(ticks) <= 5, (top, axis)
                assert all(abs((b - a) - step) < 1e-6 * step for a, b in zip(ticks, ticks[1:])), (top, axis)
                assert axis["top"] == ticks[-1] and (top or GiB) <= ticks[-1] < (top or GiB) + step, (top, axis)
                assert all(TICK.fullmatch(n) for n in names) and len(set(names)) == len(names), (top, names)
            assert page.evaluate("niceAxis(0, 'percent')")["labels"] == ["0%", "25%", "50%", "75%", "100%"]
            browser.close()
    finally:
        agent.stop()


def test_dashboard_shows_a_gpu_process_of_no_slice(state_env, tmp_path):
    """The backstop's strangers (a GPU process no slice holds, from NVML's per-process list; here its
    stand-in ``$GPUSLICE_GPU_PROCESSES``) reach the page as a "no slice" row with the pid, device and size."""
    browser_path = chromium()
    import json
    import sys

    from playwright.sync_api import sync_playwright

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    agent = None
    try:
        procs_file = tmp_path / "gpu-processes.json"
        procs_file.write_text("[]")
        agent = AgentProcess({**state_env, "GPUSLICE_GPU_PROCESSES": str(procs_file)}, interval=0.2,
                             extra=("--backstop", "report"))
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(agent.socket)), base_url="http://a", timeout=30) as http:
            devices = http.get("/v1/status").json()["devices"]
            uuid, index = devices[1]["uuid"], devices[1]["index"]
            procs_file.write_text(json.dumps([{"uuid": uuid, "pid": stranger.pid, "used": 3 * GiB}]))
            deadline = time.monotonic() + 30
            while not http.get("/v1/status").json()["backstop"]["unattributed"]:
                assert time.monotonic() < deadline, "the agent never reported the stranger"
                time.sleep(0.05)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=browser_path, args=ARGS)
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(agent.url, wait_until="load")
            page.wait_for_function("[...document.querySelectorAll('#backstop-table tbody tr')].length > 0",
                                   timeout=20000)
            rows = page.eval_on_selector_all("#backstop-table tbody tr",
                                             "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
            assert page.is_visible("#backstop")
            assert len(rows) == 1 and rows[0][:6] == ["no slice", str(stranger.pid), str(index), "3.0 GiB", "-",
                                                      "reported"], rows
            browser.close()
    finally:
        stranger.kill()
        stranger.wait()
        if agent is not None:
            agent.stop()
