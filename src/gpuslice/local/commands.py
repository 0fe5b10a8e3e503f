"""Local-mode verbs: ``run``, ``resize``, ``ps``, ``top``, ``agent``. ``register(app)`` adds them; another module's
``register`` may add more verbs to the same app (``devices`` lives in ``device_commands``)."""

from __future__ import annotations

import getpass
import math
import os
import sys
from typing import Callable, List, Optional

import typer

from gpuslice.local.paths import StateDir

VERBS: dict[str, Callable[..., None]] = {}
MAX_HISTORY_POINTS = 1_000_000  # samples per ring the agent keeps in memory (dozens of bytes each, per slice)


def verb(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def add(fn: Callable[..., None]) -> Callable[..., None]:
        VERBS[name] = fn
        return fn
    return add


def _say(text: str) -> None:
    print(f"gpuslice: {text}", file=sys.stderr, flush=True)


# Option names of `run` for the fields of a request: errors name what the user typed.
RUN_OPTIONS = {"count": "gpus", "memory": "memory", "compute": "compute", "priority": "priority", "mode": "mode",
               "policy": "policy", "policy.node": "policy", "policy.gpu": "policy", "device": "device",
               "engine": "engine", "colocation": "colocation", "tidal_schedule": "tidal-schedule",
               "oom_policy": "oom-policy", "oom_wait_ms": "oom-wait"}


def cli_spec_error(exc: "SpecError") -> "SpecError":
    """The same error with the field named as the ``run`` option (``count`` -> ``gpus``)."""
    from gpuslice.spec import SpecError

    name = RUN_OPTIONS.get(exc.field, exc.field)
    return exc if name == exc.field else SpecError(name, exc.value, exc.allowed)


def _usage_error(exc: "SpecError") -> typer.BadParameter:
    """A bad option value (whatever the node): click's usage error, exit code 2, naming the option."""
    from gpuslice.host.cliargs import usage_error

    return usage_error(exc, RUN_OPTIONS)


def _positive(value: float, option: str, unit: str, example: str) -> float:
    """An option that must be a finite number above 0 (nan and inf too are refused): else a usage error."""
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(f"{value!r} is not allowed; expected {unit} above 0, like {example}",
                                 param_hint=f"'{option}'")
    return value


def _split_unit(memory: str | None, compute: str, cmd: list[str]) -> None:
    """``--memory 4 GiB -- train.py``: the shell split the size, so ``GiB`` would be run as the command
    and the slice would be 4 MiB (a bare number is MiB). Refused (exit 2) with the spelling that works;
    a ``%`` after ``--compute 30`` (or after a bare ``--memory``) the same way."""
    from gpuslice.spec import SpecError, parse_memory

    word = cmd[0] if cmd else ""
    bare_memory = bool(memory) and memory.replace(".", "", 1).isdigit()  # type: ignore[union-attr]
    if word == "%":
        typed = ([f"--compute {compute}%"] if compute.isdigit() and compute != "0" else []) + \
                ([f"--memory {memory}%"] if bare_memory else [])
        if typed:
            raise typer.BadParameter(f"'%' stands alone: write {' or '.join(typed)} without a space (as typed, "
                                     "'%' would run as the command)", param_hint="'--compute' / '--memory'")
        return
    if bare_memory and word.isalpha():
        try:
            parse_memory(f"{memory}{word}")
        except SpecError:
            return  # not a unit: a command that happens to follow a bare MiB number
        raise typer.BadParameter(f"'{memory} {word}': write the unit without a space, --memory {memory}{word} "
                                 f"(as typed, the slice would be {memory} MiB and '{word}' would run as the command)",
                                 param_hint="'--memory'")


def _wait_ms(seconds: float) -> int:
    """--oom-wait SECONDS as the slice file's milliseconds (0 to one day)."""
    from gpuslice.spec import SpecError

    if not math.isfinite(seconds) or not 0 <= seconds <= 86_400:
        raise SpecError("oom_wait_ms", seconds, "seconds from 0 to 86400, like 30 or 0.5")
    return int(round(seconds * 1000))


@verb("run")
def run(
    cmd: List[str] = typer.Argument(..., metavar="-- CMD...", help="The command to run in the slice, after --."),
    gpus: int = typer.Option(1, "--gpus", metavar="N",
                             help="How many devices. With --memory: a slice of that size on each of "
                             "GPUS distinct devices, which others may share; without --memory (or with "
                             "--exclusive): GPUS whole idle devices."),
    memory: Optional[str] = typer.Option(None, "--memory", metavar="SIZE",
                                         help="Memory limit per device: 4GiB, 4096Mi, 50%. Default: with "
                                         "--compute below 100 the same percent of each device's memory (the "
                                         "slice shares the device), else the whole device."),
    compute: str = typer.Option("0", "--compute", metavar="PCT",
                                help="Compute share of each device in percent (0 = not paced)."),
    priority: Optional[str] = typer.Option(None, "--priority", metavar="high|low",
                                           help="high or low (default low). Naming it makes the default engine "
                                           "spatial (see --engine)."),
    mode: str = typer.Option("hard", "--mode", metavar="hard|soft|off",
                             help="Compute sharing mode: hard, soft or off."),
    exclusive: bool = typer.Option(False, "--exclusive", help="Whole idle devices, shared with nobody."),
    device: Optional[str] = typer.Option(None, "--device", metavar="LIST",
                                         help="Restrict to these devices: index or UUID, "
                                         "comma separated."),
    wait: bool = typer.Option(False, "--wait", help="Queue until the request fits instead of failing "
                              "(a request that cannot fit even on an empty node is refused at once)."),
    policy: str = typer.Option("binpack", "--policy", metavar="POLICY",
                               help="Placement policy: binpack, spread, bestfit, fgd, "
                               "random, or node=<policy>,gpu=<policy>."),
    engine: str = typer.Option("auto", "--engine", metavar="auto|timeslice|spatial",
                               help="How the device's compute is shared: timeslice (launches paced, exact shares) or "
                               "spatial (an MPS client: kernels of the device's spatial slices run at once, the share "
                               "is its fraction of the SMs; one device; a low priority one with no share gets 60 % of "
                               "the SMs if it starts beside a high priority one, --compute 100 keeps every SM). auto "
                               "(default): spatial for a slice that names --priority and takes one device with no "
                               "--compute share, not --exclusive, --colocation preemptive (a server and a trainer "
                               "given priorities), where the node has MPS "
                               "and no other user's spatial slice is on the device, a low priority one only beside "
                               "your high priority spatial slice; timeslice otherwise; a slice with no share takes "
                               "the other engine where only that one fits (the device runs it)."),
    oom_policy: str = typer.Option("return", "--oom-policy", metavar="return|kill|wait",
                                   help="When memory runs out: return the error (default); kill the process at "
                                   "the limit; or wait: an allocation that fits the slice but not the device (the "
                                   "card is full) waits for memory to free, up to --oom-wait, then fails."),
    oom_wait: Optional[float] = typer.Option(None, "--oom-wait", metavar="SECONDS",
                                             help="With --oom-policy wait: how long an allocation waits for the "
                                             "device (default 30)."),
    colocation: str = typer.Option("preemptive", "--colocation", metavar="preemptive|shared|tidal",
                                   help="How it shares a device with the other priority: preemptive (low "
                                   "priority yields while high-priority work is queued), shared (weighted "
                                   "shares, nobody yields) or tidal (low priority: the share follows "
                                   "--tidal-schedule, or the high-priority slices' idle time)."),
    tidal_schedule: Optional[str] = typer.Option(None, "--tidal-schedule", metavar="H-H:PCT,...",
                                                 help="With --colocation tidal: the share by UTC hour, e.g. "
                                                 "8-20:30,20-8:100 (hours no span covers: --compute, or the "
                                                 "whole device)."),
) -> None:
    """Run CMD in a slice: grant, enforcer preloaded, output streamed, grant released at the end.

    Exit codes: the command's own; 2 for a bad option value; 1 when this node cannot grant the request
    (e.g. more devices or memory than it has; it names the option) or gpuslice itself fails."""
    from gpuslice.local.service import open_service, private_ledger_warning, snapshot_note
    from gpuslice.local import launcher
    from gpuslice.host import procs
    from gpuslice.enforcer.library import find_enforcer
    from gpuslice.local.ledger import parse_policy
    from gpuslice.local.records import ENGINE_AUTO, Ask, OomPolicy, auto_request
    from gpuslice.spec import Engine, Request, SpecError

    _split_unit(memory, compute, cmd)
    try:  # values wrong whatever the node: usage errors
        fields = {"count": gpus, "memory": memory, "compute": compute, "mode": mode, "exclusive": exclusive,
                  "colocation": colocation, "tidal_schedule": tidal_schedule,
                  **({} if priority is None else {"priority": priority})}
        auto = engine.strip().lower() == ENGINE_AUTO
        try:
            named = None if auto else Engine.parse(engine)
        except SpecError as exc:
            raise SpecError("engine", engine, f"{ENGINE_AUTO} (the default) or {exc.allowed}") from None
        request = auto_request(fields) if auto else Request.from_mapping({**fields, "engine": named})
        parse_policy(policy)
        oom = OomPolicy(oom_policy, None if oom_wait is None else _wait_ms(oom_wait))
        launcher.device_names(device)
    except SpecError as exc:
        raise _usage_error(exc) from None
    if request.compute_only:
        _say(f"no --memory: the slice gets {request.compute}% of each device's memory, the same share as its "
             "compute, so others can share the device (give --memory to choose)")
    try:  # this node cannot do it: runtime errors (exit 1), named as the options
        enforcer = str(find_enforcer())
        state = StateDir.default()
        service, devices = open_service(state)
        for note in (private_ledger_warning(service, state), snapshot_note()):
            if note:
                _say(note)
        ask = Ask(request=request, owner=getpass.getuser(), holder_pid=os.getpid(),
                  holder_start=procs.start_time(os.getpid()), uid=os.getuid(),
                  devices=launcher.resolve_devices(device, devices), command=launcher.command_text(cmd),
                  policy=policy, oom=oom, engine_auto=auto)
        code = launcher.run_command(service, ask, cmd, wait=wait, enforcer=enforcer, say=_say)
    except SpecError as exc:
        raise cli_spec_error(exc) from None
    raise typer.Exit(code)


@verb("resize")
def resize(
    grant: str = typer.Argument(..., metavar="GRANT", help="The grant id (gpuslice ps shows it: g-…)."),
    memory: Optional[str] = typer.Option(None, "--memory", metavar="SIZE",
                                         help="New memory limit per device: 8GiB, 8192Mi, 50%."),
    compute: Optional[str] = typer.Option(None, "--compute", metavar="PCT", help="New compute share in percent."),
    priority: Optional[str] = typer.Option(None, "--priority", metavar="high|low", help="New priority."),
    mode: Optional[str] = typer.Option(None, "--mode", metavar="hard|soft|off", help="New compute sharing mode."),
    evict: bool = typer.Option(False, "--evict", help="Lower the memory limit even below what the slice's "
                               "processes hold now: those processes get SIGTERM (without it such a resize is "
                               "refused, saying how much is in use)."),
) -> None:
    """Resize a running slice in place: placement checks the new size fits beside the other slices, the slice
    file is rewritten, and the slice's running processes follow within a second (no restart).

    Exit codes: 0 resized; 1 it does not fit, is below what the slice holds now, or the grant is unknown;
    2 a bad option value."""
    from gpuslice.local.service import open_service
    from gpuslice.spec import Resize, SpecError

    if memory is None and compute is None and priority is None and mode is None:
        raise typer.BadParameter("nothing to change; give at least one of --memory, --compute, --priority, --mode",
                                 param_hint="GRANT")
    try:
        change = Resize.from_mapping({"memory": memory, "compute": compute, "priority": priority, "mode": mode,
                                      "evict": evict})
    except SpecError as exc:
        raise _usage_error(exc) from None
    service, _devices = open_service(StateDir.default())
    done = service.resize(grant, change)
    for line in resize_lines(done):
        typer.echo(line)


def resize_lines(done) -> list[str]:
    """What ``resize`` prints: the grant's slices as they are now, and what was evicted."""
    from gpuslice.spec import human_bytes

    rec = done.record
    lines = [f"resized {rec.grant_id} (generation {rec.generation}); its running processes follow within a second"]
    for s in rec.slices:
        lines.append(f"  {s.device_uuid} memory {human_bytes(s.memory_limit)} compute {s.compute}% "
                     f"({s.mode.value}) priority {s.priority.name.lower()}")
    if done.live_share:
        lines.append(f"share, mode and priority applied to the running processes on {len(done.live_share)} device(s)")
    if done.evicted:
        lines.append("evicted (SIGTERM): " + ", ".join(f"pid {p}" for p in done.evicted))
    return lines


@verb("ps")
def ps(as_json: bool = typer.Option(False, "--json", help="Print the node view as JSON (every value, in full)."),
       wide: bool = typer.Option(False, "--wide", help="Every column and the whole command, even past the "
                                 "terminal's width.")) -> None:
    """Show devices, slices (memory limit/used, compute set/achieved, processes, priority, age) and the queue."""
    import json

    from gpuslice.host.console import print_table, stdout_console
    from gpuslice.host.tables import view_renderable
    from gpuslice.local.viewsource import ViewSource

    view = ViewSource(StateDir.default()).view()
    if as_json:
        typer.echo(json.dumps(view.to_json(), indent=1))
        return
    print_table(stdout_console(), view_renderable(view, wide), wide)


@verb("top")
def top(
    interval: float = typer.Option(1.0, "--interval", metavar="SECONDS", help="Seconds between refreshes."),
    count: int = typer.Option(0, "--count", metavar="N", help="Stop after this many refreshes (0 = until Ctrl-C)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON line per refresh instead of the table."),
    wide: bool = typer.Option(False, "--wide", help="Every column and the whole command (a terminal crops "
                              "what passes its edge; a pipe gets it all)."),
) -> None:
    """Live view of the slices of this node (refreshing)."""
    from gpuslice.local.top import run_top

    _positive(interval, "--interval", "seconds", "1 or 0.5")
    if count < 0:
        raise typer.BadParameter(f"{count} is not allowed; expected a number of refreshes, 0 (until Ctrl-C) or more",
                                 param_hint="'--count'")
    run_top(StateDir.default(), interval, count, as_json, wide)


@verb("agent")
def agent(
    port: int = typer.Option(9477, "--port", metavar="PORT",
                             help="HTTP port of the dashboard and /metrics (0 = any free, -1 = off)."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR", help="HTTP address (localhost by default)."),
    interval: float = typer.Option(1.0, "--interval", metavar="SECONDS", help="Seconds between usage samples."),
    history_minutes: float = typer.Option(10.0, "--history", metavar="MINUTES",
                                          help="Minutes of history the dashboard shows."),
    reclaim_interval: float = typer.Option(5.0, "--reclaim-interval", metavar="SECONDS",
                                           help="Seconds between checks for grants whose processes are gone."),
    backstop: str = typer.Option("kill", "--backstop", help="What to do with a slice whose processes hold more "
                                 "device memory than its limit in NVML's count (which no process can forge): kill "
                                 "(report, then kill its processes on that device after --backstop-grace), report, "
                                 "or off."),
    backstop_grace: float = typer.Option(5.0, "--backstop-grace", help="Seconds a slice may stay above its limit "
                                         "before the kill policy acts."),
    backstop_tolerance: str = typer.Option("256MiB", "--backstop-tolerance", help="Device memory a slice may show "
                                           "above its limit before it counts as over (or 2 percent of the limit, if more)."),
    high_priority: str = typer.Option("*", "--high-priority", metavar="WHO",
                                      help="Who may ask for high priority: * (anyone, the default) or a comma list "
                                      "of users, uids and @groups (root always may). A high-priority slice makes "
                                      "the low-priority slices on its devices wait while its work is queued: on a "
                                      "machine shared by users who do not trust each other, name who may."),
    kubernetes: bool = typer.Option(False, "--kubernetes", help="Run as the Kubernetes node agent instead "
                                    "(device plugin, node registration, metrics with pod labels): the same as "
                                    "`gpuslice kube-agent`, whose options then apply (see its --help)."),
) -> None:
    """Run the node agent: ledger over a Unix socket, stale-grant reclaim, Prometheus metrics, dashboard."""
    import asyncio

    from gpuslice.local.admission import HighPriorityPolicy
    from gpuslice.local.agent import AgentConfig, serve
    from gpuslice.host.devices import discover
    from gpuslice.spec import SpecError

    if kubernetes:  # gpuslice.cli.main resolves the alias before parsing; only a direct call lands here
        raise SpecError("kubernetes", True, "the `gpuslice kube-agent` verb (or `gpuslice agent --kubernetes` from the CLI)")
    _positive(interval, "--interval", "seconds", "1 or 0.5")
    _positive(history_minutes, "--history", "minutes", "10")
    _positive(reclaim_interval, "--reclaim-interval", "seconds", "5")
    if not -1 <= port <= 65535:
        raise typer.BadParameter(f"{port} is not allowed; expected a TCP port from 1 to 65535, 0 for any free one, "
                                 "or -1 for no HTTP", param_hint="'--port'")
    points = max(2, int(history_minutes * 60 / interval))
    if points > MAX_HISTORY_POINTS:
        raise typer.BadParameter(f"{history_minutes!r} minutes at one sample per {interval!r} s is {points} samples; "
                                 f"expected at most {MAX_HISTORY_POINTS} (a longer --interval or a shorter --history)",
                                 param_hint="'--history'")
    policy = backstop_policy(backstop, backstop_grace, backstop_tolerance)
    try:
        high = HighPriorityPolicy.parse(high_priority)
    except SpecError as exc:
        raise typer.BadParameter(f"{exc.value!r} is not allowed; expected {exc.allowed}", param_hint="'--high-priority'") from None
    config = AgentConfig(state=StateDir.default().ensure(), host=host, port=port, interval=interval,
                         reclaim_every=reclaim_interval, history_points=points, backstop=policy, high_priority=high)
    asyncio.run(serve(config, discover()))


def backstop_policy(action: str, grace: float, tolerance: str) -> "Policy":
    """The --backstop* options as a Policy; a bad value is a usage error naming the option."""
    from gpuslice.host.backstop import Policy
    from gpuslice.spec import SpecError

    try:
        return Policy.from_options(action, grace, tolerance)
    except SpecError as exc:
        option = "--" + exc.field.replace("_", "-")
        raise typer.BadParameter(f"{exc.value!r} is not allowed; expected {exc.allowed}", param_hint=f"'{option}'") from None


def register(app: typer.Typer) -> None:
    for name, fn in VERBS.items():
        if name == "run":
            app.command(name, context_settings={"allow_interspersed_args": False})(fn)
        else:
            app.command(name)(fn)
