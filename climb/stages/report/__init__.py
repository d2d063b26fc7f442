"""Stage 7, report: one Markdown page with PNG plots, the same page as HTML, and `summary.json`.

Reads: every stage's outputs (`<run>/validate/` where it ran).
Writes: `<run>/report/`: `report.md`, `index.html`, PNG figures and `summary.json`.

Plots: cluster sizes, a 2-D map of the clusters (PCA of their centroids,
sized by documents), objective by iteration, predicted vs measured, and the
final weights against the natural token shares, with the mixture by source beside
them (climb.stages.search.sources) and each cluster's main sources in its table. Where the
objective weighs several metrics (or the swarm recorded several), the trade-offs between them
and any re-picks (`climb repick`), with a Pareto plot (climb/stages/report/tradeoffs.py). The page ends with the
comparison table (found mixture vs uniform vs natural, each the mean of fresh
proxies trained with seeds the search never used), which is also printed and
written as `report/summary.json`. When the validate stage has run, a "Does it
transfer?" section gives the larger model's verdicts and the rank transfer plot.

`report/index.html` is `report.md` converted to HTML (`page_html`): one self-contained
file to send or open on a phone, every figure inlined as a data: URI, the style inline,
no script and no reference to anything outside it. Text in the page (a cluster's top
terms come from the corpus) is shown as text, never read as HTML.

    climb report --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import base64
import html
import logging
from pathlib import Path

import numpy as np

from climb.config import RunConfig, digest
from climb.config.objective import describe
from climb.io.files import read_json, write_json
from climb.optimize.predictor import goal_sign
from climb.runtime.stage import execute, upstream_key
from climb.runtime.layout import RunPaths
from climb.stages.search import read_results
from climb.stages.search.summary import compute_table, search_summary

log = logging.getLogger(__name__)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _label(c: dict) -> str:
    return f"{c['cluster']}: " + " ".join(c["top_terms"][:3])


def plot_clusters(clusters: list[dict], centroids: np.ndarray, out: Path) -> list[str]:
    plt = _plt()
    docs = np.array([c["docs"] for c in clusters])
    fig, ax = plt.subplots(figsize=(8, max(3, 0.28 * len(clusters))))
    ax.barh([_label(c) for c in clusters], docs, color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel("documents")
    ax.set_title("Cluster sizes")
    fig.tight_layout()
    fig.savefig(out / "cluster_sizes.png", dpi=110)
    plt.close(fig)
    from sklearn.decomposition import PCA
    xy = PCA(n_components=2, random_state=0).fit_transform(centroids) if len(centroids) > 2 else \
        np.c_[np.arange(len(centroids)), np.zeros(len(centroids))]
    fig, ax = plt.subplots(figsize=(7, 6))
    ax.scatter(xy[:, 0], xy[:, 1], s=30 + 600 * docs / docs.max(), alpha=0.5, color="#dd8452")
    for c, (x, y) in zip(clusters, xy):
        ax.annotate(_label(c), (x, y), fontsize=7, ha="center")
    ax.set_title("Cluster map (PCA of centroids; area ~ documents)")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(out / "cluster_map.png", dpi=110)
    plt.close(fig)
    return ["cluster_sizes.png", "cluster_map.png"]


def plot_search(results: list[dict], plans: dict, goal: str, name: str, out: Path) -> list[str]:
    plt = _plt()
    # In a stable order, not the log's (parallel proxies finish in any order; a resumed search
    # appends in another): each point keeps its jitter, so the figure is the same bytes.
    results = sorted(results, key=lambda r: (r.get("iteration", -1), str(r.get("mixture_id", "")),
                                             str(r.get("seed", ""))))
    # A proxy stopped at its rung (search.halving) holds a predicted final value: drawn hollow,
    # and neither "best so far" nor "measured".
    stopped = [r for r in results if r["status"] == "ok" and r["iteration"] >= 0 and "stopped" in r]
    ok = [r for r in results if r["status"] == "ok" and r["iteration"] >= 0 and "stopped" not in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    its = np.array([r["iteration"] + 1 for r in ok])
    ys = np.array([r["objective"] for r in ok])
    jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(its))
    ax.scatter(its + jitter, ys, alpha=0.6, label="trained to the end" if stopped else None)
    if stopped:
        si = np.array([r["iteration"] + 1 for r in stopped])
        ax.scatter(si + np.random.default_rng(1).uniform(-0.12, 0.12, len(si)), [r["objective"] for r in stopped],
                   facecolors="none", edgecolors="C0", alpha=0.6, label="stopped at the rung (predicted)")
    best = [min(goal_sign(goal) * ys[its <= i]) * goal_sign(goal) for i in sorted(set(its))]
    ax.plot(sorted(set(its)), best, "k-o", label="best so far")
    ax.set_xticks(sorted(set(its.tolist())))
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"{name} ({goal})")
    ax.set_title("Objective by iteration")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "score_by_iteration.png", dpi=110)
    plt.close(fig)
    pred = [(plans.get(r["mixture_id"]), r["objective"]) for r in ok]
    pred = [(p, y) for p, y in pred if p is not None]
    files = ["score_by_iteration.png"]
    if pred:
        p, y = np.array(pred).T
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.scatter(p, y)
        lo, hi = min(p.min(), y.min()), max(p.max(), y.max())
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xlabel("predicted (before training)")
        ax.set_ylabel("measured")
        ax.set_title("Predicted vs measured (iterations 2+)")
        fig.tight_layout()
        fig.savefig(out / "predicted_vs_measured.png", dpi=110)
        plt.close(fig)
        files.append("predicted_vs_measured.png")
    return files


def _cheaper(cfg: RunConfig, results: list[dict]) -> str:
    """What the search did to spend less on proxies, as a clause of the report's first line."""
    parts = []
    if cfg.search.halving:
        n = sum("stopped" in r for r in results)
        parts.append(f"{n} stopped at {cfg.search.halving[0]:g} of their steps by successive halving "
                     f"(their values predicted from the curves)")
    if cfg.search.experts:
        parts.append(f"after one expert per cluster trained {cfg.search.experts:g} of the steps")
    if cfg.search.base:
        parts.append(f"each continuing a shared base trained {cfg.search.base:g} of the steps on the natural mixture")
    if cfg.search.merge:
        parts.append("mixtures scored by merging the base's continuations per cluster")
    return f", {'; '.join(parts)}" if parts else ""


def plot_weights(final: np.ndarray, natural: np.ndarray, clusters: list[dict], out: Path) -> str:
    plt = _plt()
    idx = np.arange(len(final))
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(final)), 4))
    ax.bar(idx - 0.2, natural, 0.4, label="natural (token share)", color="#999999")
    ax.bar(idx + 0.2, final, 0.4, label="found mixture", color="#c44e52")
    ax.set_xticks(idx, [str(c["cluster"]) for c in clusters])
    ax.set_xlabel("cluster")
    ax.set_ylabel("weight")
    ax.set_title("Final weights vs natural distribution")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "weights.png", dpi=110)
    plt.close(fig)
    return "weights.png"


def summary_table(summary: dict) -> str:
    """The comparison as Markdown: each mixture's mean, and climb minus it with a 95% interval."""
    t, res = summary["target"], summary["results"]
    if not res:
        return "(no comparison results: every comparison proxy failed; see search/comparison.json)"
    comp = summary.get("comparison", {})
    best = min(res, key=lambda k: goal_sign(t["goal"]) * res[k])
    lines = [f"| mixture | {t['name']} ({t['goal']}) | climb − mixture (95% CI) | verdict |",
             "| --- | --- | --- | --- |"]
    for k, v in res.items():
        diff, verdict = _verdict_cells(comp.get(k), "", "")
        if comp.get(k, {}).get("ci95") and comp[k].get("seeds_to_resolve"):
            verdict += f" (about {comp[k]['seeds_to_resolve']} seeds would resolve it)"
        lines.append(f"| {k}{' (best)' if k == best else ''} | {v:.4f} | {diff} | {verdict} |")
    rerun = (summary.get("steadiness") or {}).get("rerun_sd")
    if rerun is not None and "climb" in res:
        lines.append(f"\nclimb {res['climb']:.4f}, sd {rerun:.4f} over another search seed (the run's own estimate: "
                     "its search simulated again on what it measured"
                     + ("; every simulation found this mixture, and one run's estimate is itself a draw)"
                        if rerun == 0 else ")"))
    return "\n".join(lines)


def _verdict_cells(c: dict | None, no_diff: str, no_verdict: str) -> tuple[str, str]:
    """A paired comparison as table cells: the difference with its 95% interval, and the verdict."""
    if not c or not c.get("ci95"):
        return no_diff, no_verdict
    verdict = f"climb {c['verdict']}" if c["verdict"] != "not resolved" else "not resolved"
    return f"{c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]", verdict


def quality_lines(q: dict) -> str:
    """The run's noise, signal and predictor skill as Markdown bullets."""
    def f(v):
        return "n/a" if v is None else f"{v:.4f}"
    oof = ", ".join("n/a" if v is None else f"{v:.2f}" for v in q.get("predictor_oof_spearman", []))
    snr = "n/a" if q.get("snr") is None else f"{q['snr']:.1f}"
    lines = [f"- seed noise of one proxy (sd): {f(q.get('seed_sd'))}; paired (mixtures sharing a seed): "
             f"{f(q.get('paired_sd'))} ({q.get('noise_df', 0)} degrees of freedom)",
             f"- spread of the objective across iteration 1's swarm (sd): {f(q.get('swarm_sd'))}",
             f"- signal-to-noise (swarm sd / paired sd): {snr}"
             f" (want >= {q.get('thresholds', {}).get('snr', 2)})",
             f"- predictor out-of-fold Spearman by iteration: {oof or 'n/a'}"]
    if q.get("experts_spearman") is not None:
        skill = ", ".join("n/a" if v is None else f"{v:.2f}" for v in q["experts_spearman"])
        lines.append(f"- experts' ensemble loss against the measured results, Spearman by iteration: {skill or 'n/a'}")
    if q.get("merge_spearman") is not None:
        skill = ", ".join("n/a" if v is None else f"{v:.2f}" for v in q["merge_spearman"])
        lines.append(f"- merged models' objective against the measured results, Spearman by iteration: "
                     f"{skill or 'n/a'}")
    st = q.get("steadiness") or {}
    if st.get("rerun_sd") is not None:
        lines.append(f"- how far another search seed's answer may fall: this search simulated {st['rerun_runs']} times "
                     f"with other seeds on what its own proxies measured finds answers with sd {st['rerun_sd']:.4f} "
                     f"(range {st['rerun_range'][0]:.4f} - {st['rerun_range'][1]:.4f})"
                     + ("; every simulated search found the same mixture, and one run's figure is itself a draw "
                        "(docs/trust.md)" if st["rerun_sd"] == 0 else ""))
    elif st.get("rerun_skipped") == "finalists":
        lines.append("- how far another search seed's answer may fall: not simulated for a search whose last iteration "
                     "measures its finalists again (search.finalists; docs/trust.md gives what its seed-to-seed "
                     "spread measured)")
    elif st.get("rerun_skipped"):
        lines.append(f"- how far another search seed's answer may fall: not simulated for a search steered by the "
                     f"{st['rerun_skipped']} (docs/trust.md gives what its seed-to-seed spread measured)")
    if st.get("pick_sd") is not None:
        lines.append(f"- steadiness of the pick: on {st['n_boot']} bootstrap resamples of this run's proxies its "
                     f"predicted objective has sd {st['pick_sd']:.4f} (range {st['pick_range'][0]:.4f} - "
                     f"{st['pick_range'][1]:.4f}; the resampled picks lie {st['pick_l1']:.2f} apart in L1 on average)")
    if st.get("posterior_spread") is not None:
        lines.append(f"- under the predictor's posterior the best mixture is {st['posterior_regret']:.4f} better than this pick on average, sd "
                     f"{st['posterior_spread']:.4f} (regions this run never measured included)")
    if q.get("reuse"):
        from climb.stages.search.reuse import sentence
        lines.append(f"- {sentence(q['reuse'])}")
    lines += [f"- **warning**: {w}" for w in q.get("warnings", [])]
    return "\n".join(lines)


def terminal_lines(summary: dict, mix: dict, clusters: list[dict], middle: str = "") -> str:
    """What the terminal ends with: the comparison, `middle` (how far to trust it), then the found
    mixture's heaviest clusters and the verdict, last, where the eye lands."""
    from climb.stages.search.summary import mixture_lines, verdict
    v = summary.get("verdict") or verdict(summary)
    return (summary_table(summary) + (f"\n\n{middle}" if middle else "")
            + "\n\nFound mixture (by cluster, heaviest first):\n"
            + mixture_lines(mix["weights"], clusters) + "\n\n" + v["sentence"])


def plot_transfer(summary: dict, name: str, out: Path) -> str | None:
    """Proxy score against the larger model's score, one point per validated mixture."""
    pts = [q for q in summary["points"] if q["proxy"] is not None and q["validation"] is not None]
    if len(pts) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for role, color, label in (("rank", "#4c72b0", "search mixtures"), ("compared", "#c44e52", "compared mixtures")):
        sel = [q for q in pts if q["role"] == role]
        if sel:
            ax.scatter([q["proxy"] for q in sel], [q["validation"] for q in sel], color=color, label=label)
    for q in pts:
        if q["role"] == "compared":
            ax.annotate(q["name"], (q["proxy"], q["validation"]), fontsize=8, xytext=(4, 4),
                        textcoords="offset points")
    r = summary["rank"]
    rho = "n/a" if r["spearman"] is None else f"{r['spearman']:+.2f}"
    short = name if len(name) <= 30 else f"target ({name.count('+') + 1} metrics averaged)"
    ax.set_xlabel(f"proxy: {short}")
    ax.set_ylabel(f"larger model: {short}")
    ax.set_title(f"Rank transfer (Spearman over search mixtures {rho})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "transfer.png", dpi=110)
    plt.close(fig)
    return "transfer.png"


def _comparison_rows(block: dict, label: str) -> list[str]:
    if block.get("constant") is not None:  # e.g. an accuracy every model scores 0 on: nothing to compare
        return [f"| {label} ({block['goal']}) | all | {block['constant']:.4f} | {block['constant']:.4f} | "
                "every model scored the same | uninformative at this scale |"]
    rows = []
    for n, c in block["comparison"].items():
        diff, verdict = _verdict_cells(c, "n/a", "not resolved")
        ours, theirs = block["means"].get("climb"), block["means"].get(n)
        fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
        rows.append(f"| {label} ({block['goal']}) | {n} | {fmt(ours)} | {fmt(theirs)} | {diff} | {verdict} |")
    return rows


def transfer_section(v: dict) -> str:
    """"Does it transfer?": the larger model's verdicts (target and held-out) and the rank statistic."""
    m, px = v["model"], v["proxy"]
    size = (f"{m['n_layer']} layers x {m['n_embd']} wide"
            + (f", {m['parameters']:,} parameters" if m.get("parameters") else "")
            + f", {m['tokens']:,} training tokens")
    small = (f"{px['n_layer']} x {px['n_embd']}" + (f", {px['parameters']:,} parameters" if px.get("parameters")
                                                      else "") + f", {px['tokens']:,} tokens")
    rows = _comparison_rows(v["target"], f"target {v['target']['name']}")
    for metric, block in v["heldout"].items():
        rows += _comparison_rows(block, f"held-out {metric[len('heldout/'):]}")
    r = v["rank"]
    if r["spearman"] is None:
        rank = "Rank transfer: not measured (fewer than 3 search mixtures validated)."
    else:
        ci = f", 95% interval [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]" if r["ci95"] else ""
        if r.get("p_value") is not None:
            ci += f", one-sided permutation p = {r['p_value']:.2g}"
        a = r["all_mixtures"]
        rank = (f"Rank transfer: Spearman between proxy score and larger-model score **{r['spearman']:+.2f}**{ci} "
                f"over {r['n']} search mixtures chosen across the range of proxy scores"
                + (f" ({a['spearman']:+.2f} over all {a['n']} validated mixtures)." if a["spearman"] is not None
                   else "."))
    return "\n".join([
        f"A larger model ({size}; the proxies: {small}) trained on each mixture with the same "
        f"{len(v['seeds'])} paired seeds ({v['seeds'][0]}..{v['seeds'][-1]})."
        + (" The held-out evaluations were never seen by the search." if v["heldout"] else ""), "",
        "| evaluation | vs | climb | baseline | climb − baseline (95% CI) | verdict |",
        "| --- | --- | --- | --- | --- | --- |", *rows, "", rank])


_STYLE = """
body{margin:0;background:#fff;color:#1b1b1b;
  font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:60rem;margin:0 auto;padding:.5rem 1rem 2rem}
h1{font-size:1.5rem;line-height:1.25}
h2{font-size:1.25rem;margin-top:2rem;padding-bottom:.2rem;border-bottom:1px solid #ddd}
h1,h2,p,li{overflow-wrap:anywhere}
img{display:block;max-width:100%;height:auto;margin:1rem 0}
.table{overflow-x:auto;margin:1rem 0}
table{border-collapse:collapse;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;white-space:nowrap}
th{background:#f3f3f3}
code{background:#f3f3f3;padding:0 .2em;font-size:.9em}
"""


def page_html(page: str, folder: Path, title: str) -> str:
    """The report page (`report.md`'s text) as one self-contained HTML page.

    Converted by Python-Markdown with its tables extension, with raw HTML and autolinks
    turned off, so that any `<`, `>` or `&` in the text (top terms come from the corpus)
    is escaped and shows as text. Each image that names a PNG in `folder` becomes a
    data: URI; any other image becomes its alt text and any link its text, so the page
    refers to nothing outside itself (its Content-Security-Policy allows nothing else
    either). Tables sit in a wrapper that scrolls sideways on a narrow screen.
    """
    import xml.etree.ElementTree as etree

    import markdown
    from markdown.extensions import Extension
    from markdown.treeprocessors import Treeprocessor

    class SelfContained(Treeprocessor):
        def run(self, root):
            for parent in list(root.iter()):
                for i, el in enumerate(list(parent)):
                    if el.tag == "table":
                        wrap = etree.Element("div", {"class": "table"})
                        wrap.tail, el.tail = el.tail, None
                        wrap.append(el)
                        parent[i] = wrap
                    elif el.tag == "img":
                        src = el.get("src", "")
                        f = folder / src
                        if src.endswith(".png") and "/" not in src and "\\" not in src and f.is_file():
                            el.set("src", "data:image/png;base64," + base64.b64encode(f.read_bytes()).decode())
                        else:
                            text = etree.Element("span")
                            text.text, text.tail = el.get("alt", ""), el.tail
                            parent[i] = text
                    elif el.tag == "a":
                        el.tag = "span"
                        el.attrib.clear()

    class Escaped(Extension):
        def extendMarkdown(self, md):
            md.preprocessors.deregister("html_block")
            for name in ("html", "autolink", "automail"):
                md.inlinePatterns.deregister(name)
            md.treeprocessors.register(SelfContained(md), "self_contained", 15)  # after "inline" (20)

    body = markdown.Markdown(extensions=["tables", Escaped()], output_format="html").convert(page)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">",
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        "<main>",
        body,
        "</main>",
        "</body>",
        "</html>",
        ""])


def _cell(text: str) -> str:
    """Corpus words (a source's name) in a Markdown table cell: no pipes."""
    return text.replace("|", "/")


def by_source_table(by: dict) -> str:
    """The found, natural and uniform mixtures by source as a Markdown table."""
    lines = ["| source | natural | found | uniform |", "| --- | --- | --- | --- |"]
    lines += [f"| {_cell(name)} | {by['natural'][j]:.3f} | {by['climb'][j]:.3f} | {by['uniform'][j]:.3f} |"
              for j, name in enumerate(by["names"])]
    return "\n".join(lines)


def _by_source_section(summary: dict) -> str:
    """The report's mixture by source (each source's share of the tokens), where the sources are known."""
    by = summary.get("by_source")
    if not by:
        return ""
    return ("\n## By source\n\nEach source's share of the tokens of the found mixture, the natural one (the "
            "corpus as it is) and the uniform one; the clusters' own sources are in the table of clusters "
            "below.\n\n" + by_source_table(by) + "\n")


def _duplicates_section(paths: RunPaths) -> str:
    """The report's duplicates and drift, where the run has them (climb.stages.cluster.dedup, cluster)."""
    from climb.stages.search.summary import duplicates, duplicates_table
    d = duplicates(paths)
    if d is None:
        return ""
    t = d["total"]
    what = ("They were dropped: the token store and the export hold the first of each group only."
            if d["dropped"] else "They stay in the token store and the export (`dedup.drop = true` drops them).")
    text = (f"\n## Duplicates\n\n{t['exact']:,} exact and {t['near']:,} near duplicates among {t['docs']:,} "
            f"documents ({100 * (t['exact'] + t['near']) / max(1, t['docs']):.2f}%). {what}\n\n"
            + duplicates_table(d) + "\n")
    if d.get("drift"):
        text += f"\n**Corpus drift.** {d['drift']['message']}.\n"
    return text


def _contamination_section(paths: RunPaths, quality: dict) -> str:
    """The report's contamination check (climb.stages.tokenize.contamination), where the search ran one."""
    if not paths.search.contamination.exists():
        return ""
    scan = read_json(paths.search.contamination)
    lean = quality.get("contamination") or {}
    from climb.stages.tokenize.contamination import scanned
    head = (f"\n## Contamination\n\n{scan['docs']:,} of the {scanned(scan):,} documents the proxies read "
            f"({scan['tokens']:,} tokens) share a {scan['ngram']}-gram with the target's text")
    if lean:
        head += (f"; the found mixture draws {100 * lean['found']:.2f}% of its tokens from them, the natural "
                 f"mixture {100 * lean['natural']:.2f}%")
    rows = [c for c in scan["clusters"] if c["docs"]]
    if not rows:
        return head + ".\n"
    table = ["| cluster | documents | tokens | of the cluster's tokens | example |", "| --- | --- | --- | --- | --- |"]
    for c in rows:
        ex = c["examples"][0] if c["examples"] else {"id": "", "text": ""}
        table.append(f"| {c['cluster']} | {c['docs']:,} | {c['tokens']:,} | "
                     f"{100 * c['tokens'] / max(1, c['cluster_tokens']):.2f}% | `{ex['id']}`: "
                     f"{ex['text'][:80].replace('|', '/')} |")
    return head + ".\n\n" + "\n".join(table) + "\n"


def validation_summary(cfg: RunConfig, paths: RunPaths) -> tuple[dict | None, str]:
    """The validate stage's summary and manifest hash, if it finished for the current search and config."""
    from climb.stages import validate
    if not paths.manifest("validate").exists():
        return None, ""
    vkey = upstream_key(paths, "validate")
    m = read_json(paths.manifest("validate"))
    if m.get("key", m.get("hash")) != validate.key(cfg, paths):
        log.info("report: validate/ is from another search or config; run `climb validate` to bring it up to date")
        return None, ""
    return read_json(paths.validate.summary), vkey


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    validation, vkey = validation_summary(cfg, paths)
    # Re-picks (climb repick) enter the key only where there are any: a run without them keeps its key.
    from climb.io.digests import file_digest
    repicks = [file_digest(f) for f in paths.search.repicks]
    key = digest(upstream_key(paths, "search"), cfg.name, *([vkey] if vkey else []), *([repicks] if repicks else []))
    stats = execute(paths, "report", key, lambda out, ex: _report(cfg, paths, validation, out))
    if stats.get("skipped_stage"):
        print("\n" + terminal_lines(read_json(paths.report.summary), read_json(paths.search.mixture),
                                    read_json(paths.cluster.summary)["clusters"]) + f"\n\nreport: {paths.report.page}\n")
    return stats


def _found_line(mix: dict) -> str:
    """What the search predicted for its pick and measured at its best; a pick no search proxy
    measured (search.reuse across other clusters, none of them new) has neither."""
    if mix.get("predicted") is None or not mix.get("best_seen"):
        return ("No search proxy was trained: the found mixture is the earlier run's, read over this run's clusters "
                "(search.reuse), and the comparison above is its only measurement.")
    return (f"Predicted objective of the found mixture: {mix['predicted']:.4f}; best proxy seen during the search:\n"
            f"{mix['best_seen']['objective']:.4f} ({mix['best_seen']['mixture_id']}).")


def _report(cfg: RunConfig, paths: RunPaths, validation: dict | None, out: Path) -> dict:
    csum = read_json(paths.cluster.summary)
    clusters = csum["clusters"]
    mix = read_json(paths.search.mixture)
    results = read_results(paths)
    plans = {}
    for f in paths.search.plans:
        for m in read_json(f)["mixtures"]:
            plans[m["mixture_id"]] = m["predicted"]
    qfile = paths.search.quality
    quality = read_json(qfile) if qfile.exists() else {}
    name = describe(cfg.target)
    summary = search_summary(cfg, paths, len(results), len(clusters))
    figs = plot_clusters(clusters, np.load(paths.cluster.cluster_centroids), out)
    figs += plot_search(results, plans, cfg.target.goal, name, out)
    figs.append(plot_weights(np.array(mix["weights"]), np.array(mix["natural"]), clusters, out))
    transfer = ""
    if validation is not None:
        summary["transfer"] = {k: validation[k] for k in ("model", "seeds", "target", "heldout", "rank")}
        fig = plot_transfer(validation, name, out)
        figs += [fig] if fig else []
        transfer = "## Does it transfer?\n\n" + transfer_section(validation) + "\n\n" + \
            ("![transfer](transfer.png)\n\n" if fig else "")
    from climb.stages.report.tradeoffs import section as tradeoff_section
    tradeoffs, tradeoff_figs, tradeoff_data = tradeoff_section(cfg, paths, results, out)
    figs += tradeoff_figs
    if tradeoff_data is not None:
        summary["tradeoffs"] = tradeoff_data
    write_json(paths.report.summary, summary)
    w, nat = np.array(mix["weights"]), np.array(mix["natural"])
    from climb.stages.search.sources import load_source_shares, main_sources
    shares = load_source_shares(cfg, paths)
    rows = "\n".join(f"| {c['cluster']} | {c['docs']} | {nat[i]:.3f} | {w[i]:.3f} | {', '.join(c['top_terms'][:6])} |"
                     + (f" {_cell(main_sources(shares, i))} |" if shares else "") for i, c in enumerate(clusters))
    page = f"""# climb report: {cfg.name}

Target: **{name}**, goal **{cfg.target.goal}**. {len(results)} search proxies over
{len(cfg.search.iterations)} iterations ({' -> '.join(map(str, cfg.search.iterations))}){_cheaper(cfg, results)}, predictor
`{mix['predictor'] or 'none'}`; {len(clusters)} clusters.

## Result

Each row is the mean of {cfg.search.eval_seeds} fresh proxies trained with seeds
{cfg.search.eval_seed}..{cfg.search.eval_seed + cfg.search.eval_seeds - 1}, which the search never used; every
mixture gets the same seeds, so each difference is paired by seed, with a 95% paired-t interval. A difference
whose interval spans zero is not resolved.

{summary_table(summary)}

**{summary["verdict"]["sentence"]}**

## How far to trust it

{quality_lines(quality)}

{_found_line(mix)}

![weights](weights.png)
{_by_source_section(summary)}
{transfer}## Search

![score by iteration](score_by_iteration.png)
{"![predicted vs measured](predicted_vs_measured.png)" if "predicted_vs_measured.png" in figs else ""}
{tradeoffs}
## Proxy compute

{compute_table(summary["compute"])}

## Clusters

| cluster | docs | natural | found | top terms |{" main sources |" if shares else ""}
| --- | --- | --- | --- | --- |{" --- |" if shares else ""}
{rows}

![sizes](cluster_sizes.png)
![map](cluster_map.png)
{_duplicates_section(paths)}{_contamination_section(paths, quality)}"""
    paths.report.page.write_text(page)
    paths.report.html.write_text(page_html(page, out, f"climb report: {cfg.name}"), encoding="utf-8")
    middle = quality_lines(quality) + (f"\n\nDoes it transfer?\n{transfer_section(validation)}"
                                       if validation is not None else "")
    print("\n" + terminal_lines(summary, mix, clusters, middle) + f"\n\nreport: {paths.report.page}\n")
    return {"figures": figs, "summary": summary}
