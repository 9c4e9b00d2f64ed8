"""Human-readable views of EAD and benchmark results: a markdown table and PNG plots.

Pure functions of the JSON objects ``dex-ead`` and ``decode/bench.py`` write, so a result file can
be re-plotted without re-running anything. Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_ead", "bench_markdown", "plot_bench"]

TICK_METHODS = ("ar", "dex", "dex_no_decs", "single_exit", "layerskip", "oracle", "shallowest_match")
LABELS = {
    "ar": "pipelined AR", "dex": "DEX (DECS, W=inf)", "dex_no_decs": "DEX (no DECS, W=inf)",
    "single_exit": "best single exit", "layerskip": "best LayerSkip-style", "oracle": "EAD oracle",
    "shallowest_match": "shallowest-match bound",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------ EAD
def plot_ead(summaries: dict, out_dir: str | Path, title: str = "") -> list[str]:
    """``summaries``: ``{"lens": ead_summary, "adapters": ead_summary?}`` -> two PNG files."""
    plt, out = _pyplot(), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    kinds = [k for k in ("lens", "adapters") if summaries.get(k) and summaries[k]["tokens"]]
    width = 0.8 / max(1, len(kinds))
    for j, kind in enumerate(kinds):
        s = summaries[kind]
        share = [c / s["tokens"] for c in s["ead_histogram"]]
        ax.bar([d - 0.4 + width * (j + 0.5) for d in s["depths"]], share, width=width,
               label=f"{kind} (mean {s['mean_ead']:.2f} layers)")
    if kinds and len(summaries[kinds[0]]["depths"]) <= 32:
        ax.set_xticks(summaries[kinds[0]]["depths"])
    ax.set_xlabel("EAD: earliest available depth (layers)")
    ax.set_ylabel("fraction of committed tokens")
    ax.set_title(f"EAD distribution {title}".strip())
    ax.legend()
    fig.tight_layout()
    paths.append(str(out / "ead_histogram.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for kind in kinds:
        s = summaries[kind]
        ax.plot(s["depths"], [100 * a for a in s["agreement"]], marker="o", label=kind)
    if kinds and len(summaries[kinds[0]]["depths"]) <= 32:
        ax.set_xticks(summaries[kinds[0]]["depths"])
    ax.set_xlabel("exit depth d (layers)")
    ax.set_ylabel("top-1 agreement with the final token (%)")
    ax.set_ylim(0, 102)
    ax.set_title(f"Per-depth agreement {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(str(out / "agreement.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


# ------------------------------------------------------------------ bench selection
def _key(run: dict) -> str | None:
    m = run["method"]
    if m == "dex":
        if run["width"] is not None:
            return None
        return "dex" if run["decs"] else "dex_no_decs"
    if m in ("single_exit", "layerskip"):
        return m if run.get("best") else None
    return m if m in TICK_METHODS else None


def _headline(runs: list[dict]) -> dict:
    """(exits, adapters) -> method key -> run, for the unbounded-width DEX and the best baselines."""
    table: dict = {}
    for r in runs:
        key = _key(r)
        if key is None:
            continue
        modes = (False, True) if key == "ar" else (r["adapters"],)
        for mode in modes:
            table.setdefault((tuple(r["exits"]), mode), {})[key] = r
    return table


def _f(v, digits=2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def bench_markdown(bench: dict) -> str:
    runs, lines = bench["runs"], []
    settings = bench.get("settings", {})
    tokens = sum(p["new_tokens"] for p in bench["prompts"])
    lines += [f"# DEX benchmark: {bench['model']}", "",
              f"{len(bench['prompts'])} prompts, {tokens} committed tokens (max {settings.get('max_new_tokens')} "
              f"new per prompt), {settings.get('dtype')} on {settings.get('device')}, "
              f"{settings.get('threads')} threads. Tick model: ticks per committed token (lower is better); "
              "speedup = N / ticks per token vs pipelined AR on the same N explorers.", ""]
    lines += ["## Ticks per token", "",
              "| adapters | exits | N | AR | DEX | DEX no-DECS | best single exit (depth) | best LayerSkip (depth, g) "
              "| oracle | shallowest match | headroom realised | DEX speedup | DEX stage-fwd/token |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (exits, mode), row in sorted(_headline(runs).items(), key=lambda kv: (kv[0][1], len(kv[0][0]), kv[0][0])):
        if set(row) == {"ar"}:
            continue
        n = len(exits)
        g = lambda k: row.get(k, {}).get("ticks_per_token")  # noqa: E731
        se, ls, dex = row.get("single_exit", {}), row.get("layerskip", {}), row.get("dex", {})
        lines.append(
            f"| {'yes' if mode else 'lens'} | {','.join(map(str, exits))} | {n} | {_f(g('ar'))} | {_f(g('dex'))} "
            f"| {_f(g('dex_no_decs'))} | {_f(g('single_exit'))} ({se.get('exit_depth', '–')}) "
            f"| {_f(g('layerskip'))} ({ls.get('exit_depth', '–')}, {ls.get('g', '–')}) | {_f(g('oracle'))} "
            f"| {_f(g('shallowest_match'))} | {_f(dex.get('headroom_realised'))} | {_f(dex.get('speedup_vs_ar'))} "
            f"| {_f(dex.get('stage_forwards_per_token'), 1)} |")
    policy = [r for r in runs if r["method"] == "dex" and r["width"] is not None]
    if policy:
        sets = {(tuple(r["exits"]), r["adapters"]) for r in policy}
        policy += [r for r in runs if r["method"] == "dex" and r["width"] is None and r["decs"]
                   and (tuple(r["exits"]), r["adapters"]) in sets]
        lines += ["", "## Admission policy (width below what the lattice wants, DECS on)", "",
                  "W = inf is the reference: its max live branches is what the lattice wants.", "",
                  "| adapters | exits | width | policy | ticks/token | speedup | stage-fwd/token | max live branches |",
                  "|---|---|---|---|---|---|---|---|"]
        order = lambda r: (r["adapters"], r["explorers"], r["exits"], r["width"] or 1 << 30, r["policy"] or "")  # noqa: E731
        for r in sorted(policy, key=order):
            lines.append(f"| {'yes' if r['adapters'] else 'lens'} | {','.join(map(str, r['exits']))} "
                         f"| {r['width'] or 'inf'} | {r['policy'] or '–'} | {_f(r['ticks_per_token'], 3)} "
                         f"| {_f(r['speedup_vs_ar'])} | {_f(r['stage_forwards_per_token'], 1)} "
                         f"| {r.get('max_live_branches', '–')} |")
    wall = [r for r in runs if r["tokens_per_s"] is not None]
    if wall:
        lines += ["", "## Wall clock (same prompts, same process)", "",
                  "| method | setting | tokens/s | vs HF generate |", "|---|---|---|---|"]
        base = next((r["tokens_per_s"] for r in runs if r["method"] == "hf_generate"), None)
        shown: set[str] = set()
        for r in sorted(wall, key=lambda r: (METHOD_ORDER.get(r["method"], 9), r["adapters"], r["explorers"] or 0,
                                             r["exits"] or [])):
            if r["method"] == "dex" and (r["width"] is not None or not r["decs"]):
                continue
            if r["method"] == "hf_early_exit" and not r.get("best"):
                continue
            if _setting(r) in shown:
                continue  # one self-speculative run serves every set with the same draft depth and g
            shown.add(_setting(r))
            lines.append(f"| {r['method']} | {_setting(r)} | {_f(r['tokens_per_s'], 1)} "
                         f"| {_f(r['tokens_per_s'] / base if base else None)} |")
    bad = [r for r in runs if r.get("lossless") is False]
    lines += ["", f"Lossless check: {'every DEX and HF output equalled plain AR' if not bad else f'{len(bad)} runs differed from plain AR (see bench.json)'}."]
    return "\n".join(lines) + "\n"


METHOD_ORDER = {"hf_generate": 0, "hf_early_exit": 1, "layerskip": 2, "dex": 3}


def _setting(r: dict) -> str:
    exit_kind = "adapters" if r["adapters"] else "lens"
    if r["method"] == "hf_early_exit":
        return f"assistant_early_exit={r['k']} (best; lens)"
    if r["method"] == "layerskip":
        return f"draft depth {r['exit_depth']}, g={r['g']}, {exit_kind} (single process)"
    if r["method"] == "dex":
        return f"exits {','.join(map(str, r['exits']))}, W=inf, DECS, {exit_kind} (single process)"
    return "greedy"


# ------------------------------------------------------------------ bench plots
def plot_bench(bench: dict, out_dir: str | Path) -> list[str]:
    """ticks_per_token.png, speedup.png, headroom.png, stage_forwards.png over uniform N."""
    plt, out = _pyplot(), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    L = bench.get("settings", {}).get("num_layers")
    table = _headline(bench["runs"])
    uniform = {k: v for k, v in table.items() if L is None or _is_uniform(k[0], L)}
    modes = sorted({mode for _, mode in uniform})
    specs = [
        ("ticks_per_token.png", "ticks_per_token", "ticks per committed token", TICK_METHODS, "linear"),
        ("speedup.png", "speedup_vs_ar", "speedup vs pipelined AR (x)", TICK_METHODS, "linear"),
        ("headroom.png", "headroom_realised", "headroom realised (AR-DEX)/(AR-oracle)", ("dex", "dex_no_decs"), "linear"),
        ("stage_forwards.png", "stage_forwards_per_token", "stage-forwards per committed token",
         ("ar", "dex", "dex_no_decs", "single_exit", "layerskip", "oracle"), "log"),
    ]
    from matplotlib.ticker import ScalarFormatter

    ns = sorted({len(exits) for exits, _ in uniform})
    paths = []
    for name, field, ylabel, methods, yscale in specs:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for mode in modes:
            series = sorted((len(exits), row) for (exits, m), row in uniform.items() if m == mode)
            for method in methods:
                i = TICK_METHODS.index(method)  # one colour and marker per method across the plots
                if mode and method == "ar":
                    continue
                pts = [(n, row[method][field]) for n, row in series if method in row and row[method][field] is not None]
                if not pts:
                    continue
                ax.plot(*zip(*pts), marker="os^vDPX*"[i % 8], linestyle="--" if mode else "-", color=f"C{i}",
                        label=f"{LABELS[method]}{' + adapters' if mode else ''}")
        if field == "headroom_realised":
            ax.axhline(1.0, color="gray", linewidth=1, linestyle=":", label="= EAD oracle")
        if field == "stage_forwards_per_token":
            ax.set_title(f"{bench['model']}: {ylabel}\n(AR and the oracle coincide: N per token)", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_yscale(yscale)
        if yscale == "log":
            ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("explorers N (uniform stages)")
        ax.set_ylabel(ylabel)
        if field != "stage_forwards_per_token":
            ax.set_title(f"{bench['model']}: {ylabel}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        paths.append(str(out / name))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def _is_uniform(exits: tuple[int, ...], num_layers: int) -> bool:
    from .exploration import ExplorationSet

    return ExplorationSet.uniform(len(exits), num_layers).exits == tuple(exits)
