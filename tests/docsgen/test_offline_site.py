"""The site's charts draw offline: a page with mermaid fences, built with mkdocs.yml's theme, markdown and
mermaid hook, opened in headless Chromium that can reach no network, shows each chart as an SVG.

Material draws a chart into a closed shadow root, which `--dump-dom` leaves out, so the test reads the
page through the DevTools protocol (on a pipe: no port, no websocket), whose DOM tree includes it."""
import fcntl
import json
import os
import select
import shutil
import subprocess
import time

import pytest

from docsgen import mermaid

pytest.importorskip("material", reason="the docs extra is not installed (make docs installs it)")

from mkdocs.commands.build import build  # noqa: E402
from mkdocs.config import load_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = "/usr/bin/chromium"  # Debian's package; .ci/run installs it
PAGE = os.path.join(ROOT, "docs", "concepts", "modes.md")
with open(PAGE, encoding="utf-8") as fh:
    CHARTS = fh.read().count("```mermaid")

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no {CHROMIUM} (apt-get install chromium)"),
    pytest.mark.skipif(not os.path.isfile(mermaid.source()), reason=f"no {mermaid.source()}: make docs fetches it"),
]


def build_site(tmp_path, **overrides):
    """modes.md as the only page of a site built with mkdocs.yml, less the generated pages and the API
    reference (only the mermaid hook, only the search plugin): ~1 s instead of the whole site's ~5."""
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(PAGE, docs / "index.md")
    config = load_config(os.path.join(ROOT, "mkdocs.yml"), docs_dir=str(docs), site_dir=str(tmp_path / "site"),
                         nav=["index.md"], hooks=["docsgen/mermaid.py"], plugins=["search"], strict=False,
                         **overrides)  # not strict: the page's links lead to pages this site lacks
    build(config)
    return tmp_path / "site" / "index.html"


def above_4(fd):
    """fd moved above 4, so that the shell's `3<&a 4>&b` cannot overwrite one end with the other."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Browser:
    """Headless Chromium driven over --remote-debugging-pipe: JSON messages ended by NUL, which Chromium reads
    on its fd 3 and writes on its fd 4. Every http(s) request goes to a dead proxy: no network, as offline."""

    def __init__(self, profile):
        self.to_chrome_r, self.to_chrome_w = map(above_4, os.pipe())
        self.from_chrome_r, self.from_chrome_w = map(above_4, os.pipe())
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--proxy-server=http://127.0.0.1:9", f"--user-data-dir={profile}", "--remote-debugging-pipe"]
        # bash (dash takes no fd above 9) puts the pipe's ends on the fds 3 and 4 that Chromium reads and writes
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{self.to_chrome_r} 4>&{self.from_chrome_w}', CHROMIUM, *flags],
            pass_fds=(self.to_chrome_r, self.from_chrome_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(self.to_chrome_r)
        os.close(self.from_chrome_w)
        self.buffer, self.events, self.next_id = b"", [], 0

    def receive(self, deadline):
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.from_chrome_r], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.from_chrome_r, 1 << 20) if ready else b""
            if not chunk:
                raise TimeoutError("no answer from Chromium")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, session=None, timeout=20.0, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self.receive(deadline)
            if answer.get("id") == self.next_id:
                assert "error" not in answer, answer
                return answer["result"]
            self.events.append(answer)

    def wait_for(self, method, timeout=20.0):
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self.receive(deadline))

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except (OSError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_chrome_w)
        os.close(self.from_chrome_r)


def nodes(node):
    """A DOM tree from DOM.getDocument(pierce=True), depth first, shadow roots included."""
    yield node
    for child in node.get("shadowRoots", []) + node.get("children", []):
        yield from nodes(child)


def classes(node):
    attributes = node.get("attributes", [])
    return dict(zip(attributes[::2], attributes[1::2])).get("class", "").split()


def open_page(path, tmp_path, settle_s=10.0):
    """The page's DOM once its charts are drawn (or settle_s has passed), and the non-file URLs it asked for."""
    browser = Browser(tmp_path / "profile")
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        browser.send("Network.enable", session)
        browser.send("Page.enable", session)
        browser.send("Page.navigate", session, url=path.as_uri())
        browser.wait_for("Page.loadEventFired")
        deadline = time.monotonic() + settle_s
        while True:  # Material draws the charts after the load, one by one
            root = browser.send("DOM.getDocument", session, depth=-1, pierce=True)["root"]
            if len(svgs(root)) == CHARTS or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        requested = [e["params"]["request"]["url"] for e in browser.events
                     if e.get("method") == "Network.requestWillBeSent"]
        return root, [url for url in requested if not url.startswith(("file:", "data:", "blob:"))]
    finally:
        browser.close()


def svgs(root):
    """The <svg> of each drawn chart: Material replaces a fence's <pre class="mermaid"> with a
    <div class="mermaid"> whose shadow root holds the chart."""
    return [n for host in nodes(root) if is_element(host, "div") and "mermaid" in classes(host)
            for shadow in host.get("shadowRoots", []) for n in nodes(shadow) if is_element(n, "svg")]


def is_element(node, name):
    return node.get("nodeName", "").lower() == name


def texts(root):
    return " ".join(n.get("nodeValue", "") for n in nodes(root) if n.get("nodeType") == 3)


def test_the_charts_draw_with_no_network(tmp_path):
    page = build_site(tmp_path)
    root, web_requests = open_page(page, tmp_path)
    drawn = svgs(root)
    assert CHARTS >= 1 and len(drawn) == CHARTS  # one drawing per fence
    assert "rollout: envs + policy" in " ".join(texts(svg) for svg in drawn)  # a node of the page's first chart
    assert "flowchart LR" not in texts(root)  # no fence left as text
    assert web_requests == []  # mermaid came with the site, not from a CDN


def test_without_the_sites_mermaid_the_charts_stay_text(tmp_path):
    """The check above can fail: with no mermaid of its own the page asks a CDN, gets nothing, and shows
    the fences' text."""
    page = build_site(tmp_path, extra_javascript=[])
    root, web_requests = open_page(page, tmp_path, settle_s=2.0)
    assert svgs(root) == []
    assert "flowchart LR" in texts(root)
    assert any("mermaid" in url for url in web_requests)
