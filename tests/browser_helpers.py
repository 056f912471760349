"""The HTML report in headless Chromium, as a reader opens it: a probe script added to a copy of
report.html measures, once the page has drawn, where the title and the verdict sit in the first
viewport, then clicks the landing page's link to the Analysis page and records what opened."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

PROBE = r"""
<script>
setTimeout(function () {
  var out = {viewport: [window.innerWidth, window.innerHeight]};
  function box(el) { if (!el) return null; var r = el.getBoundingClientRect(); return [r.top, r.bottom]; }
  var all = Array.prototype.slice.call(document.querySelectorAll('h1, h2, strong'));
  out.title = box(all.find(function (e) { return e.textContent.indexOf('latentstrat:') === 0; }));
  out.verdict = box(all.find(function (e) { return e.textContent.indexOf('Verdict:') === 0; }));
  var a = Array.prototype.slice.call(document.querySelectorAll('a')).find(function (e) {
    return e.textContent === 'Analysis';
  });
  if (a) a.click();
  setTimeout(function () {
    var f = document.querySelector('iframe');
    out.after_click = f ? f.getAttribute('src').slice(0, 22) : null;
    var pre = document.createElement('pre'); pre.id = 'latentstrat-probe';
    pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
  }, 500);
}, 1500);
</script>
"""


def browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def probe_landing(report: Path, work: Path, size=(1400, 900)) -> dict:
    """{viewport, title, verdict ([top, bottom] in px, None when absent), after_click (the start
    of the src of the frame the Analysis link opened)} of report.html in headless Chromium."""
    text = report.read_text()
    end = text.rindex("</body>")  # the last one: the report's scripts carry the string too
    copy = work / "probed-report.html"
    copy.write_text(text[:end] + PROBE + text[end:])
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={size[0]},{size[1]}"]
    r = subprocess.run(
        [*cmd, "--virtual-time-budget=10000", "--dump-dom", f"file://{copy}"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    m = re.search(r'<pre id="latentstrat-probe">(.*?)</pre>', r.stdout)
    assert m, f"the probe did not report: {r.stderr[-2000:]}"
    return json.loads(m[1])
