"""report/index.html: report.md as one self-contained page (climb.stages.report.page_html).

The run is the scripted one of tests/scripted_run.py, with one cluster's top terms
replaced by HTML (`<script>...`), as a corpus could give. The first test reads the
file; the second opens it in Debian's Chromium (headless, driven over the DevTools
protocol through a pipe, standard library only) on a phone-sized screen: no console
error, every image decoded and within the screen, and a screenshot kept in
$CLIMB_TEST_ARTIFACTS (pytest's tmp_path without it). Without Chromium it is skipped
(`apt-get install chromium`; .ci/run installs it).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import struct
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from scripted_run import prepare

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
FIGURE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """The report folder of a finished scripted run whose cluster 0 has HTML among its top terms."""
    import climb.stages.cluster as cluster
    from climb import pipeline
    real = cluster.top_terms

    def top_terms(*args):
        terms = real(*args)
        terms[0] = [SCRIPT, IMG, *terms[0]]
        return terms

    tmp = tmp_path_factory.mktemp("report_html")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cluster, "top_terms", top_terms)
        cfg, paths, _, _ = prepare(tmp, mp)
        pipeline.run_stage("report", cfg, paths.root)
    return paths.root / "report"


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.headings, self._in = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("h1", "h2", "h3"):
            self._in = [tag, ""]

    def handle_data(self, data):
        if self._in:
            self._in[1] += data

    def handle_endtag(self, tag):
        if self._in and tag == self._in[0]:
            self.headings.append(tuple(self._in))
            self._in = None


def test_index_html_is_report_md_self_contained(report_dir):
    page = (report_dir / "report.md").read_text()
    text = (report_dir / "index.html").read_text(encoding="utf-8")
    parsed = _Tags()
    parsed.feed(text)

    # Nothing outside the file: no URL, no link, no script, no style sheet or font to fetch.
    assert 'src="http' not in text and 'href="http' not in text and "://" not in text
    assert not {"script", "link", "iframe", "object", "embed", "base", "a"} & {t for t, _ in parsed.tags}
    assert all("href" not in a and not k.startswith("on") for _, a in parsed.tags for k in a)
    style = text[text.index("<style>"):text.index("</style>")]
    assert "url(" not in style and "@import" not in style
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text
    assert "max-width:100%" in style and "overflow-x:auto" in style

    # One inlined PNG per figure report.md shows, in its order, the bytes of the file.
    figures = FIGURE.findall(page)
    assert len(figures) >= 4 and all((report_dir / f).is_file() for f in figures)
    imgs = [a["src"] for t, a in parsed.tags if t == "img"]
    assert len(imgs) == len(figures) == text.count('<img alt="') == text.count('src="data:image/png;base64,')
    assert [base64.b64decode(s.split(",", 1)[1]) for s in imgs] == [(report_dir / f).read_bytes() for f in figures]

    # The same headings in the same order, and every table in a wrapper that scrolls.
    md_headings = [(f"h{len(m[1])}", m[2]) for m in re.finditer(r"^(#+) (.*)$", page, re.M)]
    # ... By source (the corpus files), Clusters, Duplicates, Contamination (the run has a target text, so
    # the search scanned for it)
    assert [t for t, _ in md_headings] == ["h1"] + ["h2"] * 8 and md_headings[-1][1] == "Contamination"
    assert "By source" in [h for _, h in md_headings]
    assert parsed.headings == md_headings
    n_tables = len(re.findall(r"^\| --- \|", page, re.M))
    assert n_tables == 5 and text.count("<table>") == n_tables == text.count('<div class="table">\n<table>')

    # The corpus's HTML is text: escaped, never a tag.
    assert SCRIPT in page and IMG in page  # report.md has the terms as they are
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&lt;img src=x onerror=alert(2)&gt;" in text
    assert "<script" not in text and "onerror=alert(2)>" not in text.replace("&lt;img src=x onerror=alert(2)&gt;", "")

    # The manifest fingerprints the page with the stage's other outputs.
    outputs = json.loads((report_dir / "manifest.json").read_text())["outputs"]
    assert outputs["index.html"][0] == (report_dir / "index.html").stat().st_size
    assert {"report.md", "summary.json", *figures} <= set(outputs)


# --------------------------------------------------------------------------- Chromium


def chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


class Chromium:
    """Headless Chromium driven over the DevTools protocol on fds 3 and 4 (--remote-debugging-pipe):
    JSON messages ended by a NUL byte. One page, with console and log messages collected."""

    def __init__(self, binary: str, profile: Path, width: int, height: int, timeout: float = 60):
        to_chrome, self._w = os.pipe()
        self._r, from_chrome = os.pipe()

        def fds():  # in the child: Chromium reads commands on fd 3 and writes replies on fd 4
            a, b = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome, from_chrome))
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--hide-scrollbars", "--mute-audio", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self.deadline = time.monotonic() + timeout
        self._buf, self._id, self.events, self.session = b"", 0, [], None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=True)

    def _message(self) -> dict:
        while b"\0" not in self._buf:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe (exit status {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._message()
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, method: str) -> dict:
        while True:
            m = self._message()
            self.events.append(m)
            if m.get("method") == method:
                return m

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        # A moment for messages sent around the load event to arrive.
        self.call("Runtime.evaluate", expression="new Promise(r => setTimeout(r, 200))", awaitPromise=True)

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors and uncaught exceptions of the page, and errors it logged (a failed load,
        a refused resource)."""
        out = []
        for m in self.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif m.get("method") == "Runtime.exceptionThrown":
                out.append("exception: " + p["exceptionDetails"].get("text", ""))
            elif m.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log ({p['entry']['source']}): {p['entry']['text']}")
        return out

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


CHECK = """(() => {
  const imgs = Array.from(document.images).map(i => ({
    src: i.getAttribute('src').slice(0, 30), complete: i.complete, natural: i.naturalWidth,
    width: i.getBoundingClientRect().width}));
  const tables = Array.from(document.querySelectorAll('table')).map(t => ({
    wrapper: t.parentElement.className, overflow: getComputedStyle(t.parentElement).overflowX,
    fits: t.parentElement.getBoundingClientRect().right <= window.innerWidth}));
  return {imgs, tables, scripts: document.scripts.length, innerWidth: window.innerWidth,
          scrollWidth: document.documentElement.scrollWidth, text: document.body.innerText};
})()"""

PHONE = (412, 915)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_index_html_in_chromium_on_a_phone_screen(report_dir, tmp_path):
    binary = chromium()
    if binary is None:
        pytest.skip("no Chromium (chromium, chromium-browser or google-chrome) on PATH; "
                    "`apt-get install chromium` to run this test")
    # The page alone in an empty folder: a figure it did not inline would not load from beside it.
    page = tmp_path / "page" / "index.html"
    page.parent.mkdir()
    shutil.copy(report_dir / "index.html", page)
    # The same page with one figure not inlined, to show that the checks below see a broken image.
    broken = tmp_path / "page" / "broken.html"
    broken.write_text(re.sub(r'src="data:image/png;base64,[^"]*"', 'src="weights.png"',
                             page.read_text(encoding="utf-8"), count=1), encoding="utf-8")
    artifacts = Path(os.environ.get("CLIMB_TEST_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report_index_phone.png"
    n_figures = len(FIGURE.findall((report_dir / "report.md").read_text()))

    browser = Chromium(binary, tmp_path / "profile", *PHONE)
    try:
        browser.open(page.as_uri())
        state = browser.evaluate(CHECK)
        errors = browser.errors()
        browser.screenshot(shot)
        browser.open(broken.as_uri())
        control, control_errors = browser.evaluate(CHECK), browser.errors()
    finally:
        browser.close()

    assert len(state["imgs"]) == n_figures
    for img in state["imgs"]:  # decoded, shown, and no wider than the screen
        assert img["complete"] and img["natural"] > 0 and 0 < img["width"] <= state["innerWidth"], img
    assert errors == []
    assert state["innerWidth"] == PHONE[0] and state["scrollWidth"] <= state["innerWidth"]  # no sideways page scroll
    assert state["tables"] and all(t == {"wrapper": "table", "overflow": "auto", "fits": True} for t in state["tables"])
    assert state["scripts"] == 0 and SCRIPT in state["text"] and IMG in state["text"]  # shown as text
    assert png_size(shot) == PHONE and shot.stat().st_size > 10_000
    # The checks see a figure that does not load: as an image of width 0 and as an error.
    assert [i["natural"] for i in control["imgs"]].count(0) == 1 and control_errors
