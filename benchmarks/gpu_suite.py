"""The GPU benchmarks in one prepared run of bounded wall time: `python -m benchmarks.gpu_suite --out DIR`.

A GPU machine is lent for minutes at a time, so the benchmarks that need one run here in the order of
what they decide, each in a child process with a wall-clock limit, and whatever one of them does
(finish, fail, overrun) the next one still runs and everything measured so far is on disk:

1. `gpu_rung`: the PyTorch job's whole L18 step at the planner's layout and accumulation (MFU,
   phases, loss candidates, kernels, syncs);
2. `jax_gpu_rung`: the grouped-matmul candidates, then the JAX and PyTorch engines' steps on one
   config (the tokens/s ratio);
3. `block_kernels`: an L18 block, eager, with compiled pointwise chains, and compiled whole;
4. `muon`: the optimizer step of the layers one GPU holds against its Newton–Schulz GEMMs.

The budget (`--budget-seconds`, default 470) is shared out by `SHARES`; time a child leaves unused
passes to the ones after it. Children that take a time limit of their own get one a little inside
their share, so they stop timing and report rather than being killed. Each child's JSON goes to
`DIR/NAME.json` and the tail of its stderr to `DIR/NAME.stderr.txt` as soon as it ends;
`DIR/summary.json` is rewritten after every child (status, seconds, limit and every check), so a
run cut short keeps what it measured. `--quick` runs the children's CPU modes at reduced widths
(what the tests run).

Nothing here is timed on the host CPU: the device is read from `nvidia-smi`, and each child times its
own reference matmul on the device it used. Without a CUDA device (nvidia-smi lists none and torch, asked
in a child process, sees none) the full run starts no child: each is reported skipped with the reason,
`summary.json` is written and the exit status is 1, as for any child that did not run.

Stopping the suite (SIGTERM, SIGINT, any error) kills the running child's process group with it; on
Linux a SIGKILL of the suite, which no handler sees, ends the running child too (the kernel's
parent-death signal).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CHILDREN", "SHARES", "Child", "cuda_missing", "device_memory_flag", "gpu_device", "plan_limits",
           "run_suite"]

DEFAULT_BUDGET_SECONDS = 470.0
STDERR_TAIL_BYTES = 8_000
# A child with a limit of its own stops this far inside its share (set-up, report and exit).
OWN_LIMIT_MARGIN = 0.8


@dataclass(frozen=True)
class Child:
    name: str
    share: float                      # of the suite's budget
    own_limit_flag: str | None        # the child's own wall-clock flag, if it has one

    def command(self, quick: bool, limit_seconds: float, gpu_memory: str | None) -> list[str]:
        cmd = [sys.executable, "-m", f"benchmarks.{self.name}", "--json"]
        if quick:
            cmd.append("--quick")
        if self.own_limit_flag is not None:
            cmd += [self.own_limit_flag, f"{max(10.0, OWN_LIMIT_MARGIN * limit_seconds):.0f}"]
        if self.name == "gpu_rung" and gpu_memory is not None and not quick:
            cmd += ["--gpu-memory", gpu_memory]
        return cmd


CHILDREN = (
    Child("gpu_rung", 0.40, "--max-seconds"),
    Child("jax_gpu_rung", 0.34, "--max-seconds"),
    Child("block_kernels", 0.16, None),
    Child("muon", 0.10, None),
)
SHARES = {c.name: c.share for c in CHILDREN}

# The memory the planner lays L18 out for, by the marketed size of the card (the driver reports more:
# an H200 150.1 GB, for a part sold as 141 GB); `ladder plan --gpu-memory` takes the same words.
# Matched as whole words of the name: "H200" is inside "GH200" (a Grace Hopper part with 96 GB of HBM3, its
# "480GB" the CPU's memory), which is not in the table and gets the memory the device reports.
MARKETED_MEMORY = {"H200": "141GB", "H100": "80GB", "A100-SXM4-80GB": "80GB", "GB200": "186GB", "B200": "180GB"}


def gpu_device() -> dict[str, Any] | None:
    """The first GPU's name and memory from nvidia-smi (no CUDA context in this process), or None."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.strip().splitlines()[0] if out.strip() else ""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 3:
        return None
    return {"name": parts[0], "memory_mib": int(parts[1]) if parts[1].isdigit() else None, "driver": parts[2]}


def cuda_missing(device: dict[str, Any] | None) -> str | None:
    """Why the full run cannot use a GPU here, or None. `device`: what `gpu_device` read. Where nvidia-smi
    lists a GPU that is all (no probe, the run goes as it always did); where it lists none, torch is asked
    in a child process (no CUDA context, nor torch's import, in this one)."""
    if device is not None:
        return None
    code = "import torch; print(torch.cuda.is_available())"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as err:
        seen = f"probing torch failed ({err})"
    else:
        if proc.returncode == 0 and proc.stdout.strip().endswith("True"):
            return None
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]
        seen = "torch sees none" if proc.returncode == 0 else f"probing torch failed ({last})"
    return (f"no CUDA device: nvidia-smi lists no GPU and {seen}; run `python -m benchmarks.gpu_suite` on a GPU "
            "machine (--quick runs the children's CPU modes)")


def device_memory_flag(name: str | None) -> str | None:
    """`--gpu-memory` for gpu_rung: the card's marketed memory where the name says it, else None (the
    planner then takes the memory the device reports)."""
    if not name:
        return None
    for key, size in MARKETED_MEMORY.items():
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return size
    return None


def plan_limits(budget_seconds: float, used: dict[str, float], names: list[str]) -> float:
    """The next child's limit: its share of the budget plus what the children before it left unused,
    never more than what is left. `used`: seconds each finished child took; `names`: this run's
    children in order, the next one the first not in `used`."""
    if not math.isfinite(budget_seconds) or budget_seconds <= 0:
        raise ValueError(f"budget_seconds must be a finite number > 0, got {budget_seconds}")
    total_share = sum(SHARES[n] for n in names)
    done = [n for n in names if n in used]
    nxt = names[len(done)]
    granted_before = sum(SHARES[n] for n in done) / total_share * budget_seconds
    spent = sum(used.values())
    left = budget_seconds - spent
    own = SHARES[nxt] / total_share * budget_seconds + max(0.0, granted_before - spent)
    return max(0.0, min(own, left))


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_suite(suite_pid: int) -> None:
    """Run in the child before it execs (Linux): the kernel sends it SIGKILL when the suite dies, even of a
    SIGKILL, which no handler of the suite's can see. If the suite is already gone, the child ends now.
    Elsewhere, or without prctl, nothing changes: the signal and error paths still kill the group."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != suite_pid:
        os._exit(1)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child and whatever it started), if any of it is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_child(cmd: list[str], limit_seconds: float, out_dir: Path, name: str) -> dict[str, Any]:
    """Run one child in its own process group, killed with the group at the limit, or when this
    process stops waiting for it (a signal turned into an exception, any error); its stdout (one
    JSON object) and the tail of its stderr written under `out_dir`."""
    t0 = time.monotonic()
    stderr_path = out_dir / f"{name}.stderr.txt"
    with open(stderr_path, "wb") as err:
        suite_pid = os.getpid()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=(lambda: _die_with_suite(suite_pid)) if sys.platform.startswith("linux")
                                else None)
        try:
            try:
                stdout, _ = proc.communicate(timeout=limit_seconds)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                stdout, _ = proc.communicate()
                timed_out = True
        except BaseException:
            _kill_group(proc)       # the suite is stopping: no child of it outlives it
            proc.wait()
            raise
    seconds = time.monotonic() - t0
    tail = stderr_path.read_bytes()[-STDERR_TAIL_BYTES:]
    stderr_path.write_bytes(tail)
    row: dict[str, Any] = {"name": name, "command": cmd, "limit_seconds": round(limit_seconds, 1),
                           "seconds": round(seconds, 1), "returncode": None if timed_out else proc.returncode}
    try:
        payload = json.loads(stdout.decode(errors="replace")) if stdout.strip() else None
    except json.JSONDecodeError:
        payload = None
        (out_dir / f"{name}.stdout.txt").write_bytes(stdout[-STDERR_TAIL_BYTES:])
    if payload is not None:
        (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
        row["json"] = f"{name}.json"
    if timed_out:
        row["status"] = "timed_out"
    elif payload is None:
        row["status"] = "failed"
    elif payload.get("results", {}).get("ran") is False:
        row["status"] = "did_not_run"
        row["reason"] = payload["results"].get("reason")
    else:
        row["status"] = "ok" if proc.returncode == 0 else "failed"
    if row["status"] != "ok":
        lines = tail.decode(errors="replace").strip().splitlines()
        row["stderr_last_line"] = lines[-1][:500] if lines else ""
    row["checks"] = [dict(c, name=f"{name}.{c['name']}") for c in (payload or {}).get("checks", [])]
    return row


def run_suite(out_dir: Path, *, budget_seconds: float = DEFAULT_BUDGET_SECONDS, quick: bool = False,
                only: list[str] | None = None, progress=None) -> dict[str, Any]:
    """Run the children in order within `budget_seconds`; returns the summary (also in
    `out_dir/summary.json`, rewritten after each child)."""
    names = [c.name for c in CHILDREN] if only is None else list(only)
    unknown = [n for n in names if n not in SHARES]
    if unknown:
        raise ValueError(f"--only: unknown {','.join(unknown)}; the children are {','.join(SHARES)}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"children must be distinct names among {','.join(SHARES)}; got {names}")
    if not math.isfinite(budget_seconds) or budget_seconds <= 0:
        raise ValueError(f"budget_seconds must be a finite number > 0, got {budget_seconds}")
    by_name = {c.name: c for c in CHILDREN}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {out_dir}: cannot make a directory there ({err.strerror or err})") from None
    device = gpu_device()
    missing = None if quick else cuda_missing(device)
    gpu_memory = device_memory_flag(device["name"] if device else None)
    summary: dict[str, Any] = {
        "benchmark": "gpu_suite", "budget_seconds": budget_seconds, "quick": quick,
        "machine": {"gpu": device, "python": sys.version.split()[0], "gpu_memory_for_planner": gpu_memory},
        "results": {"children": []}, "checks": []}
    if missing is not None:
        summary["results"] |= {"ran": False, "reason": missing}
        if progress:
            progress(f"gpu_suite: {missing}: no child is run")
    used: dict[str, float] = {}
    for name in names:
        limit = plan_limits(budget_seconds, used, names)
        if missing is not None:
            row = {"name": name, "status": "skipped", "reason": missing, "checks": []}
        elif limit < 1.0:
            row = {"name": name, "status": "skipped", "reason": "no time left in the budget", "checks": []}
            used[name] = 0.0  # done, in no time: the next child's limit is its own, not this one's again
        else:
            if progress:
                progress(f"gpu_suite: {name} (limit {limit:.0f} s)")
            row = _run_child(by_name[name].command(quick, limit, gpu_memory), limit, out_dir, name)
            used[name] = row["seconds"]
        summary["results"]["children"].append(row)
        summary["checks"] += row["checks"]
        summary["seconds"] = round(sum(used.values()), 1)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        if progress:
            progress(f"gpu_suite: {name} {row['status']}" + (f" in {row['seconds']:.0f} s" if "seconds" in row else ""))
    return summary


def _stop_on_signal(signum: int, frame: Any) -> None:
    """SIGTERM as an exception, so the running child's process group is killed on the way out."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_suite", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for each child's JSON, stderr tail and summary.json")
    parser.add_argument("--budget-seconds", type=float, default=DEFAULT_BUDGET_SECONDS,
                        help=f"wall seconds for all children together (default {DEFAULT_BUDGET_SECONDS:.0f})")
    parser.add_argument("--only", help=f"comma-separated children to run, in this order (default: all, "
                                       f"{','.join(SHARES)})")
    parser.add_argument("--quick", action="store_true", help="the children's CPU modes at reduced widths")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    args = parser.parse_args(argv)

    # an --only that names no child is refused (by run_suite, with the rest of the flags), never "all of them"
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only is not None else None
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop_on_signal) if in_main_thread else None
    try:
        summary = run_suite(Path(args.out), budget_seconds=args.budget_seconds, quick=args.quick, only=only,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")  # one line, exit 2, nothing run or written
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
    else:
        for row in summary["results"]["children"]:
            sys.stdout.write(f"{row['name']}: {row['status']}" + (f" ({row['seconds']:.0f} s)" if "seconds" in row else "")
                             + "\n")
        for c in summary["checks"]:
            sys.stdout.write(f"  [{'ok ' if c['ok'] else 'FAIL'}] {c['name']}: {c['value']:.4g} {c['op']} {c['target']:g}\n")
    return 0 if all(r["status"] == "ok" for r in summary["results"]["children"]) else 1


if __name__ == "__main__":
    sys.exit(main())
