"""The nightly report: a markdown table of every comparison and two plots (BPB per domain and
throughput, golden vs tonight), written next to the night's runs. It names both machine classes and
says when throughput was not compared (a golden from another class)."""

from __future__ import annotations

from pathlib import Path

from ladder.run.nightly import NightlyReport


def write_report(report: NightlyReport, golden: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _plots(report, golden, out_dir)
    status = "PASS" if not report.regressions else f"FAIL ({len(report.regressions)} regression(s))"
    lines = [f"# Nightly rung regression: {report.spec}: {status}", "",
             f"Golden file created {golden.get('created_utc', '?')} from {golden.get('repeats', '?')} repeat(s); "
             f"tolerances {golden['tolerances']} (measured noise {golden.get('noise', {})}).", "",
             f"Machine class: golden {report.golden_machine_class or 'not recorded'}, tonight "
             f"{report.machine_class or 'unknown'}; throughput "
             f"{'compared' if report.throughput_compared else 'not compared'}.", "",
             *[f"**Note:** {n}" for n in report.notes], *([""] if report.notes else []),
             "| trial | metric | golden | tonight | delta | tolerance | verdict |", "|---|---|---|---|---|---|---|"]
    for c in report.comparisons:
        mark = {"regression": "**REGRESSION**", "missing": "**MISSING**",
                "not comparable": "not comparable (other machine class)"}.get(c.verdict, c.verdict)
        lines.append(f"| {c.trial} | {c.metric} | {c.golden:.6g} | {c.current:.6g} | {c.delta:+.3g} | "
                     f"{c.tolerance:.3g} | {mark} |")
    lines += [""] + [f"![{p.stem}]({p.name})" for p in plots]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _plots(report: NightlyReport, golden: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    trials = list(golden["trials"])
    domains = sorted({d for t in trials for d in golden["trials"][t]["bpb"]})
    fig, axes = plt.subplots(1, len(trials), figsize=(4.5 * len(trials), 3.5), squeeze=False)
    for ax, name in zip(axes[0], trials):
        want = [golden["trials"][name]["bpb"].get(d, float("nan")) for d in domains]
        got_m = report.measurements.get(name)
        got = [got_m.bpb.get(d, float("nan")) if got_m else float("nan") for d in domains]
        xs = range(len(domains))
        ax.bar([x - 0.2 for x in xs], want, width=0.4, label="golden")
        ax.bar([x + 0.2 for x in xs], got, width=0.4, label="tonight")
        ax.set_xticks(list(xs), domains, rotation=45, ha="right")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("final BPB")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "bpb.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(1.5 + 1.5 * len(trials), 3.2))
    want = [golden["trials"][n]["tokens_per_second"] for n in trials]
    got = [report.measurements[n].tokens_per_second if n in report.measurements else float("nan") for n in trials]
    xs = range(len(trials))
    ax.bar([x - 0.2 for x in xs], want, width=0.4, label="golden")
    ax.bar([x + 0.2 for x in xs], got, width=0.4, label="tonight")
    ax.set_xticks(list(xs), trials, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tokens / s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "throughput.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)
    return paths
